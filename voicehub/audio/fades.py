"""Joining streamed audio chunks without clicks: cross-fades, short fade-in/out ramps, and a click meter.

Float32 [n] mono numpy audio throughout. `StreamJoiner` is the streaming form of `join_chunks`: it holds
back each chunk's last `overlap` samples until the next chunk arrives, so the joined stream equals the
whole-utterance join sample for sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

import numpy as np

from voicehub.choices import parse_choice

JOIN_STEP_SAMPLES = 2  # steps on each side of a join that count as "at the join" in max_join_jump


class FadeShape(StrEnum):
    LINEAR = "linear"  # gains sum to 1: right for correlated (same-signal) overlaps
    EQUAL_POWER = "equal_power"  # squared gains sum to 1: right for uncorrelated overlaps


def parse_fade_shape(shape: str | FadeShape) -> FadeShape:
    """A FadeShape from its name; unknown names raise and list the valid ones."""
    return parse_choice(FadeShape, shape, "fade shape")


def fade_curves(n: int, shape: str | FadeShape = FadeShape.EQUAL_POWER) -> tuple[np.ndarray, np.ndarray]:
    """Gains (fade_in, fade_out), float32 [n] each, rising 0 -> 1 and falling 1 -> 0 over n samples.

    Sampled at sample centres, so neither end is exactly 0 or 1 and two curves of one shape are symmetric.
    """
    shape = parse_fade_shape(shape)
    t = (np.arange(n, dtype=np.float64) + 0.5) / max(n, 1)
    if shape is FadeShape.LINEAR:
        rise, fall = t, 1.0 - t
    else:
        rise, fall = np.sin(t * np.pi / 2), np.cos(t * np.pi / 2)
    return rise.astype(np.float32), fall.astype(np.float32)


def fade_in(audio: np.ndarray, n: int, shape: str | FadeShape = FadeShape.EQUAL_POWER) -> np.ndarray:
    """A copy of float32 [m] audio whose first min(n, m) samples ramp up from silence."""
    out = np.array(audio, dtype=np.float32, copy=True)
    n = min(n, len(out))
    out[:n] *= fade_curves(n, shape)[0]
    return out


def fade_out(audio: np.ndarray, n: int, shape: str | FadeShape = FadeShape.EQUAL_POWER) -> np.ndarray:
    """A copy of float32 [m] audio whose last min(n, m) samples ramp down to silence."""
    out = np.array(audio, dtype=np.float32, copy=True)
    n = min(n, len(out))
    if n:
        out[-n:] *= fade_curves(n, shape)[1]
    return out


def crossfade(
    head: np.ndarray, tail: np.ndarray, overlap: int, shape: str | FadeShape = FadeShape.EQUAL_POWER
) -> np.ndarray:
    """Join two chunks whose last / first `overlap` samples cover the same time: [len(head) + len(tail) - overlap]."""
    if overlap < 0 or overlap > min(len(head), len(tail)):
        raise ValueError(f"overlap {overlap} must be in [0, {min(len(head), len(tail))}] for these chunks")
    rise, fall = fade_curves(overlap, shape)
    mixed = head[len(head) - overlap :] * fall + tail[:overlap] * rise
    return np.concatenate([head[: len(head) - overlap], mixed, tail[overlap:]]).astype(np.float32)


def join_chunks(
    chunks: Sequence[np.ndarray], overlap: int = 0, shape: str | FadeShape = FadeShape.EQUAL_POWER
) -> tuple[np.ndarray, list[int]]:
    """Cross-fade consecutive chunks; returns the audio and the index of each join (the overlap's centre)."""
    joiner = StreamJoiner(overlap, shape)
    pieces = [joiner.push(c) for c in chunks] + [joiner.finish()]
    return np.concatenate(pieces) if pieces else np.zeros(0, np.float32), joiner.joins


class StreamJoiner:
    """Streaming cross-fade: `push(chunk)` returns the samples that are final, `finish()` the rest."""

    def __init__(self, overlap: int, shape: str | FadeShape = FadeShape.EQUAL_POWER):
        if overlap < 0:
            raise ValueError(f"overlap must be >= 0, got {overlap}")
        self.overlap = overlap
        self.shape = parse_fade_shape(shape)
        self.joins: list[int] = []  # sample index of each join's centre in the joined stream
        self._held = np.zeros(0, np.float32)  # the previous chunk's tail, waiting for the next chunk
        self._emitted = 0
        self._has_chunk = False

    def push(self, chunk: np.ndarray) -> np.ndarray:
        """Add the next chunk (float32 [n], n >= overlap); returns the newly final samples."""
        chunk = np.asarray(chunk, dtype=np.float32)
        if len(chunk) < self.overlap:
            raise ValueError(f"chunk of {len(chunk)} samples is shorter than the overlap {self.overlap}")
        if self._has_chunk:
            self.joins.append(self._emitted + self.overlap // 2)
            chunk = crossfade(self._held, chunk, self.overlap, self.shape)
        self._has_chunk = True
        split = len(chunk) - self.overlap
        ready, self._held = chunk[:split], chunk[split:]
        self._emitted += len(ready)
        return ready

    def finish(self) -> np.ndarray:
        """The held-back tail of the last chunk (played as is: the stream ends there)."""
        tail, self._held = self._held, np.zeros(0, np.float32)
        self._emitted += len(tail)
        return tail


def max_join_jump(
    audio: np.ndarray, joins: Sequence[int], sample_rate: int, window_ms: float = 20.0
) -> np.ndarray:
    """Click meter for tests: at each join, the largest |x[i+1] - x[i]| within 2 samples of it, divided by the
    median |step| over the surrounding `window_ms` (centred on the join). float64 [len(joins)].

    About 1-2 on smooth voiced audio; a discontinuity gives far more. Silence around a click gives inf.
    Meaningful on tonal or voiced audio; white noise alone reaches 3 by chance.
    """
    audio = np.asarray(audio, dtype=np.float64)
    steps = np.abs(np.diff(audio))  # steps[i] = |x[i+1] - x[i]|
    half = max(int(sample_rate * window_ms / 2000), JOIN_STEP_SAMPLES + 1)
    out = np.empty(len(joins))
    for k, j in enumerate(joins):
        if not 0 < j < len(audio):
            raise ValueError(f"join {j} is outside audio of {len(audio)} samples")
        local = steps[max(j - JOIN_STEP_SAMPLES, 0) : j + JOIN_STEP_SAMPLES].max()
        median = np.median(steps[max(j - half, 0) : j + half])
        out[k] = local / median if median > 0 else (np.inf if local > 0 else 0.0)
    return out
