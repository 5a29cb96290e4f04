"""CFM (DiT flow matching) and BigVGAN on the GPU: eager vs graphs vs kernels, exactness and speed.

Full-size random v3 weights made here by make_sovits_checkpoint / make_bigvgan_folder, fp16.
CFM: `solve` for N mel frames (281 = 3 s alone; 562 = 3 s reference prompt + 3 s chunk) at
4/8/32 steps, eager and replayed as one CUDA graph. CFM kernels (part `cfm_kernels`): the first
streamed chunk's masked 4-step solve (N = 576/640 with a 5 s, 468-frame prompt, as the acoustic
graphs run it) replayed as one graph with the DiT's native block code and with the kernel
registry's torch and triton DiT kernel sets (`DiT.set_kernels`), each against native. BigVGAN: mel lengths 70/128/298/598 with
the torch activation, each registered kernel backend of the anti-aliased Snake, and a graph of
the whole vocoder; each against the eager torch output (relative L2).

    python benchmarks/acoustic_bench.py --out benchmarks/results/acoustic_h200.json
    python benchmarks/acoustic_bench.py --parts cfm_kernels --out benchmarks/results/cfm_kernels_h200.json
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
from bench_meta import event_ms, tree_commit

from voicehub.models.gpt_sovits.bigvgan import load_bigvgan, make_bigvgan_folder
from voicehub.models.gpt_sovits.bigvgan.model import vocode
from voicehub.models.gpt_sovits.cfm.dit import NATIVE_KERNELS
from voicehub.models.gpt_sovits.cfm.solver import solve, solve_padded
from voicehub.models.gpt_sovits.optimization import DIT_OPS, dit_kernels
from voicehub.models.gpt_sovits.sovits import load_sovits_v3, make_sovits_checkpoint
from voicehub.runtime.cuda_graphs import BucketedGraphRunner
from voicehub.runtime.kernels import registry

HOP_S = 256 / 24000  # seconds of audio per mel frame
FIRST_CHUNK_FRAMES = (576, 640)  # the first streamed CFM piece: 5 s prompt + context + new frames
PROMPT_FRAMES = 468  # T_REF: the prompt of every reference of 5 s or more


def bench(fn, warmups: int, reps: int) -> float:
    """Median ms of fn() (CUDA events on the GPU; a CPU run is only a smoke test of the script)."""
    if torch.cuda.is_available():
        return event_ms(fn, warmups, reps)
    for _ in range(warmups):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
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


def dit_kernel_sets(dev) -> dict:
    """native plus each registry backend whose DiT ops run here (the rest said and skipped)."""
    sets = {"native": NATIVE_KERNELS}
    for backend in ("torch", "triton"):
        reasons = [r for op in DIT_OPS if (r := registry.available(op, backend, dev)) is not None]
        if reasons:
            print(f"cfm kernels {backend} skipped: {reasons[0]}")
            continue
        sets[backend] = dit_kernels({op: registry.get(op, backend) for op in DIT_OPS})
    return sets


def kernels_per_call(fn, dev) -> int | None:
    """GPU kernels one eager call launches (torch profiler); None off CUDA."""
    if dev.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def _first_chunk(est, n: int, dev, dtype) -> tuple:
    """solve_padded's inputs for one row of n frames behind a PROMPT_FRAMES prompt, every frame valid."""
    text_dim = est.input_embed.proj.in_features - 2 * 100
    gen = torch.Generator(device=dev).manual_seed(n)
    mu = torch.randn(1, n, text_dim, device=dev, dtype=dtype, generator=gen)
    noise = torch.randn(1, 100, n, device=dev, dtype=dtype, generator=gen)
    prompt_x = torch.zeros_like(noise)
    prompt_x[..., :PROMPT_FRAMES] = torch.randn(1, 100, PROMPT_FRAMES, device=dev, dtype=dtype, generator=gen)
    keep = torch.ones(1, 1, n, device=dev, dtype=dtype)
    keep[..., :PROMPT_FRAMES] = 0
    return mu, prompt_x, keep, noise, torch.ones(1, n, device=dev, dtype=torch.bool)


def _kernel_case(est, kernels, inputs: tuple, steps: int, dev, args) -> tuple[dict, torch.Tensor | None]:
    mu, prompt_x, keep, noise, mask = inputs
    row: dict = {}
    try:
        est.set_kernels(kernels)
        call = lambda: solve_padded(est, mu, prompt_x, keep, noise, steps, mask)  # noqa: E731
        eager = call()
        row["eager_ms"] = bench(call, args.warmups, args.reps)
        row["gpu_kernels_eager"] = kernels_per_call(call, dev)
        out = torch.empty_like(eager)
        run = graphed(lambda: out.copy_(call()), dev)
        row["graph_ms"] = bench(run, args.warmups, args.reps)
        run()
        row["graph_rel_l2_vs_own_eager"] = rel_l2(out, eager)
        return row, out.clone()
    except Exception:
        row["error"] = traceback.format_exc(limit=3)
        return row, None
    finally:
        est.set_kernels(NATIVE_KERNELS)


def cfm_kernel_rows(model, dev, dtype, args, steps: int = 4) -> list[dict]:
    """The first chunk's masked solve (one row, as CfmGraphs runs it) per DiT kernel set."""
    est = model.cfm.estimator
    sets = dit_kernel_sets(dev)
    rows = []
    for n in FIRST_CHUNK_FRAMES:
        inputs = _first_chunk(est, n, dev, dtype)
        native = None
        for name, kernels in sets.items():
            row = {"n_frames": n, "prompt_frames": PROMPT_FRAMES, "steps": steps, "kernels": name}
            case, out = _kernel_case(est, kernels, inputs, steps, dev, args)
            row.update(case)
            native = out if name == "native" else native
            if native is not None and out is not None:
                row["graph_rel_l2_vs_native"] = rel_l2(out, native)
            rows.append(row)
            print("cfm_kernels", row, flush=True)
    _print_kernel_table(rows)
    return rows


def _cell(row: dict, key: str, spec: str) -> str:
    return "-" if row.get(key) is None else format(row[key], spec)


def _print_kernel_table(rows: list[dict]) -> None:
    print(
        f"{'frames':>6} {'kernels':>8} {'graph ms':>9} {'eager ms':>9} {'GPU kernels':>11} {'rel L2 vs native':>17}"
    )
    for r in rows:
        print(f"{r['n_frames']:>6} {r['kernels']:>8} {_cell(r, 'graph_ms', '9.3f')} {_cell(r, 'eager_ms', '9.3f')} "
              f"{_cell(r, 'gpu_kernels_eager', '11d')} {_cell(r, 'graph_rel_l2_vs_native', '17.2e')}")  # fmt: skip


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
    p.add_argument("--parts", default="cfm,bigvgan", help="comma-separated: cfm, cfm_kernels, bigvgan")
    p.add_argument("--size", default="full", help="full; tiny with --device cpu smoke-tests the script")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    dev, dtype = torch.device(args.device), getattr(torch, args.dtype)
    result: dict = {}
    parts = set(args.parts.split(","))
    if parts & {"cfm", "cfm_kernels"}:
        path = make_sovits_checkpoint(f"/tmp/s2v3_{args.size}.pth", args.size, seed=0)
        model = load_sovits_v3(path).to(dev, dtype).eval()
        if "cfm" in parts:
            result["cfm"] = cfm_rows(model, dev, dtype, args)
        if "cfm_kernels" in parts:
            result["cfm_kernels"] = cfm_kernel_rows(model, dev, dtype, args)
        del model
    if "bigvgan" in parts:
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
