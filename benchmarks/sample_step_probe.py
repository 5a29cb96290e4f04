"""The fused sampler's time a step (`sample_step_triton`) at the row engine's shape: top-k's cut searched
two bits a block reduction (the default) against one bit a reduction (`bitwise_k`), same tokens.

At 64 rows the sampler was 13.4 us of a ~1,230 us engine step on an H100 (session 33's timeline), most of
it the 19 dependent block reductions of the top-k search. Each variant is timed as a CUDA graph of
N_CALLS sampler launches on 64 rows of v3's vocabulary (fp16 logits, fp32 per-row noise), at upstream's
top-k 15 and the benchmark workload's 5, top-p 1 (no nucleus search); the tokens of both variants are
compared on every case.

    python benchmarks/sample_step_probe.py --out results/sample_step_probe_h200.json
    TRITON_INTERPRET=1 python benchmarks/sample_step_probe.py --device cpu  # smoke test: the tokens
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import platform
import sys
from pathlib import Path

import torch
import triton
from bench_meta import capture, event_ms, tree_commit

from voicehub.models.gpt_sovits.t2s.config import EOS_BLOCKED_STEPS, MAX_DECODE_STEPS
from voicehub.models.gpt_sovits.t2s.static import DecodeState
from voicehub.runtime.kernels.sample_step_triton import sample_step_triton
from voicehub.runtime.sampling import SamplingBuffers

N_ROWS, VOCAB, EOS = 64, 1025, 1024  # the engine's 64 streams, v3's vocabulary
N_CALLS, WARMUP, REPS = 20, 5, 30
TOP_KS = (5, 15)


def inputs(top_k: int, device: str) -> tuple:
    g = torch.Generator().manual_seed(top_k)
    buf = SamplingBuffers.allocate(N_ROWS, VOCAB, device)
    buf.top_k.fill_(top_k)
    buf.temperature.fill_(0.8)
    buf.repetition_penalty.fill_(1.35)
    buf.seen.copy_(torch.rand(N_ROWS, VOCAB, generator=g) < 0.05)
    state = DecodeState.allocate(N_ROWS, MAX_DECODE_STEPS, device)
    state.step.fill_(EOS_BLOCKED_STEPS)
    state.cap.fill_(MAX_DECODE_STEPS)
    logits = (3 * torch.randn(N_ROWS, VOCAB, generator=g)).half().to(device)
    q = torch.empty(N_ROWS, VOCAB).exponential_(1, generator=g).to(device)
    return logits, q, buf, state


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--device", default="cuda", help="cuda; cpu only smoke-tests the script (TRITON_INTERPRET=1)"
    )
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    limits = {"eos": EOS, "n_blocked": EOS_BLOCKED_STEPS, "max_steps": MAX_DECODE_STEPS}
    variants = {
        "two_bits": sample_step_triton,
        "one_bit": functools.partial(sample_step_triton, bitwise_k=True),
    }
    rows = []
    for top_k in TOP_KS:
        logits, q, buf, state = inputs(top_k, args.device)
        tokens = {}
        for name, fn in variants.items():
            b, s = copy.deepcopy(buf), copy.deepcopy(state)
            tokens[name] = fn(logits, q, b, s, None, **limits).clone()
        same = torch.equal(tokens["two_bits"], tokens["one_bit"])
        distinct = len(set(tokens["two_bits"].tolist()))
        assert same and distinct > 8, f"top_k {top_k}: variants agree {same}, {distinct} distinct tokens"
        if args.device != "cuda":
            print(f"cpu smoke top_k {top_k}: same tokens ({distinct} distinct)")
            continue
        for name, fn in variants.items():
            b, s = copy.deepcopy(buf), copy.deepcopy(state)

            def calls(fn=fn, b=b, s=s, logits=logits, q=q) -> None:
                for _ in range(N_CALLS):
                    fn(logits, q, b, s, None, **limits)

            graph = capture(calls)
            ms = event_ms(graph.replay, WARMUP, REPS)
            rows.append({"top_k": top_k, "variant": name, "us_per_call": ms * 1e3 / N_CALLS})
            print(f"top_k {top_k:3} {name:9} {rows[-1]['us_per_call']:6.2f} us a call", flush=True)
    if args.device != "cuda":
        return
    meta = {
        "benchmark": "sample_step_probe",
        "gpu": torch.cuda.get_device_name(),
        "platform": platform.platform(),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "triton": triton.__version__,
            "voicehub_commit": tree_commit(),
        },
        "precision": "fp16 logits, fp32 noise",
        "sizes": {
            "rows": N_ROWS,
            "vocab": VOCAB,
            "top_k": list(TOP_KS),
            "top_p": 1.0,
            "calls_a_graph": N_CALLS,
        },
        "warmups": f"2 eager runs before the capture, {WARMUP} replays",
        "repetitions": f"median of {REPS} replays (CUDA events)",
        "command": " ".join(["python", *sys.argv]),
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"results": rows, "meta": meta}, indent=1))


if __name__ == "__main__":
    main()
