"""Turning streamed float32 chunks into the bytes a response carries.

Raw PCM and WAV leave chunk by chunk (WAV with a header whose lengths say "unknown", as streaming
servers write it); MP3, Opus and FLAC are encoded once the utterance is whole, because their
encoders write headers and padding that do not split at arbitrary chunk boundaries.
"""

from __future__ import annotations

import struct
from enum import StrEnum

import numpy as np
import soxr

from voicehub.audio.io import OPUS_RATES, AudioFormat, encode, to_pcm

OPENAI_PCM_RATE = 24000  # OpenAI's `pcm` is 24 kHz s16le mono
_UNKNOWN_SIZE = 0xFFFFFFFF  # RIFF/data sizes of a WAV whose length is not known yet


class NativeFormat(StrEnum):
    F32LE = "f32le"
    S16LE = "s16le"

    @property
    def audio_format(self) -> AudioFormat:
        return AudioFormat.PCM_F32LE if self is NativeFormat.F32LE else AudioFormat.PCM_S16LE


class FileFormat(StrEnum):
    WAV = "wav"
    FLAC = "flac"
    MP3 = "mp3"
    OPUS = "opus"


MEDIA_TYPES = {
    "wav": "audio/wav",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "pcm": "audio/pcm",
    "aac": "audio/aac",
}


class StreamResampler:
    """Resample a stream of float32 [n] chunks with libsoxr (HQ), keeping filter state across chunks."""

    def __init__(self, in_rate: int, out_rate: int):
        self.in_rate, self.out_rate = in_rate, out_rate
        self._stream = (
            soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality="HQ")
            if in_rate != out_rate
            else None
        )

    def __call__(self, audio: np.ndarray, last: bool = False) -> np.ndarray:
        if self._stream is None:
            return audio
        return self._stream.resample_chunk(np.asarray(audio, dtype=np.float32), last=last)


def wav_stream_header(sample_rate: int, bits: int = 16) -> bytes:
    """A 44-byte PCM WAV header for a mono stream of unknown length."""
    block = bits // 8
    return (
        b"RIFF"
        + struct.pack("<I", _UNKNOWN_SIZE)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * block, block, bits)
        + b"data"
        + struct.pack("<I", _UNKNOWN_SIZE)
    )


def file_rate(fmt: FileFormat | str, sample_rate: int) -> int:
    """The rate a whole file is written at: Opus only encodes a few rates, so it goes to 24 kHz."""
    if str(fmt) == "opus" and sample_rate not in OPUS_RATES:
        return OPENAI_PCM_RATE
    return sample_rate


def encode_file(audio: np.ndarray, sample_rate: int, fmt: FileFormat | str) -> tuple[bytes, int]:
    """The file's bytes and its rate; float32 [n] audio is resampled first when the format needs it."""
    rate = file_rate(fmt, sample_rate)
    if rate != sample_rate:
        audio = soxr.resample(audio, sample_rate, rate, quality="HQ").astype(np.float32)
    return encode(audio, rate, str(fmt)), rate


def s16le(audio: np.ndarray) -> bytes:
    return to_pcm(audio, AudioFormat.PCM_S16LE)
