"""What models return: a whole utterance (`TTSOutput`) or a piece of a stream (`AudioChunk`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AudioChunk:
    """One piece of a streamed utterance.

    audio: float32 [n] mono samples in [-1, 1]; start_s: where the chunk begins in the utterance,
    in seconds; text: the span of the input it speaks (for a window inside a sentence, that
    sentence); phonemes: what the model read for that span, when the family has phonemes.
    """

    audio: np.ndarray
    sample_rate: int
    text: str
    index: int
    start_s: float
    is_last: bool
    phonemes: str | None = None

    @property
    def duration(self) -> float:
        return len(self.audio) / self.sample_rate


@dataclass(frozen=True)
class TTSOutput:
    """A whole utterance: float32 [n] mono audio at `sample_rate` Hz."""

    audio: np.ndarray
    sample_rate: int
    text: str

    @property
    def duration(self) -> float:
        return len(self.audio) / self.sample_rate
