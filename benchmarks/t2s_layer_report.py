"""The T2S layer-stack bench's output: rows printed as they are measured (per-kernel shares where a
breakdown was timed) and the JSON written to --out with the run's metadata. Shared with
`t2s_mma_grid.py` (its ranking rows) and `t2s_rows_probe.py` (`meta`).
"""

from __future__ import annotations

import json
import platform
import sys

import torch
from bench_meta import tree_commit


class Report:
    """Results printed as they come and written to --out after each batch size (a run stopped by its
    time limit keeps what it measured)."""

    def __init__(self, args, base, mma_base, n_layer: int):
        self.args, self.base, self.mma_base, self.n_layer = args, base, mma_base, n_layer
        self.results, self.extra = [], {}
        if args.append and args.out and args.out.exists():
            self.results = json.loads(args.out.read_text())["results"]
        print(
            f"{'rows':>4} {'path':17} {'changed':22} {'us/step':>8} {'tok/s bound':>11} {'rel_l2':>8}",
            flush=True,
        )

    def add(self, row: dict) -> None:
        self.results.append(row)
        print_row(row, self.mma_base if row["path"].startswith("mma") else self.base, self.n_layer)

    def save(self) -> None:
        if self.args.out:
            self.args.out.parent.mkdir(parents=True, exist_ok=True)
            data = {"results": self.results, **self.extra, "meta": meta(self.args)}
            self.args.out.write_text(json.dumps(data, indent=1))


def print_row(r: dict, b, n_layer: int) -> None:
    changed = ", ".join(f"{k}={v}" for k, v in r.get("config", {}).items() if getattr(b, k) != v)
    if "error" in r:
        print(f"{r['rows']:4} {r['path']:17} {changed:22} ERROR {r['error'][:80]}", flush=True)
        return
    tok_s = r["rows"] * 1e6 / r["step_us"]
    rel = f"{r['rel_l2']:8.1e}" if "rel_l2" in r else ""
    print(f"{r['rows']:4} {r['path']:17} {changed:22} {r['step_us']:8.1f} {tok_s:11.0f} {rel:>8}", flush=True)
    if "prefix_us" in r and r["path"].startswith("mma"):
        names = list(r["prefix_us"])
        us = [r["prefix_us"][n] for n in names]
        parts = [(n.lstrip("+"), b - a) for n, a, b in zip(names[1:5], us, us[1:5])]
        per_layer = ", ".join(f"{n} {t / n_layer:.2f}" for n, t in [("qkv", us[0]), *parts])
        print(f"{'':4} {'':17} per layer (us): {per_layer}; head {us[5] - us[4]:.2f}", flush=True)
    elif "prefix_us" in r:
        pre = r["prefix_us"]
        parts = [("qkv", pre["qkv"]), ("attention", pre["+attention"] - pre["qkv"]),
                 ("ffn", pre["+ffn"] - pre["+attention"])]  # fmt: skip
        per_layer = ", ".join(f"{name} {us / n_layer:.2f}" for name, us in parts)
        print(
            f"{'':4} {'':17} per layer (us): {per_layer}; head {pre['+head'] - pre['+ffn']:.2f}", flush=True
        )


def meta(args) -> dict:
    rev = tree_commit()
    import triton

    return {
        "benchmark": "t2s_layer",
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "platform": platform.platform(),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "voicehub_commit": rev or None,
        },  # fmt: skip
        "size": args.size,
        "dtype": args.dtype,
        "length": args.length,
        "n_slots": args.n_slots,
        "max_slots": args.max_slots,
        "timing": "median over 5 batches of CUDA-graph replays of one call (GPU time per step)",
        "command": " ".join(["python", *sys.argv]),
    }
