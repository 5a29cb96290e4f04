"""Where the many-row T2S stack's step time goes at 64 rows, and whether row groups on parallel streams help.

The many-row stack (`t2s_layer_mma_triton`) takes ~0.97 ms a step at one row and ~1.34 ms at 64
(`t2s_batch_triton_h200.json`, replay only): most of a 64-row step is the chain of ~120 small
kernels, not bytes. This probe times, in CUDA graphs at 64 rows and KV lengths 480 / 730:
- `chain`: one call over all rows (what the engine runs), PDL off (the table's) and on, and with
  `attn_out` toggled (the out-projection and LN1 inside the attention kernel, or its own kernel);
- `groups=G`: the rows in G groups of 64/G, each group's whole stack on its own CUDA stream (forked
  and joined inside one graph), so one group's kernels fill the gaps of another's; its logits are
  compared bit for bit with `chain`'s (the kernels are batch-invariant: they must be equal); the groups
  run in step (each one's attention beside the others'); `chain row_groups=G` instead has the
  attentions take turns (`step_groups`);
- `chain` at 16 and 32 rows, for the floor a group pays alone;
- `chain kv_evict_first=...`: the attention's K/V loads with L2 policy evict_first toggled;
- `chain attn_stages=...`: the attention's tile loop pipelined (ATTN_STAGES); `chain again`:
  the baseline once more, for the machine's drift (`--variants` picks the chain variants, and runs any
  other `chain field=value ...` asked for: the table's entry with those MmaConfig fields changed,
  e.g. 'chain row_groups=2').
With --timeline it instead replays each named chain variant's graph under the profiler and records
every kernel (stream, start, duration) and how much of the step has kernels side by side
(`kernel_timeline.py`: the attention's time beside other kernels is what row groups buy).
With --ncu it instead runs one eager step at 1 and 64 rows between cudaProfilerStart/Stop, for
`ncu --profile-from-start off` to time every kernel alone (the sum against the graph's step time
is the share of launch gaps and tails).

    python benchmarks/t2s_rows_probe.py --out results/t2s_rows_probe_h200.json
    ncu --clock-control none --profile-from-start off --csv --metrics gpu__time_duration.sum \
        python benchmarks/t2s_rows_probe.py --ncu > ncu.csv
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from pathlib import Path

import torch
from bench_meta import capture
from kernel_timeline import REPLAYS as TIMELINE_REPLAYS
from kernel_timeline import WARMUP as TIMELINE_WARMUP
from kernel_timeline import graph_timeline, summary
from t2s_batch_bench import KV_BUCKETS
from t2s_layer_measure import SIZES, parse_change, random_inputs, time_us
from t2s_layer_report import meta as layer_meta

from voicehub.runtime.kernels import t2s_layer_mma_triton as mk
from voicehub.runtime.kv_cache import pick_bucket

ATTN_STAGES = [
    {"attn_stages": 2},
    {"attn_stages": 3},
    {"attn_stages": 2, "attn_warps": 4},
    {"attn_stages": 3, "attn_block": 64, "attn_tiles": 16},
    {"attn_stages": 4, "attn_block": 64, "attn_tiles": 16},
]


def grouped(inputs, n_slots: int, cfg, n_groups: int):
    """A callable stepping every row in n_groups row groups, group g on stream g (0: the caller's), each
    group's whole stack at once (no order between them); n_groups 1 with cfg.row_groups > 1: the stack's
    own groups (`step_groups`: their attentions take turns)."""
    x, w, k, v, lengths = inputs
    n_rows = x.shape[0]
    spans = mk.row_spans(n_rows, cfg)
    if n_groups == 1 and len(spans) > 1:  # cfg.row_groups: the stack's own groups, attentions taking turns
        phased = [mk.Scratch.allocate(hi - lo, w, k.shape[3], cfg) for lo, hi in spans]
        out = torch.empty(n_rows, w.head_weight.shape[0], device=x.device, dtype=x.dtype)

        def step_phased() -> torch.Tensor:
            mk.step_groups(phased, spans, x, w, k, v, lengths, n_slots, cfg, out)
            return out

        return step_phased
    size = n_rows // n_groups
    spans = [(g * size, (g + 1) * size) for g in range(n_groups)]
    scratch = [mk.Scratch.allocate(size, w, k.shape[3], cfg) for _ in spans]
    logits = torch.empty(n_rows, w.head_weight.shape[0], device=x.device, dtype=x.dtype)
    side = [torch.cuda.Stream() for _ in spans[1:]] if x.is_cuda else []

    def step() -> torch.Tensor:
        main = torch.cuda.current_stream() if x.is_cuda else None
        for stream in side:
            stream.wait_stream(main)  # (on the CPU: no streams, the groups run one after another)
        for g, (lo, hi) in enumerate(spans):
            ctx = torch.cuda.stream(side[g - 1]) if g and side else contextlib.nullcontext()
            with ctx:
                mk.step_rows(scratch[g], x[lo:hi], w, k[:, lo:hi], v[:, lo:hi], lengths[lo:hi], n_slots, cfg,
                             logits[lo:hi])  # fmt: skip
        for stream in side:
            main.wait_stream(stream)
        return logits

    return step


def bucket(length: int, max_slots: int) -> int:
    """The engine's KV bucket (slots) for a step at this cache length (it writes slot `length`)."""
    return min(pick_bucket(length + 1, KV_BUCKETS), max_slots)


def chain_config(name: str, base):
    """'chain' -> the table's entry; 'chain field=value ...' -> the entry with those fields changed."""
    change = name.split(" ", 1)[1].replace(" ", ",") if " " in name else ""
    return dataclasses.replace(base, **parse_change(change))


def timelines(args) -> dict:
    """Each chain variant's graph step (one call over all rows, its own row groups) replayed under the
    profiler at each length: every kernel's stream, start and duration, and their overlap (`kernel_timeline`)."""
    dtype = getattr(torch, args.dtype)
    n_layer, dim, n_head, ffn_dim, vocab = SIZES[args.size]
    rows_out, configs = [], {}
    for length in (int(n) for n in args.lengths.split(",")):
        n_slots = bucket(length, args.max_slots)
        # the table as the engine takes it for this step (its bucket changes included)
        base = configs[length] = mk.config_for(dim, ffn_dim, n_head, vocab, args.rows, n_slots)
        inputs = random_inputs(args.size, args.rows, length, args.max_slots, dtype, args.device)
        for name in args.timeline:
            cfg = chain_config(name, base)
            replays = graph_timeline(capture(grouped(inputs, n_slots, cfg, 1)))
            summaries = [summary(events) for events in replays]
            mid = sorted(range(len(summaries)), key=lambda i: summaries[i]["wall_us"])[len(summaries) // 2]
            row = {"rows": args.rows, "length": length, "n_slots": n_slots, "variant": name,
                   "groups": len(mk.row_spans(args.rows, cfg)), "replays": summaries,
                   "median_replay_kernels": replays[mid]}  # fmt: skip
            brief = {k: round(v, 1) for k, v in summaries[mid].items() if k.endswith("_us")}
            brief["largest_gap"] = summaries[mid]["largest_gap"]
            print(json.dumps({"rows": args.rows, "length": length, "variant": name, **brief}), flush=True)
            rows_out.append(row)
        del inputs
        torch.cuda.empty_cache()
    return {"results": rows_out, "config_by_length": {n: dataclasses.asdict(c) for n, c in configs.items()}}


def probe(args) -> dict:
    dtype = getattr(torch, args.dtype)
    n_layer, dim, n_head, ffn_dim, vocab = SIZES[args.size]
    rows_out, configs = [], {}
    for length in (int(n) for n in args.lengths.split(",")):
        n_slots = bucket(length, args.max_slots)
        # the table as the engine takes it for this step (its bucket changes included)
        base = configs[length] = mk.config_for(dim, ffn_dim, n_head, vocab, args.rows, n_slots)
        pdl = dataclasses.replace(base, pdl=not base.pdl)
        late = dataclasses.replace(base, pdl=True, pdl_late=True)  # the next kernel launched after the wait
        # the out-projection in the attention kernel toggled (turning it on turns prenorm on, which it needs)
        out = dataclasses.replace(base, attn_out=not base.attn_out, prenorm=base.prenorm or not base.attn_out)
        # ffn1 + ffn2 as one kernel or two; K/V's L2 policy (the same values)
        tickets = dataclasses.replace(base, ffn_tickets=not base.ffn_tickets)
        evict = dataclasses.replace(base, kv_evict_first=not base.kv_evict_first)
        inputs = random_inputs(args.size, args.rows, length, args.max_slots, dtype, args.device)
        k0, v0 = inputs[2].clone(), inputs[3].clone()  # every variant writes the same k, v at `length`
        want = grouped(inputs, n_slots, base, 1)().clone()
        groups = [int(n) for n in args.groups.split(",") if n]
        variants = [
            ("chain", base, 1),
            (f"chain attn_out={out.attn_out}", out, 1),
            (f"chain pdl={pdl.pdl}", pdl, 1),
            ("chain pdl=True pdl_late=True", late, 1),
            (f"chain ffn_tickets={tickets.ffn_tickets}", tickets, 1),
            (f"chain kv_evict_first={evict.kv_evict_first}", evict, 1),
        ] + [
            # the attention's tile loop pipelined by Triton (cp.async, stages - 1 tiles ahead), at the table's
            # tiles (the same values) and at smaller tiles or more warps (other values: a table change)
            (
                " ".join(["chain"] + [f"{k}={v}" for k, v in change.items()]),
                dataclasses.replace(base, **change),
                1,
            )
            for change in ATTN_STAGES
        ]
        known = {v[0] for v in variants} | {"chain again"}
        variants = [v for v in variants if args.variants is None or v[0] in args.variants]
        # any other 'chain field=value ...' asked for: the table's entry with those fields changed
        variants += [(name, chain_config(name, base), 1)
                     for name in args.variants or () if name not in known and name.startswith("chain ")]  # fmt: skip
        variants.append(("chain again", base, 1))  # the baseline once more: the machine's drift over the rows
        variants += [(f"groups={g}", base, g) for g in groups] + [
            (f"groups={g} pdl={pdl.pdl}", pdl, g) for g in groups
        ]
        for name, cfg, n_groups in variants:
            inputs[2].copy_(k0)
            inputs[3].copy_(v0)
            fn = grouped(inputs, n_slots, cfg, n_groups)
            try:
                got = fn().clone()
            except Exception as exc:  # a variant that does not build is a row, not the end of the probe
                row = {
                    "rows": args.rows,
                    "length": length,
                    "variant": name,
                    "error": f"{type(exc).__name__}: {exc}"[:2000],
                }
                print(json.dumps(row), flush=True)
                rows_out.append(row)
                continue
            row = {"rows": args.rows, "length": length, "n_slots": n_slots, "variant": name, "groups": n_groups,
                   "pdl": cfg.pdl, "attn_out": cfg.attn_out, "ffn_tickets": cfg.ffn_tickets,
                   "kv_evict_first": cfg.kv_evict_first, "attn_stages": cfg.attn_stages, "row_groups": cfg.row_groups,
                   "group_rows": cfg.group_rows,
                   "equal_to_chain": bool(torch.equal(got, want)),
                   "rel_diff_to_chain": float((got.float() - want.float()).norm() / want.float().norm())}  # fmt: skip
            row["step_us"] = time_us(fn, args.device == "cuda", args.replays)
            print(json.dumps(row), flush=True)
            rows_out.append(row)
        for rows in (r for r in (16, 32) if r < args.rows):  # a group's floor alone
            sub = (inputs[0][:rows], inputs[1], inputs[2][:, :rows], inputs[3][:, :rows], inputs[4][:rows])
            own = mk.config_for(dim, ffn_dim, n_head, vocab, rows, n_slots)
            row = {"rows": rows, "length": length, "n_slots": n_slots, "variant": "chain", "groups": 1,
                   "pdl": own.pdl, "step_us": time_us(grouped(sub, n_slots, own, 1), args.device == "cuda",
                                                      args.replays)}  # fmt: skip
            print(json.dumps(row), flush=True)
            rows_out.append(row)
        del inputs, k0, v0
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return {"results": rows_out, "config_by_length": {n: dataclasses.asdict(c) for n, c in configs.items()}}


def ncu_steps(args) -> None:
    """One eager step at 1 and at 64 rows inside cudaProfilerStart/Stop (compiled and warmed up before)."""
    dtype = getattr(torch, args.dtype)
    n_layer, dim, n_head, ffn_dim, vocab = SIZES[args.size]
    for rows in (1, args.rows):
        inputs = random_inputs(args.size, rows, 730, args.max_slots, dtype, args.device)
        fn = grouped(inputs, 768, mk.config_for(dim, ffn_dim, n_head, vocab, rows, 768), 1)
        fn()
        fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        print(f"# ncu step rows={rows}", file=sys.stderr, flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size", default="full", choices=list(SIZES))
    p.add_argument("--dtype", default="float16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--lengths", default="480,730")
    p.add_argument("--groups", default="", help="row groups on parallel streams, e.g. 2,4 (none by default)")
    p.add_argument("--max-slots", type=int, default=1024)
    p.add_argument("--replays", type=int, default=100)
    p.add_argument("--ncu", action="store_true")
    p.add_argument(
        "--variants",
        type=lambda t: t.split(";"),
        default=None,
        help="';'-separated chain variants to run (default: all), e.g. 'chain;chain kv_evict_first=False'",
    )
    p.add_argument(
        "--timeline",
        type=lambda t: t.split(";"),
        default=None,
        help="';'-separated chain variants to trace kernel by kernel instead of timing, e.g. 'chain;chain row_groups=1'",
    )
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    if args.ncu:
        ncu_steps(args)
        return
    report = timelines(args) if args.timeline else probe(args)
    args.length, args.n_slots = args.lengths, "bucket above each length"
    report["meta"] = {**layer_meta(args), "benchmark": "t2s_rows_probe"}
    if args.timeline:
        report["meta"]["timing"] = (
            f"{TIMELINE_REPLAYS} graph replays under torch.profiler (CUPTI kernel records) after {TIMELINE_WARMUP} warm ones"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    with torch.inference_mode():
        main()
