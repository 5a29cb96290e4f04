"""Continuous batching of T2S streams on the GPU: aggregate tokens/s at 1..128 concurrent streams,
and whether a stream's tokens stay the same among others.

Workload: full-size random v3 weights (make_t2s_checkpoint), each stream a different random prompt
of 80 phonemes + 150 semantic tokens, N decoded tokens with EOS suppressed, fp16, graphs (preset
full) over batch buckets 1..128 and KV buckets. Per level L, L streams are submitted at once
(closed loop) to one ContinuousScheduler; aggregate tokens/s = all streams' tokens / wall time from
the first submit to the last result; first-token latency per stream (granularity: the stop check).
Streams 0 and 1 are greedy, the others sampled (top_k 5, temperature 0.6, seed = stream index,
per-row random streams).

Exactness at every level, for the first CHECKED streams: greedy streams against the eager reference
(`decode.decode`) under the margin rule of t2s_decode_bench (a divergence passes only where eager's
decision margin is within epsilon); sampled streams against the same stream run alone on this
engine (per-row streams make them comparable; first divergence reported, no margin available).

--kernels triton steps with the kernels kernel_backend=triton gives the row engine (the many-row layer
stack t2s_layer_stack_rows and the fused sampler; --rows-stack gemv keeps the one-row GEMV stack, for A/B).

    python benchmarks/t2s_batch_bench.py --out benchmarks/results/t2s_batch_h200.json
    python benchmarks/t2s_batch_bench.py --kernels triton --out benchmarks/results/t2s_batch_triton_h200.json
    python benchmarks/t2s_batch_bench.py --device cpu --size tiny --dtype float32 --levels 1,4 --n-tokens 40
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from t2s_decode_bench import EPSILON_LOGIT, EPSILON_RACE, compare, meta, timed

from voicehub.models.gpt_sovits.t2s.checkpoint import load_t2s
from voicehub.models.gpt_sovits.t2s.decode import T2SSamplingParams, decode
from voicehub.models.gpt_sovits.t2s.make_checkpoint import make_t2s_checkpoint, random_prompt
from voicehub.models.gpt_sovits.t2s.scheduler import T2SRowEngine
from voicehub.models.gpt_sovits.t2s.static import StaticDecodeConfig, StepKernels, T2SRequest
from voicehub.runtime.kernels import registry
from voicehub.runtime.scheduler import ContinuousScheduler

N_PHONES, N_PROMPT = 80, 150
CHECKED = 4  # streams per level checked for token identity
KV_BUCKETS = (256, 384, 512, 768, 1024)


def stream_request(config, i: int, n_tokens: int) -> T2SRequest:
    if i < 2:
        params = T2SSamplingParams.greedy(force_n_tokens=n_tokens)
    else:
        params = T2SSamplingParams(seed=i, top_k=5, top_p=1.0, temperature=0.6, force_n_tokens=n_tokens)
    return T2SRequest(*random_prompt(config, N_PHONES, N_PROMPT, seed=1000 + i), params)


def step_kernels(kernels: str, rows_stack: str, device: str) -> StepKernels | None:
    """None (the model's own modules), or what KernelBackendTransform(triton) sets: both layer stacks
    (the row engine uses layer_stack_rows, `StepKernels.for_rows`) and the fused sampler."""
    if kernels == "native":
        return None
    ops = (registry.T2S_LAYER_STACK, registry.T2S_LAYER_STACK_ROWS, registry.T2S_SAMPLE_STEP)
    layers, rows, sampler = (registry.resolve(op, kernels, device) for op in ops)
    return StepKernels(
        layer_stack=layers, layer_stack_rows=rows if rows_stack == "mma" else None, sampler=sampler
    )


def run_level(engine: T2SRowEngine, requests: list[T2SRequest]) -> dict:
    """Submit every request at once, pump until all finish; timings and each stream's tokens."""
    sched = ContinuousScheduler(engine, max_queue=len(requests))
    first_token_s: list[float | None] = [None] * len(requests)
    if engine.device.type == "cuda":
        torch.cuda.synchronize()  # start the clock on an idle device
    t0 = time.perf_counter()

    def on_tokens(i):
        def record(_tokens):
            if first_token_s[i] is None:
                first_token_s[i] = time.perf_counter() - t0

        return record

    handles = [sched.submit(r, on_tokens=on_tokens(i)) for i, r in enumerate(requests)]
    sched.run_until_idle()
    wall = time.perf_counter() - t0
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
        "first_token_s": {
            "p50": statistics.median(firsts),
            "p95": firsts[min(len(firsts) - 1, int(0.95 * len(firsts)))],
            "max": firsts[-1],
        },
        "_tokens": [r.tokens for r in results],
    }


def identity(tokens: torch.Tensor, eager_ref, alone: torch.Tensor | None) -> dict:
    """Greedy: against eager under the margin rule; sampled: against the stream run alone."""
    if eager_ref is not None:
        return {"against": "eager", **compare(eager_ref, tokens)}
    a, b = alone.tolist(), tokens.tolist()
    first = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)
    return {"against": "alone", "identical": a == b, "first_divergence": first}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size", default="full")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--n-tokens", type=int, default=500)
    p.add_argument("--levels", default="1,4,16,64,128")
    p.add_argument("--reps", type=int, default=3, help="timed runs per level; the median-wall run is kept")
    p.add_argument("--stop-check-interval", type=int, default=8)
    p.add_argument("--device", default="cuda", help="cuda; cpu only smoke-tests the script (graphs off)")
    p.add_argument(
        "--kernels",
        default="native",
        choices=["native", "triton"],
        help="triton: the step kernels of kernel_backend=triton (TRITON_INTERPRET=1 on the CPU)",
    )
    p.add_argument("--rows-stack", default="mma", choices=["mma", "gemv"],
                   help="with --kernels triton: the many-row layer stack, or the one-row GEMV stack")  # fmt: skip
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    t_start = time.perf_counter()
    levels = [int(x) for x in args.levels.split(",")]
    ckpt, make_s = timed(lambda: make_t2s_checkpoint(f"/tmp/t2s_{args.size}.ckpt", args.size, seed=0))
    (model, config), load_s = timed(lambda: load_t2s(ckpt, device=args.device, dtype=args.dtype))
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
    engine, capture_s = timed(lambda: T2SRowEngine(model, cfg, preset="full" if on_gpu else "off"))
    kernels = step_kernels(args.kernels, args.rows_stack, args.device)
    if kernels is not None:  # captured again with the kernels (the first capture is the native step's)
        _, capture_s = timed(lambda: engine.set_step_kernels(kernels))
    requests = [stream_request(config, i, args.n_tokens) for i in range(max(levels))]
    n_check = min(CHECKED, max(levels))
    eager = [
        decode(model, r.phone_ids, r.bert, r.prompt_tokens, r.params) if i < 2 else None
        for i, r in enumerate(requests[:n_check])
    ]
    alone = [run_level(engine, [r])["_tokens"][0] for r in requests[:n_check]]
    run_level(engine, requests[: min(4, max(levels))])  # warm-up: allocator, first replays
    rows = []
    for level in levels:
        runs = sorted(
            (run_level(engine, requests[:level]) for _ in range(args.reps)), key=lambda r: r["wall_s"]
        )
        row = runs[len(runs) // 2]
        row["wall_all_s"] = [r["wall_s"] for r in runs]
        toks = row.pop("_tokens")
        row["identity"] = [identity(toks[i], eager[i], alone[i]) for i in range(min(level, n_check))]
        rows.append(row)
    result = {"levels": rows, "capture_full_s": capture_s, "n_graphs": len(engine.graphs.captured_buckets)}
    if on_gpu:
        result["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        result["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    info = meta(args, make_s, load_s, time.perf_counter() - t_start)
    info["benchmark"] = "t2s_batch"
    info["sizes"] = {
        "checkpoint": args.size, "n_phones": N_PHONES, "n_prompt_tokens": N_PROMPT,
        "n_decoded": args.n_tokens, "levels": levels, "kv_buckets": list(KV_BUCKETS),
        "batch_buckets": list(cfg.row_buckets), "stop_check_interval": args.stop_check_interval,
    }  # fmt: skip
    info["warmups"] = "capture at load (preset full), one 4-stream run; median of --reps runs per level"
    info["arrival"] = "closed loop: every stream of a level submitted at once"
    info["epsilon_margin_rule"] = {"logit": EPSILON_LOGIT, "race": EPSILON_RACE}
    info["kernels"] = {
        "backend": args.kernels,
        "rows_stack": args.rows_stack if args.kernels != "native" else None,
    }
    result["meta"] = info
    print(
        f"{'streams':>7} {'wall_s':>8} {'tok/s':>9} {'tok/s/stream':>12} {'ttft_p50':>8} {'ttft_p95':>8}  identity"
    )
    for r in rows:
        ok = all(x.get("passes_margin_rule", x.get("identical")) for x in r["identity"])
        print(
            f"{r['n_streams']:7d} {r['wall_s']:8.3f} {r['tokens_per_s']:9.0f} {r['per_stream_tokens_per_s']:12.0f}"
            f" {r['first_token_s']['p50']:8.3f} {r['first_token_s']['p95']:8.3f}  {'ok' if ok else 'DIVERGED'}"
        )
        for i, x in enumerate(r["identity"]):
            if not x.get("identical"):
                print(f"        stream {i}: {x}")
    print("capture:", round(capture_s, 2), "s;", result["n_graphs"], "graphs")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.exit(main())
