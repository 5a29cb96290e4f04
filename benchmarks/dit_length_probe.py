"""Why a new sentence length costs the per-sentence path 0.35-1.5 s with the fused DiT ops (issue 4).

The streamed path replays CUDA graphs of fixed frame buckets; the per-sentence path runs the CFM's DiT
eagerly at each sentence's own length. With `kernel_backend="triton"` the first request of a new
length paid 0.35-1.5 s on the H200 (benchmarks/results/README.md), with native DiT code none. This
probe times one eager DiT forward (full-size v3 DiT, random weights, fp16, batch 2 as with guidance,
no mask) at lengths never seen before, twice each, for native / torch / triton DiT kernel sets, with
cuDNN SDPA on and off, and profiles one new-length call of the triton set (host ops sorted by time),
then writes a JSON and prints a table. Run on the GPU machine:

    python benchmarks/dit_length_probe.py --out $OUT/dit_length_probe_h200.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch

from voicehub.models.gpt_sovits.cfm.dit import NATIVE_KERNELS, DiT
from voicehub.models.gpt_sovits.optimization import DIT_OPS, dit_kernels
from voicehub.runtime.kernels import registry

FULL = dict(dim=1024, depth=22, heads=16, dim_head=64, ff_mult=2, mel_dim=100, text_dim=512, n_conv_layers=4)


def forward_ms(dit: DiT, n: int, generator: torch.Generator) -> float:
    """One eager forward at n frames (condition + estimator), synced, in ms."""
    b = 2
    x, cond = (torch.randn(b, n, 100, device="cuda", generator=generator).half() for _ in range(2))
    mu = torch.randn(b, n, 512, device="cuda", generator=generator).half()
    t = torch.rand(b, device="cuda", generator=generator).half()
    d = torch.rand(b, device="cuda", generator=generator).half()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    text_emb, d_emb = dit.condition(mu, d, None)
    dit(x, cond, text_emb, t, d_emb, None)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.manual_seed(0)
    with torch.device("cuda"):
        dit = DiT(**FULL)
    dit = dit.half().eval()
    sets = {
        "native": NATIVE_KERNELS,
        "torch": dit_kernels({op: registry.resolve(op, "torch", "cuda") for op in DIT_OPS}),
        "triton": dit_kernels({op: registry.resolve(op, "triton", "cuda") for op in DIT_OPS}),
    }
    g = torch.Generator(device="cuda").manual_seed(1)
    rows, next_len = [], 301  # every probe a length not seen before in this process, then the same again
    with torch.inference_mode():
        forward_ms(dit, 256, g)  # process-wide first use (cuBLAS handles, kernel loads) out of the figures
        for cudnn in (True, False):
            torch.backends.cuda.enable_cudnn_sdp(cudnn)
            for name, kernels in sets.items():
                dit.set_kernels(kernels)
                forward_ms(dit, 256, g)  # this set's first use at a seen length
                for _ in range(2):
                    n, next_len = next_len, next_len + 7
                    first, again = forward_ms(dit, n, g), forward_ms(dit, n, g)
                    rows.append(
                        dict(kernels=name, cudnn_sdp=cudnn, n_frames=n, first_ms=first, again_ms=again)
                    )
                    print(
                        f"{name:7} cudnn_sdp={cudnn!s:5} n={n:4} first {first:8.1f} ms  again {again:7.1f} ms",
                        flush=True,
                    )
        torch.backends.cuda.enable_cudnn_sdp(True)
        dit.set_kernels(sets["triton"])
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            forward_ms(dit, next_len, g)
        table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=15)
        print(table, flush=True)
        dit.set_kernels(NATIVE_KERNELS)
    meta = dict(
        benchmark="dit_length_probe", machine=torch.cuda.get_device_name(), platform=platform.platform(),
        versions=dict(torch=torch.__version__, cuda=torch.version.cuda), precision="float16",
        sizes="v3 DiT full size (22 blocks, dim 1024, 16 heads), batch 2, no mask", warmups=1, repetitions=1,
        command="python benchmarks/dit_length_probe.py --out OUT",
    )  # fmt: skip
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, rows=rows, profile_triton_new_length=table), f, indent=1)


if __name__ == "__main__":
    main()
