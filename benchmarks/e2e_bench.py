"""GPT-SoVITS v3 end to end: time to first audio, first request, process start, peak GPU memory.

Full-size random v3 weights (`make_checkpoint_set`, ~4 GB, written once under --set-dir and reused),
fp16, one voice, batch 1, the issue-4 fast preset: punctuation cut, 4 CFM steps, top_k 5,
temperature 0.6, fixed seed. Random weights never sample EOS, so every sentence decodes exactly
force_n_tokens = max(MIN_TOKENS, round(TOKENS_PER_CHAR * characters)): about the 25 Hz token rate
of speech read at ~17 characters per second. Each text is one sentence under the punctuation cut.
Streaming modes (--windows): `windowN` (stream_chunk_tokens N: true streaming, the first chunk leaves
once the first N tokens are decoded and through SoVITS, the CFM and the vocoder, on the eager path
step by step and on the graph decoder through `decode_iter`; first audio should not grow with the
text's length) and `sentence` (stream_chunk_tokens None: the first chunk is the whole sentence, the
reference path, shown for contrast). The first request and the subprocess use the first window given.

Profiles, in this order in one process: `off` (eager reference), `full` (every decode bucket
captured at load), `triton` (`full` + `optimize(kernel_backend="triton")`). Per profile: load time
(the voice is the model's default_voice, so loading warms it up: text frontend, reference features,
on CUDA one sentence through both paths; `warm_up` in the JSON), the peak GPU memory after load, the
first request after load (what the warm-up left to pay), the first request with a voice never seen (its
reference computed), then per mode and text the first run (a text length never seen) and the warm time
to the first AudioChunk of `model.stream` (median of --reps after --warmups), where the short text's
first chunk spends its time (`first_chunk_stages`: one more request, synced per stage: text frontend,
T2S prefill, the first window's decode steps, SoVITS encoder, CFM, vocoder; the graph profiles replay the CFM and vocoder from
acoustic graphs), and the peak GPU memory over the whole profile. A later profile shares process-wide caches (cuBLAS handles, cuDNN plans, the
frontend's dictionaries) with earlier ones; the clean cold figure is the subprocess one: process start
to first audio of a request naming its voice (no default voice, no chain warm-up), in a fresh
interpreter, with empty Triton/Inductor/CUDA caches (fresh temp dirs), then again with the same caches
(warm). Every part is wrapped: a failure prints its error and the rest goes on.

    python benchmarks/e2e_bench.py --out benchmarks/results/e2e_h200.json
    python benchmarks/e2e_bench.py --device cpu --size tiny --warmups 0 --reps 1 --out /tmp/e2e_cpu.json  # smoke, ~2 min
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import torch
from bench_meta import tree_commit
from e2e_measure import (
    FAST,
    MIN_TOKENS,
    PRESET,
    PROMPT_TEXT,
    SEED,
    TEXTS,
    TOKENS_PER_CHAR,
    first_audio,
    first_chunk_stages,
    load_profile,
    memory,
    n_tokens,
    write_reference,
)
from e2e_report import derived, table
from e2e_startup import KINDS, child, startup

# graph presets; triton = full + Triton kernels, triton_minimal = minimal + Triton kernels
PROFILES = ("off", "full", "minimal", "lazy", "triton", "triton_minimal")


def ensure_set(set_dir: Path, size: str) -> tuple[Path, float]:
    """The make-checkpoint set under set_dir (made once; `.complete` marks a finished one); seconds spent."""
    from voicehub.models.gpt_sovits.make_checkpoint import make_checkpoint_set

    t0 = time.perf_counter()
    if not (set_dir / ".complete").exists():
        make_checkpoint_set(set_dir, size, seed=0, margin_tokens=0)
        (set_dir / ".complete").touch()
    return set_dir, time.perf_counter() - t0


def text_stats(model, voice, text: str, window: int | None, args) -> dict:
    """First audio of one text: its first run (this text length never seen in this mode; it counts as
    the first of --warmups), the other warm-ups unmeasured, then the median of --reps (warm)."""
    first_run = first_audio(model, voice, text, args.device, window)["first_audio_ms"]
    for _ in range(args.warmups - 1):
        first_audio(model, voice, text, args.device, window)
    runs = [first_audio(model, voice, text, args.device, window) for _ in range(args.reps)]
    times = sorted(r["first_audio_ms"] for r in runs)
    return {
        "median_ms": times[len(times) // 2],
        "min_ms": times[0],
        "runs_ms": [r["first_audio_ms"] for r in runs],
        "first_run_ms": first_run,
        "chunk_audio_s": runs[0]["chunk_audio_s"],
    }


def window_name(window: int | None) -> str:
    return "sentence" if window is None else f"window{window}"


def run_profile(profile: str, set_dir: Path, voices: tuple, args) -> dict:
    """Load (warming up `voices[0]`), first requests, first audio per mode and text, peak memory."""
    voice, new_voice = voices
    row: dict = {"profile": profile}
    model = None
    try:
        gc.collect()
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            # what earlier profiles of this process still hold: the peaks below include it
            row["allocated_before_load_gib"] = torch.cuda.memory_allocated() / 2**30
        t0 = time.perf_counter()
        model, manifest = load_profile(set_dir, args.device, args.dtype, profile, voice=voice)
        row["load_s"] = time.perf_counter() - t0
        row["memory_after_load"] = memory(args.device)  # weights + graphs + the warm-up's peak
        row["optimization"] = manifest
        row["describe"] = model.describe()
        row["warm_up"] = row["describe"].get("warm_up")
        short = TEXTS["short"]
        row["first_request"] = first_audio(model, voice, short, args.device, args.stream_window)
        row["first_request_new_voice"] = first_audio(model, new_voice, short, args.device, args.stream_window)
        row["first_audio"] = {}
        for window in args.windows:
            mode = window_name(window)
            row["first_audio"][mode] = {}
            for name, text in TEXTS.items():
                row["first_audio"][mode][name] = text_stats(model, voice, text, window, args)
        if args.stream_window is not None:
            try:
                row["first_chunk_stages"] = first_chunk_stages(
                    model, voice, TEXTS["short"], args.device, args.stream_window
                )
            except Exception:  # the breakdown is extra: the timed figures stand without it
                row["first_chunk_stages"] = {"error": traceback.format_exc(limit=4)}
        row["memory"] = memory(args.device)
    except Exception as err:  # one profile failing must not stop the others
        print(f"profile {profile} failed: {err!r}", flush=True)
        row["error"] = traceback.format_exc(limit=4)
    finally:
        del model
        gc.collect()
    print(
        "profile",
        json.dumps({k: v for k, v in row.items() if k not in ("describe", "optimization")}, default=str),
        flush=True,
    )
    return row


def meta(args, set_seconds: float) -> dict:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    rev = tree_commit()
    cuda = args.device.startswith("cuda")
    return {
        "benchmark": "gpt_sovits_v3_end_to_end",
        "machine": {"gpu": torch.cuda.get_device_name() if cuda else None,
                    "gpu_memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda else None,
                    "platform": platform.platform(),
                    "cpu_count": os.cpu_count()},
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
                     "triton": triton_version, "voicehub_commit": rev or None},
        "precision": args.dtype,
        "sizes": f"make_checkpoint_set size={args.size} (full: real v3 T2S, SoVITS v3, HuBERT base, "
                 "RoBERTa-large BERT, BigVGAN v2 24 kHz 100-band), batch 1, one voice",
        "set_seconds": set_seconds,
        "workload": {"preset": PRESET, "params": FAST, "seed": SEED, "texts": TEXTS, "chars": {k: len(v) for k, v in TEXTS.items()},
                     "force_n_tokens": {k: n_tokens(v) for k, v in TEXTS.items()},
                     "tokens_rule": f"max({MIN_TOKENS}, round({TOKENS_PER_CHAR} * chars)): EOS never comes "
                                    "from random weights", "reference": "5 s synthetic voiced signal"},
        "warmups": args.warmups,
        "repetitions": args.reps,
        "timing": "host wall clock (perf_counter) from model.stream() to the first AudioChunk, median",
        "voice": "the model's default_voice (warmed up at load); first_request_new_voice: a second synthetic "
                 "reference (another pitch), never seen",
        "command": " ".join(["python", *sys.argv]),
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--size", default="full", help="full; tiny with --device cpu smoke-tests the script")
    p.add_argument("--dtype", default=None, help="default: float16 on CUDA, float32 on the CPU")
    p.add_argument("--warmups", type=int, default=1)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument(
        "--profiles", default=None, help=f"comma list of {PROFILES}, or none; default all (cpu: off,triton)"
    )
    p.add_argument(
        "--startup-profiles",
        default=None,
        help="comma list; default: triton,triton_minimal on CUDA (full if not applicable), off on CPU",
    )
    p.add_argument("--windows", dest="windows_arg", default="25,12,none",
                   help="stream_chunk_tokens values to time, comma list (the first number: the first requests "
                        "and the subprocess); none: one chunk per sentence")  # fmt: skip
    p.add_argument("--skip-startup", action="store_true")
    p.add_argument("--startup-kinds", default="cold,warm", help="cold,warm (own empty caches, then them) or "
                   "warm_shared (one child on this process's caches, filled by the profiles before it); warm_profiled: "
                   "a warm child whose load runs under cProfile (its top functions in load_profile)")  # fmt: skip
    p.add_argument("--profile-load", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--set-dir", type=Path, default=None, help="default: /tmp/gpt_sovits_v3_<size>")
    p.add_argument("--child-timeout", type=float, default=120.0)
    p.add_argument("--out", type=Path)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--reference", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    cuda = args.device.startswith("cuda")
    args.dtype = args.dtype or ("float16" if cuda else "float32")
    args.windows = [None if w == "none" else int(w) for w in args.windows_arg.split(",")]
    args.startup_kinds = tuple(args.startup_kinds.split(","))
    if not set(args.startup_kinds) <= set(KINDS) or (
        "warm_shared" in args.startup_kinds and len(args.startup_kinds) > 1
    ):
        raise SystemExit(
            f"--startup-kinds: cold,warm[,warm_profiled] or warm_shared, got {','.join(args.startup_kinds)}"
        )
    args.stream_window = next((w for w in args.windows if w is not None), None)
    if args.child:
        child(args)
        return
    from voicehub.models.gpt_sovits import Voice

    set_dir, set_seconds = ensure_set(args.set_dir or Path(f"/tmp/gpt_sovits_v3_{args.size}"), args.size)
    reference = write_reference(set_dir / "bench_ref.wav")
    voice = Voice(reference, PROMPT_TEXT, "en")
    new_voice = Voice(write_reference(set_dir / "bench_ref_2.wav", pitch_hz=190.0), PROMPT_TEXT, "en")
    profiles = (args.profiles or ("off,full,triton" if cuda else "off,triton")).split(",")
    profiles = [] if profiles == ["none"] else profiles  # process start only
    unknown = sorted(set(profiles) - set(PROFILES))
    if unknown:
        raise SystemExit(f"unknown profile(s) {unknown}; valid: {', '.join(PROFILES)}")
    result: dict = {"meta": meta(args, set_seconds), "profiles": []}
    # No inference_mode around the model: the bench calls it as a user would.
    for profile in profiles:
        result["profiles"].append(run_profile(profile, set_dir, (voice, new_voice), args))
    result["derived"] = derived(result["profiles"], window_name(args.stream_window))
    if not args.skip_startup:
        names = (args.startup_profiles or ("triton,triton_minimal" if cuda else "off")).split(",")
        result["startups"] = [startup(name, set_dir, reference, args) for name in names]
    print(table(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
