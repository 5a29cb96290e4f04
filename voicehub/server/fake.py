"""A stand-in TTS model for server tests and load tests: deterministic sine chunks, no weights.

It measures the server, not a model: each word gives one chunk of `chunk_s` seconds of a tone
whose pitch comes from the word, made after `delay_s` seconds (the compute time to simulate).
Configure it with `factory = "voicehub.server.fake:SineModel"` and `options = {delay_s = 0.05}`.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from voicehub.errors import InvalidTextError
from voicehub.models.base import TTSModel
from voicehub.types import AudioChunk


class SineModel(TTSModel):
    """One chunk per word; `voice` (any str) shifts the pitch; `speed` shortens chunks."""

    model_type = "sine"

    def __init__(self, sample_rate: int = 22050, chunk_s: float = 0.1, delay_s: float = 0.0, **_: Any):
        self.sample_rate = int(sample_rate)
        self.chunk_s = float(chunk_s)
        self.delay_s = float(delay_s)
        self.gate: threading.Event | None = None  # tests set this to hold the worker inside a stream
        self.n_chunks_made = 0

    def stream(
        self, text: str, *, voice: Any = None, seed: int | None = None, speed: float = 1.0, **params: Any
    ) -> Iterator[AudioChunk]:
        if params:
            raise ValueError(f"unknown parameter(s) {sorted(params)} for the sine model; it takes speed")
        words = text.split()
        if "unspeakable" in words:  # lets tests reach the error path of a model
            raise InvalidTextError("the sine model refuses the word 'unspeakable'")
        n = max(1, int(self.sample_rate * self.chunk_s / speed))
        base = 220.0 + (zlib.crc32(str(voice).encode()) % 200 if voice is not None else 0)
        start = 0.0
        for i, word in enumerate(words):
            if self.gate is not None:
                self.gate.wait()
            if self.delay_s:
                time.sleep(self.delay_s)
            freq = base + zlib.crc32(word.encode()) % 400
            t = np.arange(n, dtype=np.float32) / self.sample_rate
            audio = (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)
            self.n_chunks_made += 1
            yield AudioChunk(audio, self.sample_rate, word, i, start, i == len(words) - 1)
            start += n / self.sample_rate
