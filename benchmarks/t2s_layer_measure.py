"""The pieces the T2S layer-stack benches share: sizes, random full-size inputs, the torch definition's
logits, CUDA-graph timing, and one config's check and timing per stack (the one-row GEMV stack, the
many-row stack, the step's embedding), and the many-row table's changes for one run (--mma-change,
--mma-bucket-changes). `t2s_layer_bench.py` runs them; `t2s_mma_grid.py`, `t2s_rows_probe.py` and
`t2s_batch_bench.py` reuse them (a module of its own so no helper imports a script back).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import time
from collections.abc import Callable

import torch
from bench_meta import capture

from voicehub.runtime.kernels import t2s_layer as ref
from voicehub.runtime.kernels import t2s_layer_mma_config as mc
from voicehub.runtime.kernels.t2s_layer_mma_config import BucketChange, MmaConfig

SIZES = {  # n_layer, dim, n_head, ffn_dim, vocab
    "full": (24, 512, 16, 2048, 1025),
    "tiny": (2, 64, 4, 256, 1025),
}


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


def parse_bucket_changes(text: str) -> tuple[BucketChange, ...]:
    """'33-64@512:gemm_stages=3;768:row_groups=1' -> BUCKET_CHANGES' form: steps of 33 to 64 rows whose KV
    bucket has at most 512 slots take gemm_stages 3, then steps of any rows up to 768 slots row_groups 1 (the
    first that holds a step applies; only RESULT_FREE fields). '' -> none."""
    out = []
    for item in filter(None, text.split(";")):
        bucket, sep, change = item.partition(":")
        rows, at, slots = bucket.rpartition("@")
        low, dash, high = rows.partition("-")
        if not sep or not slots.isdigit() or (at and not (dash and low.isdigit() and high.isdigit())):
            raise argparse.ArgumentTypeError(
                f"expected [MIN_ROWS-MAX_ROWS@]MAX_SLOTS:field=value,..., got {item!r}"
            )
        bounds = {"min_rows": int(low), "max_rows": int(high)} if at else {}
        try:
            out.append(BucketChange(int(slots), parse_change(change), **bounds))
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return tuple(out)


def set_mma_table(shape_key: tuple, change: dict, bucket_changes: tuple | None) -> None:
    """The many-row stack's table for this run: its entry with `change`, its BUCKET_CHANGES replaced by
    `bucket_changes` (None: kept). SystemExit, the table untouched, where a bucket change would override
    `change` or does not apply to the entry."""
    entry = dataclasses.replace(mc.config_for(*shape_key), **change)
    buckets = mc.BUCKET_CHANGES.get(shape_key, ()) if bucket_changes is None else bucket_changes
    for bucket in buckets:
        if both := sorted(set(change) & set(bucket.change)):
            raise SystemExit(f"--mma-change sets {both}, which a bucket change overrides ({bucket}): pass "
                             "--mma-bucket-changes without it ('' for none)")  # fmt: skip
        try:
            dataclasses.replace(entry, **bucket.change)
        except ValueError as e:
            raise SystemExit(f"{bucket} does not apply to the table's entry: {e}") from None
    if change:
        mc.CONFIGS[shape_key] = entry
    mc.BUCKET_CHANGES[shape_key] = buckets


def steps_changed(shape_key: tuple, row_buckets, kv_buckets) -> list[dict]:
    """Each (row bucket, KV bucket) whose config is not the table's entry, with the fields that differ."""
    entry = dataclasses.asdict(mc.config_for(*shape_key))
    out = []
    for rows in row_buckets:
        for slots in kv_buckets:
            step = dataclasses.asdict(mc.config_for(*shape_key, rows, slots))
            if changed := {k: v for k, v in step.items() if entry[k] != v}:
                out.append({"rows": rows, "slots": slots, "changed": changed})
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


def reference(inputs, n_slots: int) -> torch.Tensor:
    """The definition's logits in fp32 (it writes the step's k, v into the caches, as the kernels do)."""
    x, w, k, v, lengths = inputs
    return ref.decode_stack_reference(x.float(), _float(w), k.float(), v.float(), lengths, n_slots)
