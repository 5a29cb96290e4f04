"""Read audio files into float32 mono arrays and resample them.

Two resamplers, because upstream GPT-SoVITS uses two and its features depend on which:
- `soxr_hq` (libsoxr, "HQ" quality): what `librosa.load(path, sr=...)` does by default; upstream loads
  the 16 kHz HuBERT input this way, and `load_audio(..., method="soxr_hq")` equals it sample for sample.
- `sinc_hann`: a windowed-sinc resampler equal to `torchaudio.transforms.Resample` with its defaults
  (Hann window, 6 zero crossings, roll-off 0.99); upstream makes the 24 kHz reference mel and the
  32 kHz reference spectrogram this way. Written here in torch so torchaudio is not needed.
"""

from __future__ import annotations

import math
from enum import StrEnum
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr
import torch

from voicehub.choices import parse_choice
from voicehub.errors import AudioFormatError


class ResampleMethod(StrEnum):
    SOXR_HQ = "soxr_hq"
    SINC_HANN = "sinc_hann"


SINC_ZERO_CROSSINGS = 6  # torchaudio's lowpass_filter_width default
SINC_ROLLOFF = 0.99  # torchaudio's rolloff default, a fraction of the lower Nyquist


def parse_resample_method(method: str | ResampleMethod) -> ResampleMethod:
    """A ResampleMethod from its name; unknown names raise and list the valid ones."""
    return parse_choice(ResampleMethod, method, "resample method")


def read_audio(path: str | Path) -> tuple[np.ndarray, int]:
    """Decode any file libsndfile reads (WAV, FLAC, MP3, OGG/Opus, ...) into float32 [n] mono and its rate in Hz.

    Channels are averaged (as librosa does). Raises AudioFormatError naming the file when it is missing,
    cannot be decoded, or holds no samples.
    """
    path = Path(path)
    if not path.is_file():
        raise AudioFormatError(f"audio file {str(path)!r} does not exist or is not a file")
    try:
        data, sample_rate = sf.read(str(path), dtype="float32", always_2d=True)  # data: [n, channels]
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise AudioFormatError(
            f"cannot decode audio file {str(path)!r}: {exc}; use WAV, FLAC, MP3 or OGG audio"
        ) from exc
    if data.shape[0] == 0:
        raise AudioFormatError(f"audio file {str(path)!r} holds no samples")
    mono = data[:, 0] if data.shape[1] == 1 else data.mean(axis=1, dtype=np.float32)
    return np.ascontiguousarray(mono, dtype=np.float32), int(sample_rate)


def resample(
    audio: np.ndarray, orig_sr: int, target_sr: int, method: str | ResampleMethod = ResampleMethod.SOXR_HQ
) -> np.ndarray:
    """Resample float32 [n] audio from `orig_sr` to `target_sr` Hz; returns float32 [ceil(n * target_sr / orig_sr)]."""
    method = parse_resample_method(method)
    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim != 1:
        raise ValueError(f"expected mono audio of shape [n], got {audio.shape}")
    if orig_sr <= 0 or target_sr <= 0:
        raise ValueError(f"sample rates must be positive, got {orig_sr} -> {target_sr}")
    if orig_sr == target_sr:
        return audio.copy()
    if method is ResampleMethod.SINC_HANN:
        return sinc_hann_resample(torch.from_numpy(audio), orig_sr, target_sr).numpy()
    out = soxr.resample(audio, orig_sr, target_sr, quality="HQ")
    # librosa trims or zero-pads soxr's output to ceil(n * ratio); do the same to equal librosa.load.
    n_out = math.ceil(len(audio) * target_sr / orig_sr)
    out = out[:n_out] if len(out) >= n_out else np.pad(out, (0, n_out - len(out)))
    return np.ascontiguousarray(out, dtype=np.float32)


def load_audio(
    path: str | Path, sample_rate: int | None = None, method: str | ResampleMethod = ResampleMethod.SOXR_HQ
) -> np.ndarray:
    """float32 [n] mono audio of a file at `sample_rate` Hz (its own rate when None)."""
    audio, file_sr = read_audio(path)
    if sample_rate is None or sample_rate == file_sr:
        return audio
    return resample(audio, file_sr, sample_rate, method)


def _sinc_hann_kernel(orig: int, new: int) -> tuple[torch.Tensor, int]:
    """Polyphase kernel [new, 1, 2 * width + orig] for rates already divided by their gcd, and its half width."""
    cutoff = min(orig, new) * SINC_ROLLOFF  # in units of the reduced rates
    width = math.ceil(SINC_ZERO_CROSSINGS * orig / cutoff)
    # Computed in float64 then stored as float32, as torchaudio's Resample does.
    taps = (
        torch.arange(-width, width + orig, dtype=torch.float64) / orig
    )  # input positions, in reduced periods
    # Output phase of each polyphase branch; torchaudio divides an integer arange, which gives float32, and
    # matching that rounding keeps our kernel bit-equal to its kernel.
    phases = (-torch.arange(new)[:, None] / new).to(torch.float32)
    t = ((phases + taps[None, :]) * cutoff).clamp(-SINC_ZERO_CROSSINGS, SINC_ZERO_CROSSINGS)
    window = torch.cos(t * math.pi / SINC_ZERO_CROSSINGS / 2) ** 2
    t = t * math.pi
    sinc = torch.where(t == 0, torch.ones_like(t), torch.sin(t) / t)
    kernel = sinc * window * (cutoff / orig)
    return kernel[:, None, :].to(torch.float32), width


def sinc_hann_resample(audio: torch.Tensor, orig_sr: int, target_sr: int) -> torch.Tensor:
    """Windowed-sinc resampling equal to torchaudio.transforms.Resample(orig_sr, target_sr) with defaults.

    audio: [..., n] float tensor (any device); returns [..., ceil(n * target_sr / orig_sr)] in the same dtype.
    """
    if orig_sr == target_sr:
        return audio.clone()
    gcd = math.gcd(orig_sr, target_sr)
    orig, new = orig_sr // gcd, target_sr // gcd
    kernel, width = _sinc_hann_kernel(orig, new)
    shape = audio.shape
    x = audio.reshape(-1, shape[-1])  # x: [B, n]
    n = x.shape[-1]
    x = torch.nn.functional.pad(x, (width, width + orig))
    y = torch.nn.functional.conv1d(x[:, None, :], kernel.to(x), stride=orig)  # y: [B, new, n_blocks]
    # torchaudio rounds the length through a float32 tensor; doing the same keeps lengths equal to it.
    n_out = int(torch.ceil(torch.tensor(new * n / orig, dtype=torch.float32)))
    y = y.transpose(1, 2).reshape(x.shape[0], -1)[:, :n_out]
    return y.reshape(*shape[:-1], y.shape[-1])
