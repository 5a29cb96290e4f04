"""The benchmark protocol behind `voicehub bench`, for any family.

Profiles: the eager baseline, each technique alone, and the automatic profile. Every profile
loads the model afresh, speaks the same text (>= 10 s of audio) with the same seed, device and
dtype, runs `n_warmup` untimed warm-ups (the first one's time is reported as the cold latency)
and `n_reps` measured repetitions. A profile the family cannot run is skipped with the reason.
"""

from __future__ import annotations

import gc
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from voicehub.optimization import (
    OptimizationContext,
    OptimizationError,
    OptimizationUnsupportedError,
    TTSOptimizationConfig,
    get_tts_optimization_support,
)

BENCH_SCHEMA = "voicehub.bench/1"
MIN_AUDIO_S = 10.0  # seconds of audio the benchmark text must produce
MIN_REPS = 3
MEMORY_DEFINITION = (
    "peak_allocated_bytes: torch.cuda.max_memory_allocated() from after loading to the end of the "
    "profile (weights, caches, graphs and activations alive at the peak); peak_reserved_bytes: "
    "torch.cuda.max_memory_reserved(), the caching allocator's reserved pool; null on the CPU"
)
_TOGGLES = ("compile", "diffusion_cache", "diffusion_sampling")


@dataclass(frozen=True)
class Profile:
    """An optimization config, and the engine configuration the model is loaded with for it
    (`engine`: keyword arguments of the family's loader, e.g. {'cuda_graph_preset': 'full'})."""

    name: str
    config: TTSOptimizationConfig
    engine: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BenchSettings:
    """One run's fixed inputs; `model` names the checkpoint or revision for the record."""

    model_type: str
    text: str
    model: str = ""
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float32"
    gpu_arch: str | None = None
    cuda_graph_preset: str | None = None
    n_warmup: int = 1
    n_reps: int = MIN_REPS
    min_audio_s: float = MIN_AUDIO_S
    language: str = "en"
    params: dict[str, Any] = field(default_factory=dict)  # request parameters for generate()

    def __post_init__(self) -> None:
        if self.n_warmup < 1:
            raise ValueError(
                f"n_warmup must be >= 1 (the cold run is never timed as warm), got {self.n_warmup}"
            )
        if self.n_reps < MIN_REPS:
            raise ValueError(f"n_reps must be >= {MIN_REPS}, got {self.n_reps}")
        if not self.text.strip():
            raise ValueError("the benchmark text is empty")

    def context(self, profile: Profile | None = None) -> OptimizationContext:
        preset = self.cuda_graph_preset
        if profile is not None:
            preset = profile.engine.get("cuda_graph_preset", preset)
        return OptimizationContext("inference", self.device, self.dtype, self.gpu_arch, preset)


def default_profiles(model_type: str, cuda_graph_preset: str | None = None) -> list[Profile]:
    """eager, then each technique the family offers on its own, then auto.

    With a CUDA-graph preset other than 'off' (engine configuration, for families that capture
    graphs), eager still loads with 'off', a `cuda_graphs` profile isolates the graphs (eager
    config, that preset), and every later profile loads with the preset too.
    """
    support = get_tts_optimization_support(model_type)
    eager = TTSOptimizationConfig.eager()
    graphs = cuda_graph_preset not in (None, "off")
    engine = {"cuda_graph_preset": cuda_graph_preset} if graphs else {}
    profiles = [Profile("eager", eager, {"cuda_graph_preset": "off"} if graphs else {})]
    if graphs:
        profiles.append(Profile("cuda_graphs", eager, engine))
    singles = [("attn_implementation", v) for v in support.attention_implementations]
    singles += [("kernel_backend", v) for v in support.kernel_backends]
    singles += [(f, v) for f in _TOGGLES for v in getattr(support, f)]
    for name, value in singles:
        if value not in ("auto", "native", "disabled"):
            cfg = TTSOptimizationConfig(**{**eager.to_dict(), name: value})
            profiles.append(Profile(f"{name}={value}", cfg, engine))
    profiles.append(Profile("auto", TTSOptimizationConfig(), engine))
    return profiles


def environment(device: str) -> dict[str, Any]:
    """Machine and versions, for the record."""

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "versions": {d: version(d) for d in ("voicehub", "torch", "numpy", "triton", "flash-attn-4")},
    }
    if device.startswith("cuda"):
        import torch

        env["gpu"] = torch.cuda.get_device_name(torch.device(device))
        env["cuda"] = torch.version.cuda
    return env


class _Device:
    """Synchronisation and memory statistics for one device (no-ops on the CPU)."""

    def __init__(self, device: str) -> None:
        self.is_cuda = device.startswith("cuda")
        if self.is_cuda:
            import torch

            self.torch, self.device = torch, torch.device(device)

    def sync(self) -> None:
        if self.is_cuda:
            self.torch.cuda.synchronize(self.device)

    def reset_peak(self) -> None:
        if self.is_cuda:
            self.sync()
            self.torch.cuda.reset_peak_memory_stats(self.device)

    def peaks(self) -> tuple[int | None, int | None]:
        if not self.is_cuda:
            return None, None
        cuda = self.torch.cuda
        return int(cuda.max_memory_allocated(self.device)), int(cuda.max_memory_reserved(self.device))

    def release(self) -> None:
        gc.collect()
        if self.is_cuda:
            self.torch.cuda.empty_cache()


def _timed(fn: Callable[[], Any], dev: _Device, timer: Callable[[], float]) -> tuple[float, Any]:
    dev.sync()
    start = timer()
    out = fn()
    dev.sync()
    return timer() - start, out


def _measure(
    model: Any, profile: Profile, settings: BenchSettings, dev: _Device, timer
) -> tuple[dict, np.ndarray, int]:
    manifest = None
    if hasattr(model, "optimize"):
        apply_s, result = _timed(
            lambda: model.optimize(profile.config, context=settings.context(profile)), dev, timer
        )
        manifest = result.to_dict()
    elif profile.name != "eager":
        raise OptimizationUnsupportedError(f"{type(model).__name__} does not support optimization")
    else:
        apply_s = 0.0
    dev.reset_peak()
    speak = lambda: model.generate(settings.text, seed=settings.seed, **settings.params)  # noqa: E731
    cold_s, _ = _timed(speak, dev, timer)
    for _ in range(settings.n_warmup - 1):
        speak()
    runs = [_timed(speak, dev, timer) for _ in range(settings.n_reps)]
    peak_alloc, peak_reserved = dev.peaks()
    warm = [s for s, _ in runs]
    out = runs[0][1]
    audio_s = len(out.audio) / out.sample_rate
    row = {
        "name": profile.name,
        "status": "measured",
        "config": profile.config.to_dict(),
        "engine": dict(profile.engine),
        "manifest": manifest,
        "apply_s": apply_s,
        "cold_latency_s": cold_s,
        "warm_latencies_s": warm,
        "warm_latency_median_s": statistics.median(warm),
        "audio_s": audio_s,
        "rtf": statistics.median(warm) / audio_s,
        "peak_allocated_bytes": peak_alloc,
        "peak_reserved_bytes": peak_reserved,
    }
    return row, np.asarray(out.audio, np.float32), out.sample_rate


def _compare(rows: list[dict], eager: dict) -> None:
    for row in rows:
        if row["status"] != "measured":
            continue
        row["speedup_vs_eager"] = eager["warm_latency_median_s"] / row["warm_latency_median_s"]
        a, b = eager["peak_allocated_bytes"], row["peak_allocated_bytes"]
        row["memory_drop_bytes"] = None if a is None or b is None else a - b
        row["memory_drop_ratio"] = None if a is None or b is None else (a - b) / a


def _skipped(profile: Profile, exc: Exception) -> dict[str, Any]:
    return {"name": profile.name, "status": "skipped", "config": profile.config.to_dict(), "reason": str(exc)}


def run_benchmark(
    load_model: Callable[..., Any],
    settings: BenchSettings,
    profiles: list[Profile] | None = None,
    quality_gate: Any = None,
    timer: Callable[[], float] = time.perf_counter,
    audio_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Run every profile; returns the JSON-ready record (see report.py for the table and plot).

    load_model(**profile.engine) must return a fresh model on `settings.device`/`dtype`. The first
    profile must be 'eager'. Raises ValueError when the eager audio is shorter than `min_audio_s`.
    audio_dir: also write each measured profile's audio there (`<profile>.wav`), so the quality
    gate can score a GPU run later on the CPU (`score_saved_audio`). A profile whose optimization
    fails to apply (e.g. a compile error) is recorded as failed with the error, and the rest go on.
    """
    profiles = profiles if profiles is not None else default_profiles(settings.model_type)
    if not profiles or profiles[0].name != "eager":
        raise ValueError("the first profile must be 'eager': every figure is compared with it")
    dev = _Device(settings.device)
    rows, eager_audio = [], None
    for profile in profiles:
        try:
            profile.config.resolve(settings.model_type, context=settings.context(profile))
        except OptimizationUnsupportedError as exc:
            if profile.name == "eager":
                raise
            rows.append(_skipped(profile, exc))
            continue
        model = load_model(**profile.engine)
        try:
            row, audio, rate = _measure(model, profile, settings, dev, timer)
        except OptimizationUnsupportedError as exc:
            rows.append(_skipped(profile, exc))
            continue
        except OptimizationError as exc:
            if profile.name == "eager":
                raise
            rows.append({**_skipped(profile, exc), "status": "failed", "error_type": type(exc).__name__})
            continue
        finally:
            del model
            dev.release()
        if eager_audio is None:
            if row["audio_s"] < settings.min_audio_s:
                raise ValueError(
                    f"the text gives {row['audio_s']:.1f} s of audio; the benchmark needs >= {settings.min_audio_s} s: use a longer text"
                )
            eager_audio = audio
        elif quality_gate is not None:
            report = quality_gate.compare(eager_audio, audio, rate, settings.text)
            row["quality"] = report.to_dict()
        if audio_dir is not None:
            row["audio_file"] = _save_audio(Path(audio_dir), profile.name, audio, rate)
        rows.append(row)
    _compare(rows, rows[0])
    return {
        "schema": BENCH_SCHEMA,
        "settings": {**settings.__dict__, "precision": settings.dtype},
        "environment": environment(settings.device),
        "memory_definition": MEMORY_DEFINITION,
        "profiles": rows,
    }


def _save_audio(folder: Path, name: str, audio: np.ndarray, rate: int) -> str:
    import soundfile as sf

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.wav"
    sf.write(path, audio, rate, subtype="FLOAT")  # float: the gate sees the samples as generated
    return path.name


def score_saved_audio(record: dict[str, Any], audio_dir: str | Path, quality_gate: Any) -> dict[str, Any]:
    """Score each profile's saved audio against eager's with the quality gate (on this machine,
    typically the CPU after a GPU run); returns the record with a `quality` report per profile."""
    import soundfile as sf

    folder = Path(audio_dir)
    rows = [r for r in record["profiles"] if r["status"] == "measured"]
    eager, rate = sf.read(folder / rows[0]["audio_file"], dtype="float32")
    text = record["settings"]["text"]
    for row in rows[1:]:
        audio, rate_c = sf.read(folder / row["audio_file"], dtype="float32")
        if rate_c != rate:
            raise ValueError(f"{row['audio_file']}: {rate_c} Hz, eager {rate} Hz")
        row["quality"] = quality_gate.compare(eager, audio, rate, text).to_dict()
    return record
