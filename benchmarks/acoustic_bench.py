"""CFM (DiT flow matching) and BigVGAN on the GPU: eager vs graphs vs kernels, exactness and speed.

Full-size random v3 weights made here by make_sovits_checkpoint / make_bigvgan_folder, fp16.
CFM: `solve` for N mel frames (281 = 3 s alone; 562 = 3 s reference prompt + 3 s chunk) at
4/8/32 steps, eager and replayed as one CUDA graph. BigVGAN: mel lengths 70/128/298/598 with
the torch activation, each registered kernel backend of the anti-aliased Snake, and a graph of
the whole vocoder; each against the eager torch output (relative L2).

    python benchmarks/acoustic_bench.py --out benchmarks/results/acoustic_h200.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from pathlib import Path

import torch
from bench_meta import tree_commit

from voicehub.models.gpt_sovits.bigvgan import load_bigvgan, make_bigvgan_folder
from voicehub.models.gpt_sovits.bigvgan.model import vocode
from voicehub.models.gpt_sovits.cfm.solver import solve
from voicehub.models.gpt_sovits.sovits import load_sovits_v3, make_sovits_checkpoint
from voicehub.runtime.cuda_graphs import BucketedGraphRunner

HOP_S = 256 / 24000  # seconds of audio per mel frame


def bench(fn, warmups: int, reps: int) -> float:
    """Median ms of fn() (CUDA events on the GPU; a CPU run is only a smoke test of the script)."""
    for _ in range(warmups):
        fn()
    times = []
    for _ in range(reps):
        if not torch.cuda.is_available():
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm())


def graphed(fn, dev):
    runner = BucketedGraphRunner(lambda _: fn(), ["only"], "full" if dev.type == "cuda" else "off", dev)
    runner.capture_at_load()
    return lambda: runner.run("only")


def _cfm_case(est, mu, prompt, noise, steps: int, dev, args) -> dict:
    row: dict = {}
    try:
        ref = solve(est, mu, prompt, noise, steps)
        row["eager_ms"] = bench(lambda: solve(est, mu, prompt, noise, steps), args.warmups, args.reps)
        out = torch.empty_like(ref)
        run = graphed(lambda: out.copy_(solve(est, mu, prompt, noise, steps)), dev)
        row["graph_ms"] = bench(run, args.warmups, args.reps)
        run()
        row["graph_rel_l2"] = rel_l2(out, ref)
    except Exception:
        row["error"] = traceback.format_exc(limit=3)
    return row


def _vocoder_case(vocoder, kernel, mel, ref, dev, args) -> dict:
    row: dict = {}
    audio_s = mel.shape[-1] * HOP_S
    try:
        vocoder.set_activation_kernel(kernel)
        out = vocode(vocoder, mel)
        row["rel_l2_vs_torch"] = rel_l2(out, ref)
        row["eager_ms"] = bench(lambda: vocode(vocoder, mel), args.warmups, args.reps)
        row["eager_ms_per_audio_s"] = row["eager_ms"] / audio_s
        buf = torch.empty_like(out)
        run = graphed(lambda: buf.copy_(vocode(vocoder, mel)), dev)
        row["graph_ms"] = bench(run, args.warmups, args.reps)
        row["graph_ms_per_audio_s"] = row["graph_ms"] / audio_s
        run()
        row["graph_rel_l2_vs_torch"] = rel_l2(buf, ref)
    except Exception:
        row["error"] = traceback.format_exc(limit=3)
    return row


def cfm_rows(model, dev, dtype, args) -> list[dict]:
    est = model.cfm.estimator
    text_dim = est.input_embed.proj.in_features - 2 * 100  # proj reads [x, prompt, text]: 100 mels each
    rows = []
    for n_frames, n_prompt in ((281, 0), (562, 281)):
        gen = torch.Generator(device=dev).manual_seed(0)
        mu = torch.randn(1, n_frames, text_dim, device=dev, dtype=dtype, generator=gen)
        prompt = torch.randn(1, 100, n_prompt, device=dev, dtype=dtype, generator=gen)
        noise = torch.randn(1, 100, n_frames, device=dev, dtype=dtype, generator=gen)
        for steps in (4, 8, 32):
            row = {"n_frames": n_frames, "prompt_frames": n_prompt, "steps": steps}
            row.update(_cfm_case(est, mu, prompt, noise, steps, dev, args))
            rows.append(row)
            print("cfm", row, flush=True)
    return rows


def bigvgan_rows(vocoder, dev, dtype, args) -> list[dict]:
    from voicehub.models.gpt_sovits.bigvgan.activation import anti_alias_snake_torch
    from voicehub.runtime.kernels import registry

    backends = {"torch_reference": anti_alias_snake_torch}
    for backend in registry.backends(registry.ANTI_ALIAS_SNAKE):
        reason = registry.available(registry.ANTI_ALIAS_SNAKE, backend, dev)
        if reason is None:
            backends[f"kernel_{backend.value}"] = registry.get(registry.ANTI_ALIAS_SNAKE, backend)
        else:
            print(f"bigvgan kernel {backend.value} skipped: {reason}")
    rows = []
    for n_mel in (70, 128, 298, 598):
        mel = torch.randn(
            1, 100, n_mel, device=dev, dtype=dtype, generator=torch.Generator(dev).manual_seed(n_mel)
        )
        audio_s = n_mel * HOP_S
        vocoder.set_activation_kernel(anti_alias_snake_torch)
        ref = vocode(vocoder, mel)
        for name, kernel in backends.items():
            row = {"n_mel": n_mel, "audio_s": audio_s, "activation": name}
            row.update(_vocoder_case(vocoder, kernel, mel, ref, dev, args))
            rows.append(row)
            print("bigvgan", row, flush=True)
    vocoder.set_activation_kernel(anti_alias_snake_torch)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="float16")
    p.add_argument("--warmups", type=int, default=3)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--parts", default="cfm,bigvgan")
    p.add_argument("--size", default="full", help="full; tiny with --device cpu smoke-tests the script")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    dev, dtype = torch.device(args.device), getattr(torch, args.dtype)
    result: dict = {}
    if "cfm" in args.parts:
        path = make_sovits_checkpoint(f"/tmp/s2v3_{args.size}.pth", args.size, seed=0)
        model = load_sovits_v3(path).to(dev, dtype).eval()
        result["cfm"] = cfm_rows(model, dev, dtype, args)
        del model
    if "bigvgan" in args.parts:
        folder = make_bigvgan_folder(f"/tmp/bigvgan_{args.size}", args.size, seed=0)
        vocoder = load_bigvgan(folder).to(dev, dtype).eval()
        result["bigvgan"] = bigvgan_rows(vocoder, dev, dtype, args)
    rev = tree_commit()
    result["meta"] = {
        "benchmark": "acoustic_cfm_bigvgan",
        "machine": {
            "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else None,
            "platform": platform.platform(),
        },
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
                     "voicehub_commit": rev or None},
        "precision": args.dtype,
        "sizes": "full-size random SoVITS v3 (DiT 1024 wide) and bigvgan_v2_24khz_100band_256x, batch 1",
        "warmups": args.warmups,
        "repetitions": args.reps,
        "timing": "CUDA events, median",
        "command": " ".join(["python", *sys.argv]),
    }  # fmt: skip
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    with torch.inference_mode():
        main()
