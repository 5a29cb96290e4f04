"""Continuous batching of T2S streams on the GPU: aggregate tokens/s at 1..128 concurrent streams,
and whether a stream's tokens stay the same among others.

Workload: full-size random v3 weights (make_t2s_checkpoint), each stream a different random prompt
of 80 phonemes + 150 semantic tokens, N decoded tokens with EOS suppressed, fp16, graphs (preset
full) over batch buckets 1..128 and KV buckets. Per level L, L streams are submitted at once
(closed loop) to one ContinuousScheduler; aggregate tokens/s = all streams' tokens / wall time from
the first submit to the last result; first-token latency per stream (granularity: the stop check).
Streams 0 and 1 are greedy (top_k 1; seed = stream index, for exact ties at the top), the others
sampled (top_k 5, temperature 0.6, seed = stream index, per-row random streams).

Exactness at every level, for the first CHECKED streams: greedy streams against the eager reference
(`decode.decode`) under the margin rule of t2s_decode_bench (a divergence passes only where eager's
decision margin is within epsilon); sampled streams against the same stream run alone on this
engine (per-row streams make them comparable; first divergence reported, no margin available).

--kernels triton steps with the kernels kernel_backend=triton gives the row engine (the many-row layer
stack t2s_layer_stack_rows behind its embed op, and the fused sampler; --rows-stack gemv keeps the one-row
GEMV stack, mma-torch-embed torch's embedding before the stack, for A/B).

Where a level's wall time goes (`breakdown`, from the timed run's rounds): `admit_s` (first submit ->
every stream has its first token); the admission phase (rounds until the row count is the level's, with
no stream waiting); `steady` (rounds while every stream is live and none waits: time per step, tokens/s);
the tail (rounds after the first stream finished). `replay` is the floor the loop is read against: the
level's streams admitted, then the step graphs of the whole decode (same row bucket and KV buckets)
replayed in a loop with no host work between, synced once; `steady_over_replay` and
`wall_over_replay` are the loop's cost as ratios. `syncs` (CUDA): a separate untimed run of the level under
torch.cuda.set_sync_debug_mode("warn") counts the operations that block on the device (.item(), .cpu(),
blocking copies...) per phase; `host_reads_per_step` counts the engine's deliberate reads (a snapshot's
event, one per round).

    python benchmarks/t2s_batch_bench.py --out benchmarks/results/t2s_batch_h200.json
    python benchmarks/t2s_batch_bench.py --kernels triton --out benchmarks/results/t2s_batch_triton_h200.json
    python benchmarks/t2s_batch_bench.py --device cpu --size tiny --dtype float32 --levels 1,4 --n-tokens 40
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path

import torch
from kernel_timeline import loop_against_replay, traced
from t2s_batch_report import breakdown, print_report
from t2s_decode_bench import EPSILON_LOGIT, EPSILON_RACE, compare, first_divergence, meta, timed
from t2s_layer_measure import parse_bucket_changes, parse_change, set_mma_table, steps_changed

from voicehub.models.gpt_sovits.optimization import T2S_STEP_OPS, t2s_step_kernels
from voicehub.models.gpt_sovits.t2s.checkpoint import load_t2s
from voicehub.models.gpt_sovits.t2s.decode import T2SSamplingParams, decode
from voicehub.models.gpt_sovits.t2s.make_checkpoint import make_t2s_checkpoint, random_prompt
from voicehub.models.gpt_sovits.t2s.scheduler import PREFILL_ROWS, T2SRowEngine
from voicehub.models.gpt_sovits.t2s.static import StaticDecodeConfig, StepKernels, T2SRequest
from voicehub.runtime.kernels import registry
from voicehub.runtime.kernels import t2s_layer_mma_config as mma_config
from voicehub.runtime.kv_cache import pick_bucket
from voicehub.runtime.scheduler import ContinuousScheduler
from voicehub.server.pool import freeze_long_lived

N_PHONES, N_PROMPT = 80, 150
CHECKED = 4  # streams per level checked for token identity
N_FIRST_PUMPS = 3  # pumps timed one by one (host and device) at the start of each run: admission's spread
KV_BUCKETS = (256, 384, 512, 768, 1024)


def stream_request(config, i: int, n_tokens: int) -> T2SRequest:
    if i < 2:
        # top_k 1 keeps every token tied at the top (as upstream's pivot does) and the race picks among them:
        # a fixed seed makes that pick the same alone and among others (seed None draws a fresh one per run)
        params = T2SSamplingParams.greedy(seed=i, force_n_tokens=n_tokens)
    else:
        params = T2SSamplingParams(seed=i, top_k=5, top_p=1.0, temperature=0.6, force_n_tokens=n_tokens)
    return T2SRequest(*random_prompt(config, N_PHONES, N_PROMPT, seed=1000 + i), params)


def step_kernels(kernels: str, rows_stack: str, device: str) -> StepKernels | None:
    """None (the model's own modules), or what KernelBackendTransform(triton) sets (`t2s_step_kernels`:
    both layer stacks, the row engine using layer_stack_rows, the fused sampler and the row noise);
    rows_stack "gemv" drops the many-row stack (the row engine then steps with the one-row stack);
    "mma-torch-embed" keeps it but drops its embed op (torch's embedding before the stack, for A/B)."""
    if kernels == "native":
        return None
    step = t2s_step_kernels({op: registry.resolve(op, kernels, device) for op in T2S_STEP_OPS})
    if rows_stack == "mma-torch-embed":
        return replace(step, embed_stack_rows=None)
    return step if rows_stack == "mma" else replace(step, layer_stack_rows=None)


@contextmanager
def counting_gc():
    """Yields {"n": collections, "s": their seconds, "gen2": full collections} while the block runs: the
    interpreter's garbage collector pauses every thread (a full collection of a large heap is tens of ms)."""
    out = {"n": 0, "s": 0.0, "gen2": 0}
    started = []

    def callback(phase, info):
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            out["n"] += 1
            out["s"] += time.perf_counter() - started.pop()
            out["gen2"] += info["generation"] == 2

    gc.callbacks.append(callback)
    try:
        yield out
    finally:
        gc.callbacks.remove(callback)


@contextmanager
def counting_syncs(is_on: bool):
    """A list that grows by one per operation blocking on the CUDA device while inside (sync debug mode)."""
    if not is_on:
        yield []
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield caught
        finally:
            torch.cuda.set_sync_debug_mode(0)


def run_level(
    engine: T2SRowEngine, requests: list[T2SRequest], poll_lag: int, count_syncs: bool = False
) -> dict:
    """Submit every request at once, pump until all finish; timings, rounds and each stream's tokens."""
    sched = ContinuousScheduler(engine, max_queue=len(requests), poll_lag=poll_lag)
    first_token_s: list[float | None] = [None] * len(requests)
    on_gpu = engine.device.type == "cuda"
    if on_gpu:
        torch.cuda.synchronize()  # start the clock on an idle device
    reads = engine.n_snapshots
    t0 = time.perf_counter()
    # the first pumps (admission, its rounds, the first read): when the host returned from each, and (CUDA)
    # an event after each, so a slow admission shows as the host's or the device's
    events = [torch.cuda.Event(enable_timing=True) for _ in range(N_FIRST_PUMPS + 1)] if on_gpu else []
    if events:
        events[0].record()

    def on_tokens(i):
        def record(_tokens):
            if first_token_s[i] is None:
                first_token_s[i] = time.perf_counter() - t0

        return record

    handles = [sched.submit(r, on_tokens=on_tokens(i)) for i, r in enumerate(requests)]
    rounds = [(0.0, 0, 0, len(requests), 0)]  # after each pump: (s, steps, active, waiting, syncs)
    with counting_syncs(count_syncs and on_gpu) as syncs, counting_gc() as collected:
        is_busy = True
        while is_busy:
            is_busy = sched.pump()
            rounds.append(
                (time.perf_counter() - t0, sched.n_steps, sched.n_active, sched.n_waiting, len(syncs))
            )
            if len(rounds) <= len(events):
                events[len(rounds) - 1].record()
    wall = rounds[-1][0]
    if events:
        torch.cuda.synchronize()
    first_pumps = [
        {"host_s": rounds[i][0], "steps": rounds[i][1],
         "device_s": events[0].elapsed_time(events[i]) / 1e3 if events else None}
        for i in range(1, min(N_FIRST_PUMPS + 1, len(rounds)))
    ]  # fmt: skip
    results = [h.result() for h in handles]
    n_tokens = sum(int(r.tokens.numel()) for r in results)
    firsts = sorted(first_token_s)
    return {
        "n_streams": len(requests),
        "wall_s": wall,
        "tokens": n_tokens,
        "tokens_per_s": n_tokens / wall,
        "per_stream_tokens_per_s": n_tokens / wall / len(requests),
        "n_steps": sched.n_steps,
        "gc": collected,
        "first_token_s": {
            "p50": statistics.median(firsts),
            "p95": firsts[min(len(firsts) - 1, int(0.95 * len(firsts)))],
            "max": firsts[-1],
        },
        "_tokens": [r.tokens for r in results],
        "first_pumps": first_pumps,
        "_rounds": rounds,
        "_reads": engine.n_snapshots - reads,
    }


def replay_only(engine: T2SRowEngine, requests: list[T2SRequest], n_steps: int) -> float:
    """Seconds for the level's decode as graph replays alone: its requests admitted (their real prompts
    and sampling), then n_steps replays of the step graph at the level's row bucket and each step's KV
    bucket, no host work between, synced once; the rows are released after."""
    rows = list(range(len(requests)))
    engine.admit_rows(rows, requests)
    n_prompt = max(r.phone_ids.shape[0] + r.prompt_tokens.shape[0] for r in requests)
    n_rows = pick_bucket(len(rows), engine.row_buckets)
    keys = [(n_rows, pick_bucket(n_prompt + s + 1, engine.engine.buckets)) for s in range(n_steps)]
    on_gpu = engine.device.type == "cuda"
    if on_gpu:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for key in keys:
        engine.graphs.run(key)
    if on_gpu:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    for row in rows:
        engine.release(row)
    return seconds


def timeline(engine: T2SRowEngine, requests: list[T2SRequest], poll_lag: int, n_replayed: int) -> dict:
    """The level's run and its replay-only decode, each traced once (every GPU kernel), compared over their
    steady states (`kernel_timeline.loop_against_replay`): where the loop's device time goes between graphs."""
    _, loop = traced(lambda: run_level(engine, requests, poll_lag))
    _, replay = traced(lambda: replay_only(engine, requests, n_replayed))
    return loop_against_replay(loop, replay)


def identity(tokens: torch.Tensor, eager_ref, alone: torch.Tensor) -> dict:
    """Greedy: against eager under the margin rule; sampled: against the stream run alone. Every stream is
    also compared with itself run alone on this engine (batch invariance: bitwise, no margin)."""
    first = first_divergence(alone, tokens)
    out = {"against_alone_identical": first is None, "against_alone_first_divergence": first}
    if eager_ref is not None:
        return {"against": "eager", **compare(eager_ref, tokens), **out}
    return {"against": "alone", "identical": first is None, "first_divergence": first, **out}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size", default="full")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--n-tokens", type=int, default=500)
    p.add_argument("--levels", default="1,4,16,64,128")
    p.add_argument(
        "--no-gc-freeze",
        action="store_true",
        help="leave the loaded model in the garbage collector's walks (the server freezes it after warm-up)",
    )
    p.add_argument(
        "--reps",
        type=int,
        default=3,
        help="timed runs per level; the median-wall run is kept "
        "(of an even count the faster middle one); every run's wall, admission and GC are kept",
    )
    p.add_argument("--stop-check-interval", type=int, default=8)
    p.add_argument("--poll-lag", type=int, default=1, help="rounds a snapshot waits before it is read")
    p.add_argument("--prefill-rows", type=int, default=PREFILL_ROWS, help="prompts per padded prefill call")
    p.add_argument(
        "--no-sync-count", action="store_true", help="skip the untimed sync-counting run per level"
    )
    p.add_argument("--device", default="cuda", help="cuda; cpu only smoke-tests the script (graphs off)")
    p.add_argument(
        "--kernels",
        default="native",
        choices=["native", "triton"],
        help="triton: the step kernels of kernel_backend=triton (TRITON_INTERPRET=1 on the CPU)",
    )
    p.add_argument("--rows-stack", default="mma", choices=["mma", "mma-torch-embed", "gemv"],
                   help="with --kernels triton: the many-row layer stack (mma-torch-embed: torch's embedding before "
                   "it instead of its embed op), or the one-row GEMV stack")  # fmt: skip
    p.add_argument(
        "--mma-change",
        type=parse_change,
        default={},
        help="fields of the many-row stack's table entry changed for this run, e.g. attn_stages=2 (a candidate "
        "measured in the engine before it goes in the table)",
    )
    p.add_argument(
        "--mma-bucket-changes",
        type=parse_bucket_changes,
        help="the table's BUCKET_CHANGES replaced for this run ('' for none): RESULT_FREE fields changed by the "
        "step's rows and KV bucket, e.g. '33-64@512:gemm_stages=3' (33-64 rows, buckets of up to 512 slots)",
    )
    p.add_argument(
        "--round-graphs",
        action="store_true",
        help="the engine also captures a graph of each whole round (T2SRowEngine round_graphs): one replay a round",
    )
    p.add_argument(
        "--timeline",
        action="store_true",
        help="per level, one more run and replay-only decode traced by the profiler (CUDA): where the loop's "
        "device time goes between graphs",
    )
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    t_start = time.perf_counter()
    levels = [int(x) for x in args.levels.split(",")]
    ckpt, make_s = timed(lambda: make_t2s_checkpoint(f"/tmp/t2s_{args.size}.ckpt", args.size, seed=0))
    (model, config), load_s = timed(lambda: load_t2s(ckpt, device=args.device, dtype=args.dtype))
    shape_key = (config.hidden_dim, config.ffn_dim, config.n_head, config.vocab_size)
    set_mma_table(shape_key, args.mma_change, args.mma_bucket_changes)
    on_gpu = torch.device(args.device).type == "cuda"
    max_seq = max(KV_BUCKETS)
    if N_PHONES + N_PROMPT + args.n_tokens > max_seq:
        raise SystemExit(f"--n-tokens {args.n_tokens} does not fit {max_seq} KV slots with the prompt")
    cfg = StaticDecodeConfig(
        max_batch=max(levels), max_seq_len=max_seq, kv_buckets=KV_BUCKETS,
        batch_buckets=(1, 2, 4, 8, 16, 32, 64, 128), stop_check_interval=args.stop_check_interval,
    )  # fmt: skip
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    preset = "full" if on_gpu else "off"
    engine, capture_s = timed(
        lambda: T2SRowEngine(
            model, cfg, preset=preset, prefill_rows=args.prefill_rows, round_graphs=args.round_graphs
        )
    )
    kernels = step_kernels(args.kernels, args.rows_stack, args.device)
    if kernels is not None:  # captured again with the kernels (the first capture is the native step's)
        _, capture_s = timed(lambda: engine.set_step_kernels(kernels))
    requests = [stream_request(config, i, args.n_tokens) for i in range(max(levels))]
    n_check = min(CHECKED, max(levels))
    eager = [
        decode(model, r.phone_ids, r.bert, r.prompt_tokens, r.params) if i < 2 else None
        for i, r in enumerate(requests[:n_check])
    ]
    lag = args.poll_lag
    alone = [run_level(engine, [r], lag)["_tokens"][0] for r in requests[:n_check]]
    run_level(engine, requests[: min(4, max(levels))], lag)  # warm-up: allocator, first replays
    # and admission at the largest level (device and pinned host blocks), a few steps only
    short = [
        T2SRequest(r.phone_ids, r.bert, r.prompt_tokens, replace(r.params, force_n_tokens=9))
        for r in requests
    ]
    run_level(engine, short, lag)
    if not args.no_gc_freeze:
        freeze_long_lived()  # as the server's worker does after its warm-ups
    rows = []
    for level in levels:
        runs = sorted(
            (run_level(engine, requests[:level], lag) for _ in range(args.reps)), key=lambda r: r["wall_s"]
        )
        row = runs[(len(runs) - 1) // 2]  # the median run (of an even count, the faster of the middle two)
        row["wall_all_s"] = [r["wall_s"] for r in runs]
        row["admit_all_s"] = [r["first_token_s"]["max"] for r in runs]
        row["gc_all"] = [r["gc"] for r in runs]
        row["first_pumps_all"] = [r["first_pumps"] for r in runs]
        sync_run = (
            None if args.no_sync_count or not on_gpu else run_level(engine, requests[:level], lag, True)
        )
        n_replayed = args.n_tokens - 1  # forced: one token at admission, then one a step
        replay = replay_only(engine, requests[:level], n_replayed)
        row["breakdown"] = breakdown(row, sync_run, replay, n_replayed)
        if args.timeline and on_gpu:
            row["timeline"] = timeline(engine, requests[:level], lag, n_replayed)
        toks = row.pop("_tokens")
        del row["_rounds"], row["_reads"]
        row["identity"] = [identity(toks[i], eager[i], alone[i]) for i in range(min(level, n_check))]
        rows.append(row)
    result = {"levels": rows, "capture_full_s": capture_s, "n_graphs": len(engine.graphs.captured_buckets),
              "n_round_graphs": engine.rounds.n_captured if engine.rounds is not None else 0}  # fmt: skip
    if on_gpu:
        result["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        result["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    info = meta(args, make_s, load_s, time.perf_counter() - t_start)
    info["benchmark"] = "t2s_batch"
    info["sizes"] = {
        "checkpoint": args.size, "n_phones": N_PHONES, "n_prompt_tokens": N_PROMPT,
        "n_decoded": args.n_tokens, "levels": levels, "kv_buckets": list(KV_BUCKETS),
        "batch_buckets": list(cfg.row_buckets), "stop_check_interval": args.stop_check_interval,
        "poll_lag": args.poll_lag, "prefill_rows": args.prefill_rows, "round_graphs": args.round_graphs,
    }  # fmt: skip
    info["warmups"] = (
        "capture at load (preset full), one 4-stream run, one run of every stream for 9 tokens; median of --reps "
        "runs per level (every run's wall, admission and garbage collections in *_all); then per level one "
        "untimed sync-counting run and the replay-only decode (breakdown)"
    )
    info["arrival"] = "closed loop: every stream of a level submitted at once"
    info["gc_frozen_after_warm_up"] = not args.no_gc_freeze
    info["epsilon_margin_rule"] = {"logit": EPSILON_LOGIT, "race": EPSILON_RACE}
    info["kernels"] = {
        "backend": args.kernels,
        "rows_stack": args.rows_stack if args.kernels != "native" else None,
        "mma_change": args.mma_change,
        "mma_bucket_changes": [asdict(b) for b in mma_config.BUCKET_CHANGES.get(shape_key, ())],
        "mma_steps_changed": steps_changed(shape_key, cfg.row_buckets, KV_BUCKETS),
    }
    result["meta"] = info
    print_report(rows, capture_s, result["n_graphs"])
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    gc.unfreeze()  # else objects frozen at exit are reported as leaks by Triton's bindings


if __name__ == "__main__":
    sys.exit(main())
