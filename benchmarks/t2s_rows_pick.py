"""Which `t2s_rows_probe.py` variant the engine should try next: the fastest at the probe's largest row count,
summed over its lengths, if it beats the table's chain (the mean of `chain` and `chain again`) by more than
--margin. Prints its change as `t2s_batch_bench.py --mma-change` takes it (e.g. `kv_prefetch=2,pdl_attn=True`),
or nothing; the ranking goes to stderr. --kind free keeps the RESULT_FREE variants (bitwise the table's),
--kind changing the others (other numbers: the engine's margin rule against eager decides).

    python benchmarks/t2s_rows_pick.py results/t2s_rows_probe_ab_h200.json --kind free

A probe stopped by its time limit writes no JSON: --log then reads the rows it printed, after the log's last
line that starts with --after (gpu_session.sh's step header).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

from voicehub.runtime.kernels.t2s_layer_mma_config import RESULT_FREE


def fields(variant: str) -> list[str]:
    return variant.split()[1:]  # 'chain a=1 b=2' -> ['a=1', 'b=2']


def pick(results: list[dict], kind: str, margin: float) -> tuple[str, list[tuple[str, list[float]]]]:
    rows = max((r["rows"] for r in results), default=0)
    times = collections.defaultdict(list)
    for r in results:
        if r["rows"] == rows and "step_us" in r and r["variant"].startswith("chain"):
            times[r["variant"]].append(r["step_us"])
    ranking = sorted(times.items(), key=lambda kv: sum(kv[1]))
    tables = [sum(times[name]) for name in ("chain", "chain again") if name in times]
    if not tables:
        return "", ranking
    table, n_lengths = sum(tables) / len(tables), len(times["chain"] or times["chain again"])
    for name, us in ranking:
        change = fields(name)
        if not change or len(us) != n_lengths:
            continue
        free = {f.split("=", 1)[0] for f in change} <= RESULT_FREE
        if free == (kind == "free") and sum(us) < (1 - margin) * table:
            return ",".join(change), ranking
    return "", ranking


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("probe", type=Path, help="t2s_rows_probe.py's --out JSON")
    p.add_argument("--kind", choices=["free", "changing"], required=True)
    p.add_argument("--margin", type=float, default=0.01)
    p.add_argument("--log", type=Path, help="where the probe printed its rows, read without the JSON")
    p.add_argument("--after", default="== rows-ab-probe (")
    args = p.parse_args()
    if args.probe.exists():
        results = json.loads(args.probe.read_text())["results"]
    elif args.log and args.log.exists():
        lines = args.log.read_text().splitlines()
        start = max((i for i, line in enumerate(lines) if line.startswith(args.after)), default=-1)
        results = [json.loads(line) for line in lines[start + 1 :] if line.startswith('{"rows"')]
    else:
        print(f"{args.probe}: no probe results", file=sys.stderr)
        return
    change, ranking = pick(results, args.kind, args.margin)
    for name, us in ranking:
        print(f"{name:58s} {' '.join(f'{u:8.1f}' for u in us)}", file=sys.stderr)
    print(change)


if __name__ == "__main__":
    main()
