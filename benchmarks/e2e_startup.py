"""Process start to first audio, measured in fresh interpreters: the parent side (`startup`) runs
e2e_bench.py --child, whose `child` loads one profile, streams the first chunk and prints its wall-clock
stamps; with --profile-load the load runs under cProfile (`profile_top`)."""

from __future__ import annotations

import contextlib
import cProfile
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from e2e_measure import PROMPT_TEXT, TEXTS, first_audio, first_chunk_stages, load_profile, memory

KINDS = ("cold", "warm", "warm_profiled", "warm_shared")  # see `startup`
PROFILE_TOP = 45  # functions kept per ordering in a warm_profiled child's `load_profile`
CACHE_VARS = (
    "TRITON_CACHE_DIR",
    "TORCHINDUCTOR_CACHE_DIR",
    "CUDA_CACHE_PATH",
    "VOICEHUB_CACHE",
)  # cold: all empty
BENCH_SCRIPT = str(Path(__file__).with_name("e2e_bench.py"))  # the child is the bench script run with --child


def profile_top(profiler: cProfile.Profile) -> dict:
    """The load's profile: the PROFILE_TOP functions by cumulative and by own time, each [file:line(function),
    calls, own s, cumulative s]. On Python 3.12 cProfile sees every thread (the text thread's work too); it
    slows Python-heavy code: read it as shares."""
    stats = pstats.Stats(profiler)
    rows = [
        (f"{Path(f).name}:{line}({name})", calls, own, cum)
        for (f, line, name), (_, calls, own, cum, _) in stats.stats.items()  # type: ignore[attr-defined]
    ]
    rounded = lambda r: [r[0], r[1], round(r[2], 4), round(r[3], 4)]  # noqa: E731
    return {
        "by_cumulative": [rounded(r) for r in sorted(rows, key=lambda r: -r[3])[:PROFILE_TOP]],
        "by_own": [rounded(r) for r in sorted(rows, key=lambda r: -r[2])[:PROFILE_TOP]],
    }


def child(args) -> None:
    """The subprocess: load the set, stream the first chunk, print wall-clock stamps as one JSON line."""
    stamps = {"child_main": time.time()}
    from voicehub.models.gpt_sovits import Voice

    stamps["imported"] = time.time()
    # The voice is the model's default voice, warmed up at load, as a server configures it.
    voice = Voice(args.reference, PROMPT_TEXT, "en")
    profiler = cProfile.Profile() if args.profile_load else None
    with profiler or contextlib.nullcontext():
        model, manifest = load_profile(
            args.set_dir, args.device, args.dtype, args.child, strict=False, voice=voice
        )
    row: dict = {"optimization_error": manifest.get("error")} if manifest else {}
    stamps["loaded"] = time.time()
    if profiler is not None:
        row["load_profile"] = profile_top(profiler)
    row["warm_up"] = getattr(model, "warm_up_info", None)
    row.update(first_audio(model, voice, TEXTS["short"], args.device, args.stream_window))
    stamps["first_audio"] = time.time()
    # The same request again (after the stamps): the first request's cost over a warm one in a fresh
    # process (first execution of Python paths, GPU clocks after a CPU-bound load), and where it goes.
    row["second_request"] = first_audio(model, voice, TEXTS["short"], args.device, args.stream_window)
    if args.stream_window is not None:
        try:
            row["third_request_stages"] = first_chunk_stages(
                model, voice, TEXTS["short"], args.device, args.stream_window
            )
        except Exception:
            row["third_request_stages"] = {"error": traceback.format_exc(limit=4)}
    row.update(stamps=stamps, memory=memory(args.device))
    print("CHILD " + json.dumps(row), flush=True)


def startup(profile: str, set_dir: Path, reference: Path, args) -> dict:
    """Process start to first audio in fresh interpreters: empty kernel caches (cold), then the same caches
    (warm); with --startup-kinds warm_shared only, one child on this process's own on-disk caches, which
    the in-process profiles before it filled (warm without a cold run first)."""
    caches = Path(tempfile.mkdtemp(prefix="e2e_caches_"))
    shared = args.startup_kinds == ("warm_shared",)
    env = dict(os.environ) if shared else dict(os.environ, **{v: str(caches / v.lower()) for v in CACHE_VARS})
    cmd = [sys.executable, BENCH_SCRIPT, "--child", profile, "--set-dir", str(set_dir), "--reference", str(reference),
           "--device", args.device, "--dtype", args.dtype, "--windows", args.windows_arg]  # fmt: skip
    result: dict = {"profile": profile, "caches": {v: env.get(v, "default") for v in CACHE_VARS}}
    for kind in args.startup_kinds:
        try:
            t0 = time.time()
            extra = ["--profile-load"] if kind == "warm_profiled" else []
            proc = subprocess.run(
                cmd + extra, env=env, capture_output=True, text=True, timeout=args.child_timeout
            )
            lines = [x for x in proc.stdout.splitlines() if x.startswith("CHILD ")]
            if proc.returncode != 0 or not lines:
                raise RuntimeError(f"child exit {proc.returncode}: {proc.stderr[-2000:]}")
            row = json.loads(lines[-1][len("CHILD ") :])
            s = row.pop("stamps")
            row["process_start_to_first_audio_s"] = s["first_audio"] - t0
            row["breakdown_s"] = {
                "interpreter_and_torch_import": s["child_main"] - t0,
                "voicehub_import": s["imported"] - s["child_main"],
                "load_and_capture": s["loaded"] - s["imported"],
                "first_request": s["first_audio"] - s["loaded"],
            }
            result[kind] = row
        except Exception as err:
            print(f"startup {kind} failed: {err!r}", flush=True)
            result[kind] = {"error": traceback.format_exc(limit=3)}
        print(f"startup {kind}", json.dumps(result[kind]), flush=True)
    return result
