"""What a never-seen length costs each eager acoustic stage, with cuDNN and without (issues 4 and 7).

The per-sentence path and the stream engine's batched encoder run the SoVITS encoder, the CFM's DiT
and BigVGAN eagerly at shapes no graph holds; HuBERT runs eagerly at each reference's length (a voice's
first request, and the load's default voice). `dit_length_probe.py` found that a new length's cost is
cuDNN building per-shape plans (~27 ms of host time per convolution, ~2 ms per cuDNN attention), not
GPU work. This probe times, on full-size random v3 weights in fp16, each stage at lengths never seen
before (first call, then the same length again) in three modes: cuDNN as it is; cuDNN off process-wide
(`torch.backends.cudnn.flags(enabled=False)`: ATen's own convolutions, the DiT's attention by
flash/efficient SDPA); and the runtime's `aten_convolutions` (this thread's 1-d convolutions without
cuDNN, attention as it is). Then each stage's warm GPU time at one length (CUDA events) in each mode
and the relative L2 of each mode's output against cuDNN's. Prints a table, writes JSON. Run on the GPU machine:

    python benchmarks/conv_plan_probe.py --out $OUT/conv_plan_probe_h200.json
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import sys
from collections.abc import Callable

import torch
from bench_meta import event_ms, host_ms, tree_commit

from voicehub.models.gpt_sovits.bigvgan import load_bigvgan, make_bigvgan_folder
from voicehub.models.gpt_sovits.optimization import DIT_OPS, dit_kernels
from voicehub.models.gpt_sovits.sovits import load_sovits_v3, make_sovits_checkpoint
from voicehub.models.gpt_sovits.ssl import HUBERT_FRAME_SAMPLES, HubertEncoder, make_hubert_folder
from voicehub.runtime.eager_conv import aten_convolutions
from voicehub.runtime.kernels import registry

MODES = ("cudnn", "no_cudnn", "aten_convs")


@contextlib.contextmanager
def mode(name: str):
    """cuDNN as configured; off for convolutions and attention both (process-wide flags); or the
    runtime's `aten_convolutions` (this thread's 1-d convolutions without cuDNN, attention as it is)."""
    if name == "cudnn":
        yield
        return
    if name == "aten_convs":
        with aten_convolutions("cuda"):
            yield
        return
    sdp = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        with torch.backends.cudnn.flags(enabled=False):
            yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(sdp)


def stages(dev: torch.device) -> dict[str, tuple[Callable[[int], Callable[[], torch.Tensor]], int, int]]:
    """name -> (inputs of length n -> call, first probed length, warm length); lengths per stage's unit.
    Each model is built (full size, fp16, outside inference mode) on its stage's first call, so `--stages`
    builds only its own."""
    g = torch.Generator(device=dev).manual_seed(0)

    @functools.cache
    @torch.inference_mode(False)
    def sovits():
        model = (
            load_sovits_v3(make_sovits_checkpoint("/tmp/s2v3_full.pth", "full", seed=0)).to(dev).half().eval()
        )
        model.cfm.estimator.set_kernels(
            dit_kernels({op: registry.resolve(op, "triton", "cuda") for op in DIT_OPS})
        )
        ge = torch.randn(1, model.arch.gin_channels, 1, device=dev, generator=g).half()
        return model, model.arch, ge

    @functools.cache
    @torch.inference_mode(False)
    def vocoder():
        return load_bigvgan(make_bigvgan_folder("/tmp/bigvgan_full", "full", seed=0)).to(dev).half().eval()

    @functools.cache
    @torch.inference_mode(False)
    def hubert():
        return HubertEncoder.from_folder(
            make_hubert_folder("/tmp/hubert_full", "full", seed=0), dev, torch.float16
        )

    def encoder(n: int):  # n semantic tokens, 2n phonemes (a sentence's ratio, roughly)
        model, a, ge = sovits()
        codes = torch.randint(0, a.n_bins, (1, 1, n), device=dev, generator=g)
        text = torch.randint(1, a.n_symbols, (1, 2 * n // 3), device=dev, generator=g)
        return lambda: model.decode_encp(codes, text, ge)

    def dit_call(n: int):  # n mel frames, batch 2 (guidance), no mask
        model, a, _ = sovits()
        dit = model.cfm.estimator
        x, cond = (torch.randn(2, n, a.mel_dim, device=dev, generator=g).half() for _ in range(2))
        mu = torch.randn(2, n, a.inter2, device=dev, generator=g).half()
        t, d = (torch.rand(2, device=dev, generator=g).half() for _ in range(2))

        def run():
            text_emb, d_emb = dit.condition(mu, d, None)
            return dit(x, cond, text_emb, t, d_emb, None)

        return run

    def bigvgan(n: int):  # n mel frames
        mel = torch.randn(1, sovits()[1].mel_dim, n, device=dev, generator=g).half()
        return lambda: vocoder()(mel)

    def hubert_call(n: int):  # n output frames of 16 kHz audio (a reference: ~50 frames a second)
        wav = torch.randn(n * HUBERT_FRAME_SAMPLES + 80, device=dev, generator=g).half() * 0.1
        return lambda: hubert()(wav, pad_samples=0)

    return {"sovits_encoder": (encoder, 61, 150), "dit": (dit_call, 301, 562), "bigvgan": (bigvgan, 131, 298),
            "hubert": (hubert_call, 251, 300)}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated, cudnn first (default: all)")
    p.add_argument("--stages", default="", help="comma-separated stages to probe (default: all)")
    args = p.parse_args()
    modes = tuple(args.modes.split(","))
    if modes[0] != "cudnn" or not set(modes) <= set(MODES):
        p.error(f"--modes: cudnn first, then any of {MODES}")
    torch.manual_seed(0)
    dev = torch.device("cuda")
    probed = stages(dev)
    if args.stages:
        unknown = set(args.stages.split(",")) - set(probed)
        if unknown:
            p.error(f"--stages: unknown {sorted(unknown)}; known: {sorted(probed)}")
        probed = {k: v for k, v in probed.items() if k in args.stages.split(",")}
    rows, warm = [], []
    with torch.inference_mode():
        for name, (make, first_len, warm_len) in probed.items():
            n = first_len
            for m in modes:
                with mode(m):
                    make(warm_len)()  # this mode's first use at some length out of the figures
                    for _ in range(3):
                        call = make(n)
                        first, again = host_ms(call), host_ms(call)
                        rows.append(dict(stage=name, mode=m, length=n, first_ms=first, again_ms=again))
                        print(
                            f"{name:15} {m:9} n={n:4} first {first:8.1f} ms  again {again:7.1f} ms",
                            flush=True,
                        )
                        n += 7
            call = make(warm_len)
            outs = {}
            for m in modes:
                with mode(m):
                    outs[m] = call().float()
                    ms = event_ms(call, 3, 10)
                warm.append(dict(stage=name, mode=m, length=warm_len, gpu_ms=ms))
                print(f"{name:15} {m:9} n={warm_len:4} warm GPU {ms:7.2f} ms", flush=True)
            for row in warm[len(warm) - len(modes) + 1 :]:
                ref, other = outs["cudnn"], outs[row["mode"]]
                row["rel_l2_vs_cudnn"] = float((other - ref).norm() / ref.norm().clamp_min(1e-12))
                print(f"{name:15} {row['mode']:9} rel L2 vs cudnn {row['rel_l2_vs_cudnn']:.2e}", flush=True)
    meta = dict(
        benchmark="conv_plan_probe", machine=torch.cuda.get_device_name(), platform=platform.platform(),
        versions=dict(python=platform.python_version(), torch=torch.__version__, cuda=torch.version.cuda,
                      cudnn=torch.backends.cudnn.version(), voicehub_commit=tree_commit() or None),
        precision="float16", stages=list(probed), sizes="full-size random SoVITS v3 (encoder, DiT with the triton "
        "kernel set, batch 2), BigVGAN v2 24 kHz 100-band and chinese-hubert-base, batch 1 (those of the stages "
        "probed; the bigvgan stage also reads SoVITS v3's mel size)", warmups="1 call a mode before its new lengths; "
        "3 before the warm GPU time", repetitions="new lengths: 1 first + 1 again; warm GPU: 10, median",
        command=" ".join(["python", *sys.argv]),
        env={k: v for k, v in os.environ.items() if k.startswith("TORCH_CUDNN")},  # e.g. the v7 API switch
    )  # fmt: skip
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, new_lengths=rows, warm=warm), f, indent=1)


if __name__ == "__main__":
    main()
