"""Reference audio of registry voices: decode and check an upload, store it atomically, sweep leftovers.

The files live in one folder that `VoiceRegistry` (voices.py) owns; the registry's rows say which
files are in use. A file is written to a temporary `.part` name, fsynced and renamed to a fresh
unique name, so a reader never sees a half-written file under a final name.
"""

from __future__ import annotations

import io
import os
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import soundfile as sf

from voicehub.errors import AudioFormatError, VoiceHubError

MIN_REFERENCE_S = 3.0  # GPT-SoVITS rejects references outside 3-10 s
MAX_REFERENCE_S = 10.0
PART_SUFFIX = ".part"  # a file being written; never a final name


class VoiceError(VoiceHubError, ValueError):
    """A voice's name, fields or reference audio are invalid."""


def decode_reference(
    data: bytes,
    *,
    sample_rate: int | None = None,
    min_s: float = MIN_REFERENCE_S,
    max_s: float = MAX_REFERENCE_S,
) -> tuple[np.ndarray, int]:
    """Decode uploaded audio into float32 [n] mono at `sample_rate` (None: its own rate); checks its length.

    Raises AudioFormatError when it does not decode, and VoiceError when it is outside [min_s, max_s].
    """
    try:
        audio, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)  # audio: [n, channels]
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise AudioFormatError(
            f"reference audio cannot be decoded ({exc}); upload WAV, FLAC, MP3 or OGG audio"
        ) from None
    if audio.shape[0] == 0 or not np.isfinite(audio).all():
        raise AudioFormatError("reference audio holds no samples or non-finite samples")
    mono = audio.mean(axis=1, dtype=np.float32) if audio.shape[1] > 1 else audio[:, 0]
    duration = len(mono) / rate
    if not min_s <= duration <= max_s:
        raise VoiceError(
            f"reference audio is {duration:.2f} s long; it must be {min_s:g}-{max_s:g} s: trim or pick another clip"
        )
    if sample_rate is not None and sample_rate != rate:
        import soxr

        mono = soxr.resample(mono, rate, sample_rate, quality="HQ").astype(np.float32)
        rate = sample_rate
    return np.ascontiguousarray(mono, dtype=np.float32), int(rate)


def read_audio_arg(audio: bytes | bytearray | str | Path) -> bytes:
    """The audio file's bytes: given as bytes, or read from a local path (AudioFormatError if missing)."""
    if isinstance(audio, bytes | bytearray):
        return bytes(audio)
    path = Path(audio).expanduser()
    if not path.is_file():
        raise AudioFormatError(f"reference audio file {str(path)!r} does not exist")
    return path.read_bytes()


def store_audio(audio_dir: Path, name: str, samples: np.ndarray, rate: int) -> Path:
    """Write float32 [n] `samples` as float WAV (lossless) under a fresh unique name; returns its path.

    `name` must already be a checked voice name (it becomes part of the file name). The file is
    written to a temporary file, fsynced and renamed, so it is whole or absent.
    """
    final = audio_dir / f"{name}-{uuid.uuid4().hex[:12]}.wav"
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=PART_SUFFIX, dir=audio_dir)
    try:
        with os.fdopen(fd, "wb") as fh:
            sf.write(fh, samples, rate, format="WAV", subtype="FLOAT")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return final


def sweep_audio(audio_dir: Path, referenced: set[str], min_age_s: float = 60.0) -> list[Path]:
    """Remove `.part` files and WAV files whose names are not in `referenced`; returns what went.

    Files younger than `min_age_s` are kept: they may belong to a write in progress in another process.
    """
    removed = []
    for path in audio_dir.iterdir():
        is_old = time.time() - path.stat().st_mtime >= min_age_s
        is_part = path.name.endswith(PART_SUFFIX)
        is_orphan = path.suffix == ".wav" and path.name not in referenced
        if is_old and (is_part or is_orphan):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed
