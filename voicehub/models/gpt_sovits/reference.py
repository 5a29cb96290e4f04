"""A voice's reference: the `Voice` itself, its audio checked by upstream's rules, and a cache of its features.

Upstream v3 (TTS_infer_pack/TTS.py `set_ref_audio`, `_set_prompt_semantic`, `_get_ref_spec`, the v3 branch
of `using_vocoder_synthesis`) reads the reference three ways, all reproduced here:
- 16 kHz with librosa.load (soxr_hq) for HuBERT, refused outside 48,000..160,000 samples (3-10 s);
- the SoVITS rate (32 kHz for v3) with torchaudio's resampler, peak-limited, for the linear spectrogram;
- 24 kHz with torchaudio's resampler for the CFM prompt's log-mel (`encode_reference` then applies `norm_spec`).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from voicehub.audio.load import ResampleMethod, read_audio, resample, sinc_hann_resample
from voicehub.audio.mel import V3_MEL, MelSpectrogram, linear_spectrogram
from voicehub.errors import AudioFormatError, InvalidTextError, VoiceHubError
from voicehub.models.gpt_sovits.ssl import HUBERT_SAMPLE_RATE
from voicehub.text.options import Language, parse_language

REF_MIN_SAMPLES_16K = 48000  # upstream refuses fewer 16 kHz samples (3 s)
REF_MAX_SAMPLES_16K = 160000  # and more (10 s)


class ReferenceAudioError(VoiceHubError, ValueError):
    """Reference audio outside what GPT-SoVITS v3 accepts (3-10 s)."""


@dataclass(frozen=True)
class Voice:
    """A voice to clone: reference audio, what is said in it, and its language (a `Language` code or alias)."""

    ref_audio_path: Path
    prompt_text: str
    prompt_language: Language

    def __post_init__(self) -> None:
        object.__setattr__(self, "ref_audio_path", Path(self.ref_audio_path))
        object.__setattr__(self, "prompt_language", parse_language(self.prompt_language))
        if not isinstance(self.prompt_text, str) or not self.prompt_text.strip():
            raise InvalidTextError(
                "the voice's prompt text is empty: give the transcript of the reference audio "
                "(GPT-SoVITS v3 has no reference-free mode)"
            )


@dataclass(frozen=True)
class SpecConfig:
    """The SoVITS reference spectrogram settings (`data` section of the SoVITS config; v3 values by default)."""

    sample_rate: int = 32000  # Hz
    n_fft: int = 2048  # filter_length
    hop_length: int = 640
    win_length: int = 2048


@dataclass(frozen=True, eq=False)
class ReferenceAudio:
    """Reference audio as read from its file: float32 [n] at the file's rate, and float32 [n16] at 16 kHz."""

    path: Path
    audio: np.ndarray
    sample_rate: int
    wav16k: np.ndarray

    @property
    def duration_s(self) -> float:
        return len(self.wav16k) / HUBERT_SAMPLE_RATE


def load_reference_audio(path: str | Path) -> ReferenceAudio:
    """Read a reference file and check upstream's 3-10 s rule on its 16 kHz length.

    Raises AudioFormatError (unreadable, empty) or ReferenceAudioError (too short or too long).
    """
    path = Path(path)
    audio, sample_rate = read_audio(path)
    wav16k = resample(audio, sample_rate, HUBERT_SAMPLE_RATE, ResampleMethod.SOXR_HQ)
    if not REF_MIN_SAMPLES_16K <= len(wav16k) <= REF_MAX_SAMPLES_16K:
        raise ReferenceAudioError(
            f"reference audio {str(path)!r} is {len(wav16k) / HUBERT_SAMPLE_RATE:.2f} s long; GPT-SoVITS v3 "
            f"needs 3 to 10 s of reference: trim it or pick another clip"
        )
    return ReferenceAudio(path, audio, sample_rate, wav16k)


def _at_rate(ref: ReferenceAudio, sample_rate: int, device: str | torch.device) -> torch.Tensor:
    # ref.audio [n] -> [1, n'] float32 at `sample_rate`, with torchaudio's resampler as upstream.
    audio = torch.from_numpy(ref.audio).to(device)[None]
    return sinc_hann_resample(audio, ref.sample_rate, sample_rate)


def reference_spectrogram(
    ref: ReferenceAudio, config: SpecConfig = SpecConfig(), device: str | torch.device = "cpu"
) -> torch.Tensor:
    """The SoVITS reference encoder's input, upstream `_get_ref_spec`: [1, n_fft // 2 + 1, T] float32."""
    audio = _at_rate(ref, config.sample_rate, device)
    peak = audio.abs().max()
    if peak > 1:  # upstream scales loud (float) files down, by at most 2
        audio = audio / torch.clamp(peak, max=2.0)
    return linear_spectrogram(audio, config.n_fft, config.hop_length, config.win_length)


def reference_log_mel(
    ref: ReferenceAudio, mel: MelSpectrogram | None = None, device: str | torch.device = "cpu"
) -> torch.Tensor:
    """The reference's 24 kHz log-mel (upstream v3 `mel_fn`), [1, 100, T] float32, *not* normalised.

    `sovits.encode_reference` applies `norm_spec` to it, once, as upstream does after `mel_fn`.
    """
    mel = (mel or MelSpectrogram(V3_MEL)).to(device)
    return mel(_at_rate(ref, mel.config.sample_rate, device))


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes (hex): the cache key of its content, whatever its name."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class ReferenceCache:
    """Least-recently-used cache of reference features keyed by (file content hash, model id, extra).

    One per engine, shared by its requests (thread-safe). `capacity` counts entries; 0 disables caching.
    """

    capacity: int = 16
    hits: int = 0
    misses: int = 0
    _entries: OrderedDict[tuple, Any] = field(default_factory=OrderedDict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.capacity < 0:
            raise ValueError(f"cache capacity must be >= 0, got {self.capacity}")

    def __len__(self) -> int:
        return len(self._entries)

    def get_or_compute(
        self, path: str | Path, model_id: str, compute: Callable[[], Any], extra: Hashable = None
    ) -> Any:
        """The cached value for this file content and model, else `compute()` (stored, oldest entry evicted).

        Raises AudioFormatError naming the file when it is missing or cannot be read (it is hashed first).
        """
        path = Path(path)
        if not path.is_file():
            raise AudioFormatError(f"reference audio {str(path)!r} does not exist or is not a file")
        try:
            digest = file_digest(path)
        except OSError as exc:  # unreadable (permissions), or removed since the check
            raise AudioFormatError(f"cannot read reference audio {str(path)!r}: {exc.strerror}") from exc
        key = (digest, model_id, extra)
        with self._lock:
            if key in self._entries:
                self.hits += 1
                self._entries.move_to_end(key)
                return self._entries[key]
            self.misses += 1
        value = compute()  # outside the lock: features can take a while; a race only computes twice
        with self._lock:
            if self.capacity > 0:
                self._entries[key] = value
                self._entries.move_to_end(key)
                while len(self._entries) > self.capacity:
                    self._entries.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
