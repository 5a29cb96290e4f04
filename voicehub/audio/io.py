"""Encode float32 audio into the formats VoiceHub writes, and write files atomically.

One module for the CLI and the server. soundfile (libsndfile) writes every format itself.
"""

from __future__ import annotations

import io
import os
import tempfile
from enum import StrEnum
from pathlib import Path
from typing import BinaryIO

import numpy as np
import soundfile as sf

from voicehub.errors import AudioFormatError


class AudioFormat(StrEnum):
    WAV = "wav"
    FLAC = "flac"
    MP3 = "mp3"
    OGG = "ogg"  # Ogg Vorbis
    OPUS = "opus"  # Ogg Opus
    PCM_S16LE = "pcm_s16le"
    PCM_F32LE = "pcm_f32le"

    @property
    def is_raw(self) -> bool:
        return self in (AudioFormat.PCM_S16LE, AudioFormat.PCM_F32LE)


FORMAT_ALIASES = {
    "pcm": AudioFormat.PCM_S16LE,
    "s16le": AudioFormat.PCM_S16LE,
    "f32le": AudioFormat.PCM_F32LE,
}
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)  # the only rates Opus encodes
_SF_ARGS = {
    AudioFormat.WAV: ("WAV", "PCM_16"),
    AudioFormat.FLAC: ("FLAC", "PCM_16"),
    AudioFormat.MP3: ("MP3", "MPEG_LAYER_III"),
    AudioFormat.OGG: ("OGG", "VORBIS"),
    AudioFormat.OPUS: ("OGG", "OPUS"),
}


def parse_format(name: str | AudioFormat) -> AudioFormat:
    """An AudioFormat from its name or an alias ('pcm' is s16le); unknown names raise and list the valid ones."""
    if isinstance(name, AudioFormat):
        return name
    key = str(name).lower().lstrip(".")
    if key in FORMAT_ALIASES:
        return FORMAT_ALIASES[key]
    try:
        return AudioFormat(key)
    except ValueError:
        valid = [f.value for f in AudioFormat] + list(FORMAT_ALIASES)
        raise AudioFormatError(f"unknown audio format {name!r}; valid formats: {', '.join(valid)}") from None


def format_from_path(path: str | Path) -> AudioFormat:
    suffix = Path(path).suffix.lower()
    if not suffix:
        raise AudioFormatError(f"cannot tell the format of {str(path)!r}: add an extension or pass a format")
    return parse_format("pcm" if suffix in (".pcm", ".raw") else suffix)


def to_pcm(audio: np.ndarray, fmt: AudioFormat) -> bytes:
    """Raw little-endian PCM of float32 [n] audio (clipped to [-1, 1] for s16le)."""
    audio = np.asarray(audio, dtype=np.float32)
    if fmt is AudioFormat.PCM_F32LE:
        return audio.astype("<f4").tobytes()
    if fmt is AudioFormat.PCM_S16LE:
        return (np.clip(audio, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()
    raise AudioFormatError(f"{fmt.value} is not a raw PCM format")


def encode(audio: np.ndarray, sample_rate: int, fmt: str | AudioFormat) -> bytes:
    """The bytes of a whole file (or raw PCM) holding float32 [n] mono audio at `sample_rate` Hz."""
    fmt = parse_format(fmt)
    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim != 1:
        raise AudioFormatError(f"expected mono audio of shape [n], got {audio.shape}")
    if fmt.is_raw:
        return to_pcm(audio, fmt)
    if fmt is AudioFormat.OPUS and sample_rate not in OPUS_RATES:
        raise AudioFormatError(
            f"Opus encodes only at {OPUS_RATES} Hz, not {sample_rate}; resample first or pick another format"
        )
    buf = io.BytesIO()
    container, subtype = _SF_ARGS[fmt]
    try:
        sf.write(buf, np.clip(audio, -1.0, 1.0), sample_rate, format=container, subtype=subtype)
    except (sf.LibsndfileError, RuntimeError, TypeError) as exc:
        raise AudioFormatError(f"could not encode {fmt.value} at {sample_rate} Hz: {exc}") from exc
    return buf.getvalue()


def write_audio(
    path: str | Path, audio: np.ndarray, sample_rate: int, fmt: str | AudioFormat | None = None
) -> Path:
    """Write a file atomically: it appears whole at `path` or not at all. Returns the path."""
    path = Path(path)
    data = encode(audio, sample_rate, fmt if fmt is not None else format_from_path(path))
    with atomic_writer(path) as fh:
        fh.write(data)
    return path


class AudioFileWriter:
    """Write a stream of float32 chunks into one file that appears only when the stream ends well.

    `with AudioFileWriter(path, sample_rate) as w: w.write(chunk)`; on an exception the partial
    file is removed and `path` is left untouched.
    """

    def __init__(self, path: str | Path, sample_rate: int, fmt: str | AudioFormat | None = None):
        self.path = Path(path)
        self.sample_rate = sample_rate
        self.fmt = parse_format(fmt) if fmt is not None else format_from_path(self.path)
        if self.fmt is AudioFormat.OPUS and sample_rate not in OPUS_RATES:
            raise AudioFormatError(
                f"Opus encodes only at {OPUS_RATES} Hz, not {sample_rate}; pick another format"
            )
        self._atomic = atomic_writer(self.path)
        self._sf: sf.SoundFile | None = None
        self._raw: BinaryIO | None = None

    def __enter__(self) -> AudioFileWriter:
        fh = self._atomic.__enter__()
        if self.fmt.is_raw:
            self._raw = fh
        else:
            container, subtype = _SF_ARGS[self.fmt]
            self._sf = sf.SoundFile(fh, "w", self.sample_rate, 1, subtype=subtype, format=container)
        return self

    def write(self, audio: np.ndarray) -> None:
        audio = np.asarray(audio, dtype=np.float32)
        if self._raw is not None:
            self._raw.write(to_pcm(audio, self.fmt))
        else:
            assert self._sf is not None
            self._sf.write(np.clip(audio, -1.0, 1.0))

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self._sf is not None:
                self._sf.close()
        finally:
            self._atomic.__exit__(exc_type, exc, tb)


class atomic_writer:
    """`with atomic_writer(path) as fh:` writes to a temporary file beside `path`, renamed on success only."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fh: BinaryIO | None = None
        self._tmp = ""

    def __enter__(self) -> BinaryIO:
        directory = self.path.parent if str(self.path.parent) else Path(".")
        if not directory.is_dir():
            raise OSError(f"cannot write {str(self.path)!r}: folder {str(directory)!r} does not exist")
        try:
            fd, self._tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".part", dir=directory)
        except OSError as exc:
            raise OSError(
                f"cannot write {str(self.path)!r}: {exc.strerror}; choose a writable folder"
            ) from exc
        self._fh = os.fdopen(fd, "wb")
        return self._fh

    def __exit__(self, exc_type, exc, tb) -> None:
        assert self._fh is not None
        self._fh.close()
        if exc_type is None:
            os.replace(self._tmp, self.path)
        else:
            os.unlink(self._tmp)
