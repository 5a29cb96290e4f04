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
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import numpy as np

from voicehub.optimization import (
    OptimizationContext,
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
    name: str
    config: TTSOptimizationConfig


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

    def __post_init__(self) -> None:
        if self.n_warmup < 1:
            raise ValueError(
                f"n_warmup must be >= 1 (the cold run is never timed as warm), got {self.n_warmup}"
            )
        if self.n_reps < MIN_REPS:
            raise ValueError(f"n_reps must be >= {MIN_REPS}, got {self.n_reps}")
        if not self.text.strip():
            raise ValueError("the benchmark text is empty")

    def context(self) -> OptimizationContext:
        return OptimizationContext(
            "inference", self.device, self.dtype, self.gpu_arch, self.cuda_graph_preset
        )


def default_profiles(model_type: str) -> list[Profile]:
    """eager, then each technique the family offers on its own, then auto."""
    support = get_tts_optimization_support(model_type)
    eager = TTSOptimizationConfig.eager()
    profiles = [Profile("eager", eager)]
    singles = [("attn_implementation", v) for v in support.attention_implementations]
    singles += [("kernel_backend", v) for v in support.kernel_backends]
    singles += [(f, v) for f in _TOGGLES for v in getattr(support, f)]
    for field, value in singles:
        if value not in ("auto", "native", "disabled"):
            cfg = TTSOptimizationConfig(**{**eager.to_dict(), field: value})
            profiles.append(Profile(f"{field}={value}", cfg))
    profiles.append(Profile("auto", TTSOptimizationConfig()))
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
            lambda: model.optimize(profile.config, context=settings.context()), dev, timer
        )
        manifest = result.to_dict()
    elif profile.name != "eager":
        raise OptimizationUnsupportedError(f"{type(model).__name__} does not support optimization")
    else:
        apply_s = 0.0
    dev.reset_peak()
    speak = lambda: model.generate(settings.text, seed=settings.seed)  # noqa: E731
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
    load_model: Callable[[], Any],
    settings: BenchSettings,
    profiles: list[Profile] | None = None,
    quality_gate: Any = None,
    timer: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """Run every profile; returns the JSON-ready record (see report.py for the table and plot).

    load_model() must return a fresh model on `settings.device`/`dtype`. The first profile must
    be 'eager'. Raises ValueError when the eager audio is shorter than `min_audio_s`.
    """
    profiles = profiles if profiles is not None else default_profiles(settings.model_type)
    if not profiles or profiles[0].name != "eager":
        raise ValueError("the first profile must be 'eager': every figure is compared with it")
    dev, ctx = _Device(settings.device), settings.context()
    rows, eager_audio = [], None
    for profile in profiles:
        try:
            profile.config.resolve(settings.model_type, context=ctx)
        except OptimizationUnsupportedError as exc:
            if profile.name == "eager":
                raise
            rows.append(_skipped(profile, exc))
            continue
        model = load_model()
        try:
            row, audio, rate = _measure(model, profile, settings, dev, timer)
        except OptimizationUnsupportedError as exc:
            rows.append(_skipped(profile, exc))
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
        rows.append(row)
    _compare(rows, rows[0])
    return {
        "schema": BENCH_SCHEMA,
        "settings": {**settings.__dict__, "precision": settings.dtype},
        "environment": environment(settings.device),
        "memory_definition": MEMORY_DEFINITION,
        "profiles": rows,
    }
