"""The many-row T2S stack's block-config search, run by `t2s_layer_bench.py --mma-grid`.

A coordinate search over MMA_GRID (or its --grid-fields) at the first --rows, from MMA_GRID_START (or
--grid-start), under a time budget: each config is checked against the definition (rel. L2; errors
recorded), then a ranking with the best first, the winner's per-kernel breakdown, its check at
--check-rows and the CONFIGS line that applies it.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from t2s_layer_measure import SIZES, bench_mma, random_inputs, reference
from t2s_layer_report import Report

# --mma-grid: a coordinate search over these values from the table's config (and from MMA_GRID_START, the
# single changes that won in the H200 sweep, benchmarks/results/t2s_layer_sweep_h200.json). Session 13's
# order: the launch-order fields first (no effect on results: PDL, PDL one kernel ahead, the ticketed
# FFN), then the splits and blocks as before; the fused FFN (ffn_slices > 0, slower in every earlier grid)
# last, then its chunk width (ffn_chunk has no effect while ffn_slices is 0: those configs time the same kernels)
MMA_GRID = {
    "ffn_tickets": (False, True),
    "pdl": (True, False),
    "pdl_late": (False, True),  # on needs pdl: a pair the config refuses is skipped
    "ffn2_splits": (1, 2, 4, 8),
    "qkv_splits": (1, 2, 4),
    "ffn1_splits": (1, 2, 4),
    "attn_tiles": (1, 2, 4, 8),
    "attn_warps": (2, 4),
    "attn_block": (128, 256),
    "block_k": (128, 256),
    "block_n": (32, 64),
    # rows per GEMM program and the GEMMs' warps (session 29: every earlier grid kept 16 rows and 4 warps); 64
    # rows leave one row group at 64 rows (groups are whole row blocks)
    "block_m": (16, 32, 64),
    "gemm_warps": (4, 8),
    "ffn_block": (64, 128),
    "gemm_stages": (2, 3),
    "out_splits": (1, 2, 4),  # unused with attn_out
    "prenorm": (False, True),
    "attn_out": (True, False),  # on needs prenorm: a pair the config refuses is skipped
    "ffn_slices": (0, 4, 8, 16, 32),
    "ffn_chunk": (16, 32, 64),
}
MMA_GRID_START = {"block_k": 256, "block_n": 64, "ffn_block": 128, "gemm_stages": 2, "attn_block": 256,
                  "attn_warps": 2, "pdl": False}  # fmt: skip


def mma_grid(mk, args, report: Report, base, dtype):
    """Coordinate search over MMA_GRID at the first --rows from MMA_GRID_START: each pass tries every
    other value of each field around the best config so far, until a pass finds nothing faster or the
    time budget ends. Then the winner's per-kernel breakdown and its check at --check-rows."""
    t_start, on_gpu = time.perf_counter(), args.device == "cuda"
    rows = int(args.rows.split(",")[0])
    inputs = random_inputs(args.size, rows, args.length, args.max_slots, dtype, args.device)
    want = reference(inputs, args.n_slots)
    timed: dict = {}  # config -> row

    def run(cfg, **changes) -> None:
        try:
            cfg = dataclasses.replace(cfg, **changes)
        except (
            ValueError
        ):  # a combination the config refuses (attn_out without prenorm, pdl_late without pdl)
            return
        if cfg in timed or time.perf_counter() - t_start > args.grid_budget_s:
            return
        t0 = time.perf_counter()
        row = bench_mma(mk, inputs, want, args.n_slots, cfg, on_gpu, args.replays, False, args.batch_ms)
        timed[cfg] = {"rows": rows, "path": "mma_grid", **row, "wall_s": round(time.perf_counter() - t0, 2)}
        report.add(timed[cfg])

    def best():
        ok = [c for c, r in timed.items() if "step_us" in r and r["rel_l2"] <= args.max_rel_l2]
        return min(ok, key=lambda c: timed[c]["step_us"]) if ok else None

    grid = args.grid_fields
    start = args.grid_start or MMA_GRID_START
    run(base)
    run(base, **start)
    winner, improved = best(), True
    while winner is not None and improved:
        improved = False
        for field, values in grid.items():
            for value in values:
                run(winner, **{field: value})
            if best() != winner:
                winner, improved = best(), True
    report.extra["grid"] = {"values": {k: list(v) for k, v in grid.items()}, "start": start,
                            "budget_s": args.grid_budget_s, "search_s": round(time.perf_counter() - t_start, 1),
                            "n_timed": len(timed)}  # fmt: skip
    if winner is None:
        print("no grid config ran within the rel. L2 bound", flush=True)
        return None
    print_ranking(timed, base, args.max_rel_l2)
    report.extra["winner"] = dataclasses.asdict(winner)
    report.extra["configs_line"] = configs_line(mk, winner, SIZES[args.size])
    report.add({"rows": rows, "path": "mma_winner",
                **bench_mma(mk, inputs, want, args.n_slots, winner, on_gpu, args.replays, True, args.batch_ms)})  # fmt: skip
    report.save()
    print(f"winner at {rows} rows ({timed[winner]['step_us']:.1f} us, table entry "
          f"{timed[base].get('step_us', float('nan')):.1f} us; {len(timed)} configs in "
          f"{report.extra['grid']['search_s']} s):\n  {report.extra['configs_line']}", flush=True)  # fmt: skip
    return winner


def search_space(fields: str) -> dict:
    """MMA_GRID, or only its comma-separated `fields` (a search around a coupled subset, e.g. the GEMMs'): the
    --grid-fields parser, so an unknown field fails before any model is built."""
    names = [f for f in fields.split(",") if f]
    unknown = [f for f in names if f not in MMA_GRID]
    if unknown:
        raise argparse.ArgumentTypeError(f"{unknown} not in MMA_GRID ({', '.join(MMA_GRID)})")
    return {f: MMA_GRID[f] for f in names} if names else MMA_GRID


def check_winner(mk, args, report: Report, winner, dtype) -> None:
    """The table (as the engine takes it at those rows and --n-slots) and the grid's winner at each of
    --check-rows."""
    _, dim, n_head, ffn_dim, vocab = SIZES[args.size]
    for n in [int(r) for r in args.check_rows.split(",") if r]:
        inputs = random_inputs(args.size, n, args.length, args.max_slots, dtype, args.device)
        want = reference(inputs, args.n_slots)
        table = mk.config_for(dim, ffn_dim, n_head, vocab, n, args.n_slots)
        for path, cfg in (("mma", table), ("mma_check", winner)):
            row = bench_mma(mk, inputs, want, args.n_slots, cfg, args.device == "cuda", args.replays, False,
                            args.batch_ms)  # fmt: skip
            report.add({"rows": n, "path": path, **row})
        del inputs, want
        report.save()


def print_ranking(timed: dict, base, max_rel_l2: float, top: int = 10) -> None:
    """The grid's fastest configs, the best first, with what each changes from the table's entry."""
    ok = sorted(((r["step_us"], c) for c, r in timed.items() if "step_us" in r and r["rel_l2"] <= max_rel_l2),
                key=lambda t: t[0])  # fmt: skip
    print(
        f"grid ranking ({len(ok)} ran within rel. L2 {max_rel_l2:g}, {len(timed) - len(ok)} failed or beyond):"
    )
    for rank, (us, cfg) in enumerate(ok[:top], 1):
        rows = timed[cfg]["rows"]
        changed = ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(cfg).items() if getattr(base, k) != v)
        print(
            f"  {rank:2} {us:8.1f} us {rows * 1e6 / us:8.0f} tok/s  {changed or '(table entry)'}", flush=True
        )


def configs_line(mk, cfg, size: tuple) -> str:
    """The CONFIGS entry of t2s_layer_mma_config.py that applies cfg (fields left at their defaults omitted)."""
    changed = ", ".join(
        f"{k}={v!r}" for k, v in dataclasses.asdict(cfg).items() if getattr(mk.MmaConfig(), k) != v
    )
    n_layer, dim, n_head, ffn_dim, vocab = size
    return f"CONFIGS = {{({dim}, {ffn_dim}, {n_head}, {vocab}): MmaConfig({changed})}}"
