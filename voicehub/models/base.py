"""The small interface every model family implements, and the record a family registers."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from voicehub.optimization.mixin import OptimizableModelMixin
from voicehub.types import AudioChunk, TTSOutput


class TTSModel(OptimizableModelMixin, ABC):
    """A loaded text-to-speech model.

    `stream` yields `AudioChunk`s as audio is made; `generate` returns the whole utterance.
    Families override `generate` when a one-shot path differs from joining the stream, and
    `optimization_targets()` to offer reversible optimizations (see voicehub.optimization).
    """

    model_type: ClassVar[str]
    sample_rate: int

    @abstractmethod
    def stream(
        self, text: str, *, voice: Any = None, seed: int | None = None, **params: Any
    ) -> Iterator[AudioChunk]:
        """Yield the utterance chunk by chunk, the first before the rest is made."""

    def generate(self, text: str, *, voice: Any = None, seed: int | None = None, **params: Any) -> TTSOutput:
        """Make the whole utterance: float32 [n] at `self.sample_rate`."""
        chunks = list(self.stream(text, voice=voice, seed=seed, **params))
        audio = np.concatenate([c.audio for c in chunks]) if chunks else np.zeros(0, np.float32)
        return TTSOutput(audio=audio.astype(np.float32, copy=False), sample_rate=self.sample_rate, text=text)


@dataclass(frozen=True)
class ModelFamily:
    """What a family registers: how to recognise its files and how to load them.

    detect(path) reads the files' contents (never trusts a file name alone) and says whether this
    family can load them; resolve(name) turns a bare installed-voice name into a path, or None;
    installed() lists the names resolve() knows.
    """

    model_type: str
    summary: str
    load: Callable[..., TTSModel]
    detect: Callable[[Path], bool]
    resolve: Callable[[str], Path | None] = lambda name: None
    installed: Callable[[], list[str]] = field(default=lambda: [])
