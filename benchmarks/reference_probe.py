"""What a new voice's reference costs at a length never seen, its convolutions through ATen or cuDNN (issue 4).

`Pipeline._compute_reference` (resampling, spectrogram and log-mel, HuBERT, the SoVITS quantizer, the
style and SoVITS encoders, BERT of the transcript) runs once per voice, at that voice's length: at load
for the default voice and at a new voice's first request. It routes its convolutions through ATen on CUDA
(`runtime/eager_conv.aten_convolutions`); mode `cudnn` here puts cuDNN back for the probe. Each mode
computes references of synthetic speech-like clips at lengths never seen (first call, then the same clip
again), in blocks ordered aten, cudnn, cudnn, aten, after one unrecorded reference per mode. Prints a
table, writes JSON. On the GPU machine:

    python benchmarks/reference_probe.py --out $OUT/reference_probe.json [--size full]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys
import tempfile
from pathlib import Path

import torch
from bench_meta import host_ms, tree_commit
from e2e_bench import write_reference

from voicehub.models.gpt_sovits import Voice, load
from voicehub.models.gpt_sovits import pipeline as pipeline_module
from voicehub.models.gpt_sovits.make_checkpoint import make_checkpoint_set
from voicehub.text.options import Language

PROMPT = "Hello there, this is my voice."
FIRST_SECONDS, STEP_SECONDS, PER_MODE = 4.0, 0.173, 2
MODE_ORDER = ("aten", "cudnn", "cudnn", "aten")  # ABBA: neither mode always gets the longer clips
WARM_SECONDS = {"aten": 3.5, "cudnn": 3.6}  # each mode's first use, at lengths out of the rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--size", default="tiny", choices=("tiny", "full"), help="random v3 set made here")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--device", default="cuda", help="cuda (cpu only to try the script: no cuDNN there)")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="reference_probe_"))
    make_checkpoint_set(work / "set", args.size, seed=0, margin_tokens=0)
    pipe = load(work / "set", device=args.device, dtype=args.dtype).pipeline
    pipe.reference(Voice(write_reference(work / "warm.wav", 5.0), PROMPT, "en"))  # the process's first use
    rows, seconds = [], FIRST_SECONDS

    def timed(clip: Path) -> float:
        return host_ms(lambda: pipe._compute_reference(clip, PROMPT, Language.EN))

    for block, mode in enumerate(MODE_ORDER):
        saved = pipeline_module.aten_convolutions
        if mode == "cudnn":
            pipeline_module.aten_convolutions = lambda device: contextlib.nullcontext()
        try:
            if mode not in MODE_ORDER[:block]:  # the mode's own first use, at a length out of the rows
                timed(write_reference(work / f"warm_{mode}.wav", WARM_SECONDS[mode]))
            for _ in range(PER_MODE):
                seconds += STEP_SECONDS
                clip = write_reference(work / f"ref_{seconds:.3f}.wav", seconds)
                first, again = timed(clip), timed(clip)  # first at this length, then again
                rows.append(dict(mode=mode, seconds=round(seconds, 3), first_ms=first, again_ms=again))
                print(f"{mode:6} {seconds:6.3f} s  first {first:7.1f} ms  again {again:7.1f} ms", flush=True)
        finally:
            pipeline_module.aten_convolutions = saved
    meta = dict(
        benchmark="reference_probe", machine=torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor(), platform=platform.platform(),
        versions=dict(python=platform.python_version(), torch=torch.__version__, cuda=torch.version.cuda,
                      cudnn=torch.backends.cudnn.version(), voicehub_commit=tree_commit() or None),
        precision=args.dtype, sizes=f"make_checkpoint_set size={args.size}, batch 1, clips {FIRST_SECONDS + STEP_SECONDS:.2f}"
        f"-{seconds:.2f} s at 24 kHz", warmups="one reference (5 s) before the rows, one more per mode (3.5 / 3.6 s) before its first block",
        repetitions=f"{PER_MODE} new lengths per mode block, 2 blocks a mode, order aten cudnn cudnn aten; first + again each",
        command=" ".join(["python", *sys.argv]),
    )  # fmt: skip
    Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))


if __name__ == "__main__":
    main()
