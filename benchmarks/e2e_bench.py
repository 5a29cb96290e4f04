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
import contextlib
import cProfile
import gc
import json
import os
import platform
import pstats
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from bench_meta import tree_commit

TEXTS = {
    "short": "This is a short test sentence.",
    "medium": "The quick brown fox jumps over the lazy dog and then it runs far away into the quiet green forest.",
    "long": (
        "When the morning train finally pulled into the old station the passengers gathered their bags "
        "and stepped out onto the cold platform where a small crowd of friends and families had been "
        "waiting for more than an hour to welcome them home after the long journey across the mountains."
    ),
}
TOKENS_PER_CHAR = 1.5  # 25 semantic tokens/s over ~17 characters/s of read English
MIN_TOKENS = 30  # >= 1.2 s of audio: the first chunk must carry >= 0.25 s
# The issue-4 fast workload: the `fast` preset (speed 1.3, 4 CFM steps, temperature 0.6) with top_k 5
# (the value; the preset itself says 3), punctuation cut.
PRESET = "fast"
FAST = dict(how_to_cut="punctuation", sample_steps=4, top_k=5, top_p=1.0, temperature=0.6)
SEED = 1234
PROMPT_TEXT = "The quick brown fox jumps over the lazy dog, and then it runs away into the forest."
# graph presets; triton = full + Triton kernels, triton_minimal = minimal + Triton kernels
PROFILES = ("off", "full", "minimal", "lazy", "triton", "triton_minimal")
TRITON_PRESETS = {"triton": "full", "triton_minimal": "minimal"}
KINDS = ("cold", "warm", "warm_profiled", "warm_shared")  # see `startup`
PROFILE_TOP = 45  # functions kept per ordering in a warm_profiled child's `load_profile`
CACHE_VARS = (
    "TRITON_CACHE_DIR",
    "TORCHINDUCTOR_CACHE_DIR",
    "CUDA_CACHE_PATH",
    "VOICEHUB_CACHE",
)  # cold: all empty


def n_tokens(text: str) -> int:
    return max(MIN_TOKENS, round(TOKENS_PER_CHAR * len(text)))


def write_reference(
    path: Path, seconds: float = 5.0, sample_rate: int = 24000, pitch_hz: float = 130.0
) -> Path:
    """A speech-like stand-in for a reference clip (no phonemizer on the GPU machine): 8 harmonics
    of a pitch gliding around pitch_hz, gated into ~4 syllables/s with two pauses; peak 0.5.
    The same kind of signal as tests/gpt_sovits_fixtures.write_synthetic_voice."""
    t = np.arange(int(round(seconds * sample_rate))) / sample_rate
    f0 = pitch_hz + 30 * np.sin(2 * np.pi * 0.35 * t) + 15 * np.sin(2 * np.pi * 1.7 * t + 1.0)  # Hz
    phase = 2 * np.pi * np.cumsum(f0) / sample_rate
    voiced = sum(np.sin(k * phase) / k for k in range(1, 9))
    syllables = np.clip(np.sin(2 * np.pi * 4.1 * t) + 0.3, 0.0, None) ** 0.7
    pauses = (np.abs(t - 1.6) > 0.15) & (np.abs(t - 3.4) > 0.2)
    audio = voiced * syllables * pauses * np.minimum(1.0, np.minimum(t, seconds - t) / 0.05)
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, (0.5 * audio / np.abs(audio).max()).astype(np.float32), sample_rate)
    return path


def ensure_set(set_dir: Path, size: str) -> tuple[Path, float]:
    """The make-checkpoint set under set_dir (made once; `.complete` marks a finished one); seconds spent."""
    from voicehub.models.gpt_sovits.make_checkpoint import make_checkpoint_set

    t0 = time.perf_counter()
    if not (set_dir / ".complete").exists():
        make_checkpoint_set(set_dir, size, seed=0, margin_tokens=0)
        (set_dir / ".complete").touch()
    return set_dir, time.perf_counter() - t0


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def load_profile(set_dir: Path, device: str, dtype: str, profile: str, strict: bool = True, voice=None):
    """Load the set as `profile` (voice: its default_voice, warmed up at load); returns (model,
    optimization manifest or None). triton applies its kernels at load (from_pretrained's
    optimization_config); strict=False: if they cannot apply, the graphs-only model is loaded instead and
    the error is put in the manifest."""
    from voicehub import AutoModelForTextToSpeech
    from voicehub.models.gpt_sovits.model import MODEL_TYPE
    from voicehub.optimization.config import TTSOptimizationConfig

    # No CUDA graphs off CUDA: there `full` and `triton` load eagerly (and triton then says why it cannot run).
    preset = TRITON_PRESETS.get(profile, profile)
    preset = preset if device.startswith("cuda") else "off"
    kw = dict(
        model_type=MODEL_TYPE, device=device, dtype=dtype, cuda_graph_preset=preset, default_voice=voice
    )
    if profile not in TRITON_PRESETS:
        model = AutoModelForTextToSpeech.from_pretrained(set_dir, **kw)
        sync(device)
        return model, None
    # The kernels are chosen at load, as a user would: applied before the graphs are captured and warmed up.
    # compile off: auto turns it on for sm_90 since session 21 (~24 s at load); these profiles are Triton alone
    config = TTSOptimizationConfig(kernel_backend="triton", compile="disabled")
    try:
        model = AutoModelForTextToSpeech.from_pretrained(set_dir, optimization_config=config, **kw)
        manifest = model.optimization_result.to_dict()
    except Exception as err:
        if strict:
            raise
        model = AutoModelForTextToSpeech.from_pretrained(set_dir, **kw)
        manifest = {"error": repr(err), "fallback": "full (graphs only)"}
    sync(device)
    return model, manifest


def first_audio(model, voice, text: str, device: str, window: int | None = None) -> dict:
    """Ms from calling `model.stream` to its first AudioChunk, and that chunk's audio seconds.

    window: `stream_chunk_tokens` (None: one chunk per sentence, the reference path)."""
    sync(device)
    t0 = time.perf_counter()
    chunks = model.stream(
        text,
        voice=voice,
        seed=SEED,
        preset=PRESET,
        force_n_tokens=n_tokens(text),
        stream_chunk_tokens=window,
        **FAST,
    )
    chunk = next(iter(chunks))
    t_first = time.perf_counter() - t0
    chunks.close()
    return {"first_audio_ms": t_first * 1e3, "chunk_audio_s": len(chunk.audio) / chunk.sample_rate}


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


def first_chunk_stages(model, voice, text: str, device: str, window: int) -> dict:
    """Where the first chunk's time goes: one extra request (not among the timed ones) with a device
    sync around each stage of the streamed chain. Ms from the request to the first SoVITS encoder call
    (`t2s_and_text_ms`: text frontend, reference lookup, T2S prefill and the first window's tokens), split
    into the text frontend (`text_ms`: g2p and BERT of the sentences read before the first chunk), the T2S
    prefill (`prefill_ms`: the graph decoder's row load, or the eager `encode_prompt`), the first window's
    decode steps (`first_window_ms`: from the prefill's end to the first encoder call) and the rest
    (`t2s_other_ms`: reference lookup, request assembly); then the first chunk's SoVITS encoder, CFM and
    vocoder calls (graph replays where the model has acoustic graphs), and the rest (joins, copies,
    Python). The syncs add a little: `first_audio_ms` here is not the timed figure."""
    from voicehub.models.gpt_sovits import streaming

    pipe = model.pipeline
    graphs = pipe.acoustic_graphs
    decoder = pipe.t2s_decoder
    spans: dict[str, float] = {"encoder": 0.0, "cfm": 0.0, "vocoder": 0.0, "text": 0.0, "prefill": 0.0}
    starts: list[float] = []  # acoustic stages' start times
    prefill_ends: list[float] = []

    def timed(name: str, fn):
        def wrapper(*args, **kwargs):
            sync(device)
            t = time.perf_counter()
            if name not in ("text", "prefill"):
                starts.append(t)
            out = fn(*args, **kwargs)
            sync(device)
            end = time.perf_counter()
            spans[name] += end - t
            if name == "prefill":
                prefill_ends.append(end)
            return out

        return wrapper

    # Instance attributes shadow the methods; the eager path reads streaming's module-level solve/vocode.
    owner = graphs if graphs is not None else streaming
    vocode_name = "vocode_mel" if graphs is not None else "vocode"  # what the streamed path vocodes with
    saved = {"solve": owner.solve, "vocode": getattr(owner, vocode_name)}
    pipe.sovits.decode_encp = timed("encoder", pipe.sovits.decode_encp)
    if graphs is not None:  # the streamed path encodes through the graphs (encoder_graphs.py)
        graphs.encode = timed("encoder", graphs.encode)
    owner.solve = timed("cfm", saved["solve"])
    setattr(owner, vocode_name, timed("vocoder", saved["vocode"]))
    pipe.text_features = timed("text", pipe.text_features)
    if decoder is not None:  # decode_iter loads the row through the instance attribute
        decoder._load_row = timed("prefill", decoder._load_row)
    else:  # the eager step-wise decode prefills through streaming's encode_prompt
        saved["encode_prompt"] = streaming.encode_prompt
        streaming.encode_prompt = timed("prefill", saved["encode_prompt"])
    try:
        sync(device)
        t0 = time.perf_counter()
        chunks = model.stream(text, voice=voice, seed=SEED, preset=PRESET, force_n_tokens=n_tokens(text),
                              stream_chunk_tokens=window, **FAST)  # fmt: skip
        next(iter(chunks))
        total = time.perf_counter() - t0
        chunks.close()
    finally:
        del pipe.sovits.decode_encp, pipe.text_features
        if decoder is not None:
            del decoder._load_row
        else:
            streaming.encode_prompt = saved["encode_prompt"]
        if graphs is not None:
            del graphs.solve, graphs.vocode_mel, graphs.encode
        else:
            streaming.solve, streaming.vocode = saved["solve"], saved["vocode"]
    ms = {k: v * 1e3 for k, v in spans.items()}
    to_encoder = (starts[0] - t0) * 1e3 if starts else float("nan")
    first_window = (starts[0] - prefill_ends[0]) * 1e3 if starts and prefill_ends else float("nan")
    return {
        "first_audio_ms": total * 1e3,
        "t2s_and_text_ms": to_encoder,
        "text_ms": ms["text"],
        "prefill_ms": ms["prefill"],
        "first_window_ms": first_window,
        "t2s_other_ms": to_encoder - ms["text"] - ms["prefill"] - first_window,
        "encoder_ms": ms["encoder"],
        "cfm_ms": ms["cfm"],
        "vocoder_ms": ms["vocoder"],
        "other_ms": total * 1e3 - to_encoder - ms["encoder"] - ms["cfm"] - ms["vocoder"],
        "acoustic_graphs": graphs is not None,
    }


def window_name(window: int | None) -> str:
    return "sentence" if window is None else f"window{window}"


def memory(device: str) -> dict:
    if not device.startswith("cuda"):
        return {}
    return {
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
    }


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
    cmd = [sys.executable, __file__, "--child", profile, "--set-dir", str(set_dir), "--reference", str(reference),
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


def derived(rows: list[dict], stream_mode: str) -> dict:
    """Per profile: warm first audio as a ratio of the eager `off` profile's, and the penalties of the
    first request after load, of a new voice and of a text length never seen, over the warm time of the
    same text in the same mode (ms; the first two in `stream_mode`)."""
    ok = {r["profile"]: r for r in rows if "error" not in r}
    out: dict = {}
    for name, row in ok.items():
        modes = row["first_audio"]
        warm_short = modes[stream_mode]["short"]["median_ms"]
        entry = {
            "first_request_penalty_ms": row["first_request"]["first_audio_ms"] - warm_short,
            "new_voice_penalty_ms": row["first_request_new_voice"]["first_audio_ms"] - warm_short,
            "new_length_penalty_ms": {
                m: {t: v["first_run_ms"] - v["median_ms"] for t, v in texts.items()}
                for m, texts in modes.items()
            },
        }
        if "off" in ok and name != "off":
            eager = ok["off"]["first_audio"]
            entry["speedup_vs_off"] = {
                m: {t: eager[m][t]["median_ms"] / v["median_ms"] for t, v in texts.items()}
                for m, texts in modes.items()
                if m in eager
            }
        out[name] = entry
    return out


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


def profile_lines(row: dict) -> list[str]:
    """Table rows of one profile: one per streaming mode."""
    if "error" in row:
        return [f"{row['profile']:8} error: {row['error'].strip().splitlines()[-1]}"]
    nan = float("nan")
    mem, loaded = row.get("memory") or {}, row.get("memory_after_load") or {}
    peak = " ".join(
        f"{m.get(k, nan):8.2f}" for m in (loaded, mem) for k in ("peak_allocated_gib", "peak_reserved_gib")
    )
    first = f"{row['first_request']['first_audio_ms']:9.1f} {row['first_request_new_voice']['first_audio_ms']:9.1f}"
    lines = []
    for mode, texts in row["first_audio"].items():
        ms = " ".join(f"{texts[n]['median_ms']:9.1f}" for n in TEXTS)
        lines.append(f"{row['profile']:8} {mode:9} {row['load_s']:6.1f} {first} {ms} {peak}")
    stages = row.get("first_chunk_stages") or {}
    if "first_audio_ms" in stages:
        parts = " ".join(f"{k.removesuffix('_ms')} {stages[k]:.1f}" for k in
                         ("t2s_and_text_ms", "encoder_ms", "cfm_ms", "vocoder_ms", "other_ms"))  # fmt: skip
        t2s = " ".join(f"{k.removesuffix('_ms')} {stages.get(k, nan):.1f}" for k in
                       ("text_ms", "prefill_ms", "first_window_ms", "t2s_other_ms"))  # fmt: skip
        lines.append(
            f"{'':8} first chunk, short, synced stages (ms): {parts}; total {stages['first_audio_ms']:.1f}"
        )
        lines.append(f"{'':8}   of which t2s_and_text (ms): {t2s}")
    return lines


def table(result: dict) -> str:
    head = " ".join(f"{n + ' ms':>9}" for n in TEXTS)
    lines = [
        "first audio, warm median ms per text; 1st req: the first request after load (voice warmed up at load), "
        "new voice: a voice never seen; GiB: peak allocated/reserved after load, then over the profile",
        f"{'profile':8} {'stream':9} {'load s':>6} {'1st req':>9} {'new voice':>9} {head} "
        f"{'load GiB':>8} {'load rsv':>8} {'peak GiB':>8} {'peak rsv':>8}",
    ]
    for row in result["profiles"]:
        lines += profile_lines(row)
    runs = [(start, kind) for start in result.get("startups") or () for kind in start if kind in KINDS]
    for st, kind in runs:
        row = st.get(kind) or {}
        value = row.get("process_start_to_first_audio_s")
        parts = " ".join(f"{k} {v:.2f}" for k, v in (row.get("breakdown_s") or {}).items())
        lines.append(f"process start to first audio ({st.get('profile')}, {kind} caches): "
                     + (f"{value:.2f} s ({parts})" if value is not None else "error"))  # fmt: skip
        if "second_request" in row:
            stages = row.get("third_request_stages") or {}
            split = " ".join(
                f"{k.removesuffix('_ms')} {v:.1f}" for k, v in stages.items() if k.endswith("_ms")
            )
            lines.append(f"{'':8} first request {row.get('first_audio_ms', float('nan')):.1f} ms, second "
                         f"{row['second_request']['first_audio_ms']:.1f} ms; third, synced: {split}")  # fmt: skip
    return "\n".join(lines)


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
