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
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from bench_meta import capture, tree_commit

from voicehub.runtime.kernels import t2s_layer as ref
from voicehub.runtime.kernels.t2s_layer_mma_config import MmaConfig

SIZES = {  # n_layer, dim, n_head, ffn_dim, vocab
    "full": (24, 512, 16, 2048, 1025),
    "tiny": (2, 64, 4, 256, 1025),
}
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


def parse_change(text: str) -> dict:
    """'attn_stages=2,kv_evict_first=false' -> {"attn_stages": 2, "kv_evict_first": False}: MmaConfig fields."""
    fields = {f.name: f.type for f in dataclasses.fields(MmaConfig)}
    out = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        if name not in fields:
            raise argparse.ArgumentTypeError(f"MmaConfig has no field {name!r}")
        out[name] = value.lower() == "true" if fields[name] in (bool, "bool") else int(value)
    return out


def random_inputs(size: str, n_rows: int, length: int, max_slots: int, dtype: torch.dtype, device: str):
    n_layer, dim, n_head, ffn_dim, vocab = SIZES[size]
    # drawn on the device: the CPU's randn of a 128-row cache (3.2G values) alone takes a minute
    g = torch.Generator(device=device).manual_seed(0)

    def r(*shape, scale=1.0, mean=0.0):
        return (mean + scale * torch.randn(*shape, generator=g, device=device)).to(dtype)

    layers = tuple(
        ref.LayerWeights(
            r(3 * dim, dim, scale=dim**-0.5), r(3 * dim, scale=0.02), r(dim, dim, scale=dim**-0.5),
            r(dim, scale=0.02), r(dim, scale=0.1, mean=1.0), r(dim, scale=0.1), r(ffn_dim, dim, scale=dim**-0.5),
            r(ffn_dim, scale=0.02), r(dim, ffn_dim, scale=ffn_dim**-0.5), r(dim, scale=0.02),
            r(dim, scale=0.1, mean=1.0), r(dim, scale=0.1),
        )
        for _ in range(n_layer)
    )  # fmt: skip
    weights = ref.StackWeights(layers, r(vocab, dim, scale=4 / dim**0.5), n_head, 1e-5)
    cache_shape = (n_layer, n_rows, n_head, max_slots, dim // n_head)
    k, v = r(*cache_shape), r(*cache_shape)
    lengths = torch.full((n_rows,), length, device=device)
    return r(n_rows, dim), weights, k, v, lengths


def time_us(fn: Callable[[], object], on_gpu: bool, replays: int, batch_ms: float = 25.0) -> float:
    """Median µs of one call: 5 batches of replays of a CUDA graph of it on the GPU (at most `replays`
    per batch, fewer where a batch would pass batch_ms: a 9 ms step needs no 500 replays), eager calls
    on the CPU."""
    if not on_gpu:
        times = []
        for _ in range(max(1, replays)):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e6
    graph = capture(fn)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    replays = max(3, min(replays, math.ceil(batch_ms / max(start.elapsed_time(end), 1e-3))))
    per_batch = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        per_batch.append(start.elapsed_time(end) * 1e3 / replays)
    return statistics.median(per_batch)


def stage_prefixes(tk, x, w, k, v, lengths, n_slots, cfg) -> dict[str, Callable[[], object]]:
    """Callables running, for every layer, the first 1, 2 or 3 kernels (and the whole op)."""
    s = tk.Scratch.allocate(x.shape[0], w, k.shape[3], cfg)
    s.x_ffn.zero_()  # read by the next layer's qkv where a prefix stops before the ffn kernel
    logits = torch.empty(x.shape[0], w.head_weight.shape[0], device=x.device, dtype=x.dtype)

    def run(n_kernels: int) -> None:
        x_in, prev = x, None
        for i, layer in enumerate(w.layers):
            tk.qkv_stage(s, x_in, prev, layer, k[i], v[i], lengths, w.eps, cfg)
            if n_kernels > 1:
                tk.attention_stage(s, layer.out_weight, k[i], v[i], lengths, n_slots, cfg)
            if n_kernels > 2:
                tk.ffn_stage(s, layer, w.eps, cfg)
            x_in, prev = s.x_ffn, layer
        if n_kernels > 3:
            tk.head_stage(s, w.layers[-1], w.head_weight, logits, w.eps, cfg)

    return {name: (lambda n=n: run(n)) for n, name in enumerate(("qkv", "+attention", "+ffn", "+head"), 1)}


def mma_stage_prefixes(mk, x, w, k, v, lengths, n_slots, cfg) -> dict[str, Callable[[], object]]:
    """Callables running, for every layer, the many-row stack's first 1..5 kernels (and the head)."""
    s = mk.Scratch.allocate(x.shape[0], w, k.shape[3], cfg)
    for t in (s.x_ffn, s.out_attn, s.out_ffn, s.h):  # read by a later kernel where a prefix stops early
        t.zero_()
    logits = torch.empty(x.shape[0], w.head_weight.shape[0], device=x.device, dtype=x.dtype)

    def run(n_kernels: int) -> None:
        x_in, prev = x, None
        for i, layer in enumerate(w.layers):
            mk.qkv_stage(s, x_in, prev, layer, k[i], v[i], lengths, w.eps, cfg)
            if n_kernels > 1:
                mk.attention_stage(s, layer, k[i], v[i], lengths, n_slots, w.eps, cfg)
            if n_kernels > 2:
                mk.out_proj_stage(s, layer, w.eps, cfg)
            if n_kernels > 3:
                mk.ffn1_stage(s, layer, w.eps, cfg)
            if n_kernels > 4:
                mk.ffn2_stage(s, layer, w.eps, cfg)
            x_in, prev = s.x_ffn, layer
        if n_kernels > 5:
            mk.head_stage(s, w.layers[-1], w.head_weight, logits, w.eps, cfg)

    names = ("qkv", "+attention", "+out_proj", "+ffn1", "+ffn2", "+head")
    return {name: (lambda n=n: run(n)) for n, name in enumerate(names, 1)}


def bench_mma(mk, inputs, want, n_slots, cfg, on_gpu, replays, breakdown: bool, batch_ms=25.0) -> dict:
    """The many-row stack at one config: rel. L2 against the definition, µs per step, a breakdown."""
    x, w, k, v, lengths = inputs
    row = {"config": dataclasses.asdict(cfg)}
    try:
        row["rel_l2"] = rel_l2(mk.decode_stack_mma(x, w, k, v, lengths, n_slots, config=cfg), want)
        row["step_us"] = time_us(lambda: mk.decode_stack_mma(x, w, k, v, lengths, n_slots, config=cfg),
                                 on_gpu, replays, batch_ms)  # fmt: skip
        if breakdown:
            prefixes = mma_stage_prefixes(mk, x, w, k, v, lengths, n_slots, cfg)
            row["prefix_us"] = {name: time_us(fn, on_gpu, replays, batch_ms) for name, fn in prefixes.items()}
    except Exception as exc:  # a config that fails to compile or run is reported, the sweep goes on
        row["error"] = f"{type(exc).__name__}: {exc}"
    return row


def random_embed(size: str, n_rows: int, length: int, dtype: torch.dtype, device: str):
    """(EmbedWeights: table [V, D], pe [4000, D], alpha [1]; tokens [B]; audio_pos [B] = the length)."""
    _, dim, _, _, vocab = SIZES[size]
    g = torch.Generator().manual_seed(1)
    table, pe = torch.randn(vocab, dim, generator=g), torch.rand(4000, dim, generator=g) * 2 - 1
    embed = ref.EmbedWeights(*(t.to(device=device, dtype=dtype) for t in (table, pe, torch.tensor([0.73]))))
    tokens = torch.randint(0, vocab, (n_rows,), generator=g).to(device)
    return embed, tokens, torch.full((n_rows,), length, device=device)


def bench_embed(tk, inputs, embed_inputs, n_slots, cfg, on_gpu, replays) -> list[dict]:
    """The step's embedding: torch's ops before the x-taking stack, or gathered by the embed op."""
    _, w, k, v, lengths = inputs
    embed, tokens, pos = embed_inputs
    x = ref.embed_reference(tokens, pos, embed)
    want = ref.decode_stack_reference(x.float(), _float(w), k.float(), v.float(), lengths, n_slots)
    paths = {
        "torch_embed+fused": lambda: tk.decode_stack_triton(
            ref.embed_reference(tokens, pos, embed), w, k, v, lengths, n_slots, config=cfg
        ),
        "fused_embed": lambda: tk.embed_stack_triton(
            tokens, pos, embed, w, k, v, lengths, n_slots, config=cfg
        ),
    }
    rows = []
    for name, fn in paths.items():
        row = {"path": name, "config": dataclasses.asdict(cfg)}
        try:
            row["rel_l2"] = rel_l2(fn(), want)
            row["step_us"] = time_us(fn, on_gpu, replays)
        except Exception as exc:  # reported like a failing config; the other rows still run
            row["error"] = f"{type(exc).__name__}: {exc}"
        rows.append(row)
    return rows


def rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    return float((got - want).norm() / want.norm())


def bench_config(tk, inputs, n_slots, cfg, on_gpu, replays, breakdown: bool) -> dict:
    x, w, k, v, lengths = inputs
    row = {"config": dataclasses.asdict(cfg)}
    try:
        want = ref.decode_stack_reference(x.float(), _float(w), k.float(), v.float(), lengths, n_slots)
        row["rel_l2"] = rel_l2(tk.decode_stack_triton(x, w, k, v, lengths, n_slots, config=cfg), want)
        row["step_us"] = time_us(lambda: tk.decode_stack_triton(x, w, k, v, lengths, n_slots, config=cfg),
                                 on_gpu, replays)  # fmt: skip
        if breakdown:
            prefixes = stage_prefixes(tk, x, w, k, v, lengths, n_slots, cfg)
            row["prefix_us"] = {name: time_us(fn, on_gpu, replays) for name, fn in prefixes.items()}
    except Exception as exc:  # a config that fails to compile or run is reported, the sweep goes on
        row["error"] = f"{type(exc).__name__}: {exc}"
    return row


def _float(w: ref.StackWeights) -> ref.StackWeights:
    layers = tuple(ref.LayerWeights(*(t.float() for t in layer)) for layer in w.layers)
    return ref.StackWeights(layers, w.head_weight.float(), w.n_head, w.eps)


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


def main() -> None:
    args = parse_args()
    on_gpu = args.device == "cuda"
    from voicehub.runtime.kernels import t2s_layer_mma_triton as mk
    from voicehub.runtime.kernels import t2s_layer_triton as tk

    dtype = getattr(torch, args.dtype)
    n_layer, dim, n_head, ffn_dim, vocab = SIZES[args.size]
    base = tk.config_for(dim, ffn_dim, n_head, vocab)
    mma_base = mk.config_for(dim, ffn_dim, n_head, vocab)
    n_rows = [int(n) for n in args.rows.split(",")]
    report = Report(args, base, mma_base, n_layer)
    if args.mma_grid:
        from t2s_mma_grid import check_winner, mma_grid  # it imports this module's helpers

        winner = mma_grid(mk, args, report, mma_base, dtype)
        report.save()
        if winner is not None:
            check_winner(mk, args, report, mma_base, winner, dtype)
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
        mma_configs = [mma_base] + (
            [dataclasses.replace(mma_base, **c) for c in MMA_SWEEP] if is_last else []
        )
        for j, cfg in enumerate(mma_configs):
            row = bench_mma(mk, inputs, want, args.n_slots, cfg, on_gpu, args.replays, breakdown=j == 0)
            report.add({"rows": rows, "path": "mma" if j == 0 else "mma_sweep", **row})
        del want, inputs
        report.save()


def reference(inputs, n_slots: int) -> torch.Tensor:
    """The definition's logits in fp32 (it writes the step's k, v into the caches, as the kernels do)."""
    x, w, k, v, lengths = inputs
    return ref.decode_stack_reference(x.float(), _float(w), k.float(), v.float(), lengths, n_slots)


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


if __name__ == "__main__":
    with torch.inference_mode():
        main()
