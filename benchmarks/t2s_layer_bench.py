"""One T2S decode step's layer stack per block-size config: the fused Triton op in CUDA graphs.

For each config (the shape's table entry, then one field changed at a time) it checks the fused
stack (`t2s_layer_stack`, every layer and the head) against the torch definition (rel. L2), then
times a CUDA graph of one call: microseconds per step and the tokens/s that bounds a decode at
(the rest of the step, embedding and sampling, not included). The breakdown times graphs of the
first kernels of every layer (qkv; qkv + attention; qkv + attention + ffn; the whole op) so the
differences give each kernel's share. The torch definition in a graph is the baseline. At the
table's config it also times the step's input embedding: `torch_embed+fused` (embed_audio_at's
torch ops, then the x-taking stack: the step before the fusion) against `fused_embed` (the op
t2s_embed_layer_stack, whose first kernel gathers the embedding), both checked against the definition.
At every batch size it also times the many-row stack (`t2s_layer_stack_rows`, `t2s_layer_mma_triton`:
path `mma`, with a per-kernel breakdown), and at the largest one sweeps its block config (`mma_sweep`).
Random full-size weights (drawn on the device), one KV length per row, the bucket above it. Prints each
row as it is measured; writes JSON to --out after each batch size (--append adds to it: a split run).
--mma-grid times only the many-row stack (`t2s_mma_grid.py`): a coordinate search over MMA_GRID from
MMA_GRID_START under a time budget, each config checked against the definition (errors recorded), a
ranking with the best first, the winner's breakdown and its check at --check-rows, and the CONFIGS line
that applies it.

    python benchmarks/t2s_layer_bench.py --out results/t2s_layer_h200.json
    python benchmarks/t2s_layer_bench.py --rows 1,4,16,64,128 --no-sweep  # paths only, no config sweeps
    python benchmarks/t2s_layer_bench.py --mma-grid --rows 64 --check-rows 16,128 --grid-budget-s 150 \
        --out results/t2s_layer_mmagrid_h200.json
    python benchmarks/t2s_layer_bench.py --size tiny --device cpu --rows 1,3 --length 40 --n-slots 64 \
        --max-slots 96  # smoke test (interpreted, no graphs)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

import torch
from t2s_layer_measure import (
    SIZES,
    bench_config,
    bench_embed,
    bench_mma,
    parse_change,
    random_embed,
    random_inputs,
    reference,
    time_us,
)
from t2s_layer_report import Report
from t2s_mma_grid import check_winner, mma_grid, search_space

from voicehub.runtime.kernels import t2s_layer as ref

SWEEP = (  # one field at a time around the table's entry
    {"qkv_block": 8},
    {"qkv_block": 32},
    {"attn_block": 32},
    {"attn_block": 128},
    {"attn_block": 256},
    {"ffn_block": 8},
    {"ffn_block": 32},
    {"head_block": 4},
    {"head_block": 16},
    {"qkv_warps": 2},
    {"qkv_warps": 8},
    {"attn_warps": 2},
    {"attn_warps": 8},
    {"ffn_warps": 8},
)
MMA_SWEEP = (  # the many-row stack's config, one field at a time around the table's entry
    {"block_m": 32},
    {"block_n": 16},
    {"block_n": 64},
    {"block_k": 64},
    {"block_k": 256},
    {"block_k": 512},
    {"block_k": 512, "gemm_warps": 8},
    {"gemm_stages": 2},
    {"gemm_stages": 4},
    {"ffn_block": 32},
    {"ffn_block": 128},
    {"attn_block": 32},
    {"attn_block": 128},
    {"attn_block": 256},
    {"gemm_warps": 2},
    {"gemm_warps": 8},
    {"attn_warps": 2},
    {"attn_warps": 8},
    {"attn_tiles": 4},
    {"attn_tiles": 16},
    {"pdl": False},
    {"prenorm": True},
)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--size", default="full", choices=list(SIZES))
    p.add_argument("--dtype", default="float16")
    p.add_argument("--device", default="cuda", help="cuda; cpu only smoke-tests the script (interpreted)")
    p.add_argument("--rows", default="1,4,16,64,128",
                   help="batch sizes; the GEMV stack's sweep runs at the first, the many-row stack's at the last")  # fmt: skip
    p.add_argument("--length", type=int, default=730, help="cached slots per row (230 prompt + 500 tokens)")
    p.add_argument("--n-slots", type=int, default=768, help="the KV bucket")
    p.add_argument("--max-slots", type=int, default=1024, help="cache size")
    p.add_argument("--replays", type=int, default=100, help="most CUDA-graph replays per timed batch")
    p.add_argument(
        "--batch-ms", type=float, default=25.0, help="fewer replays where a batch would take longer"
    )
    p.add_argument("--no-sweep", action="store_true")
    p.add_argument("--mma-grid", action="store_true",
                   help="only the many-row stack: a coordinate search over MMA_GRID at the first --rows, "
                        "its winner checked against the table's entry at --check-rows")  # fmt: skip
    p.add_argument("--check-rows", default="16,128")
    p.add_argument("--grid-fields", type=search_space, default="",
                   help="search only these MMA_GRID fields, e.g. block_m,gemm_warps,block_n (default: all)")  # fmt: skip
    p.add_argument("--grid-start", type=parse_change, default={},
                   help="start the search here instead of MMA_GRID_START, e.g. block_m=32,gemm_warps=8")  # fmt: skip
    p.add_argument("--grid-budget-s", type=float, default=150.0,
                   help="no new grid config after this many seconds from the start (compiles included)")  # fmt: skip
    p.add_argument(
        "--max-rel-l2", type=float, default=1e-2, help="a config further from the definition loses"
    )
    p.add_argument("--append", action="store_true", help="add to --out's results (a split run)")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    if args.device != "cuda":  # read when triton is first imported
        os.environ.setdefault("TRITON_INTERPRET", "1")
        args.replays = 1
    return args


def main() -> None:
    args = parse_args()
    on_gpu = args.device == "cuda"
    from voicehub.runtime.kernels import t2s_layer_mma_triton as mk
    from voicehub.runtime.kernels import t2s_layer_triton as tk

    dtype = getattr(torch, args.dtype)
    n_layer, dim, n_head, ffn_dim, vocab = SIZES[args.size]
    base = tk.config_for(dim, ffn_dim, n_head, vocab)
    n_rows = [int(n) for n in args.rows.split(",")]
    # the many-row table as the engine takes it for a step of these rows and bucket (its bucket changes)
    mma_base = mk.config_for(dim, ffn_dim, n_head, vocab, n_rows[0], args.n_slots)
    report = Report(args, base, mma_base, n_layer)
    if args.mma_grid:
        winner = mma_grid(mk, args, report, mma_base, dtype)
        report.save()
        if winner is not None:
            check_winner(mk, args, report, winner, dtype)
        return
    for i, rows in enumerate(n_rows):
        inputs = random_inputs(args.size, rows, args.length, args.max_slots, dtype, args.device)
        configs = [base] + ([] if i or args.no_sweep else [dataclasses.replace(base, **c) for c in SWEEP])
        torch_us = time_us(lambda inputs=inputs: ref.decode_stack_reference(*inputs, args.n_slots), on_gpu,
                           args.replays, args.batch_ms)  # fmt: skip
        report.add({"rows": rows, "path": "torch_definition", "step_us": torch_us})
        embed_inputs = random_embed(args.size, rows, args.length, dtype, args.device)
        for row in bench_embed(tk, inputs, embed_inputs, args.n_slots, base, on_gpu, args.replays):
            report.add({"rows": rows, **row})
        for j, cfg in enumerate(configs):
            row = bench_config(tk, inputs, args.n_slots, cfg, on_gpu, args.replays, breakdown=j == 0)
            report.add({"rows": rows, "path": "fused" if j == 0 else "fused_sweep", **row})
        want = reference(inputs, args.n_slots)
        is_last = i == len(n_rows) - 1 and not args.no_sweep
        table = mk.config_for(dim, ffn_dim, n_head, vocab, rows, args.n_slots)
        mma_configs = [table] + ([dataclasses.replace(table, **c) for c in MMA_SWEEP] if is_last else [])
        for j, cfg in enumerate(mma_configs):
            row = bench_mma(mk, inputs, want, args.n_slots, cfg, on_gpu, args.replays, breakdown=j == 0)
            report.add({"rows": rows, "path": "mma" if j == 0 else "mma_sweep", **row})
        del want, inputs
        report.save()


if __name__ == "__main__":
    with torch.inference_mode():
        main()
