"""Spectrograms exactly as upstream GPT-SoVITS computes them (module/mel_processing.py at the pinned commit).

- `MelSpectrogram(V3_MEL)`: the v3 `mel_fn` (24 kHz, n_fft 1024, hop 256, win 1024, 100 Slaney mels, fmin 0,
  fmax Nyquist), the CFM's mel space; `norm_spec` / `denorm_spec` map it to and from [-1, 1].
- `linear_spectrogram`: upstream's `spectrogram_torch`, the reference encoder's input (v3 SoVITS: 32 kHz,
  2048 / 640 / 2048).
Both pad (n_fft - hop) / 2 samples on each side by reflection and run the STFT with center=False, as
upstream does, so an input of n samples gives n // hop frames (v3: n_fft - hop is even). The Slaney filterbank is computed here
(no librosa needed at run time) and tested against librosa's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

SPEC_MIN = -12.0  # upstream v3 norm_spec range, in log-magnitude units
SPEC_MAX = 2.0
LOG_CLAMP = 1e-5  # magnitudes are clamped here before the log (upstream dynamic_range_compression_torch)
MAGNITUDE_EPS = 1e-8  # added to |X|^2 before the square root, as upstream does


@dataclass(frozen=True)
class MelConfig:
    """STFT and filterbank settings; fmax None means the Nyquist frequency."""

    sample_rate: int  # Hz
    n_fft: int  # samples
    hop_length: int  # samples per frame
    win_length: int  # samples
    n_mels: int
    fmin: float = 0.0  # Hz
    fmax: float | None = None  # Hz

    def __post_init__(self) -> None:
        if not 0 < self.win_length <= self.n_fft:
            raise ValueError(f"win_length must be in (0, n_fft={self.n_fft}], got {self.win_length}")
        if not 0 < self.hop_length <= self.n_fft:
            raise ValueError(f"hop_length must be in (0, n_fft={self.n_fft}], got {self.hop_length}")
        if self.n_mels <= 0 or self.sample_rate <= 0:
            raise ValueError("n_mels and sample_rate must be positive")


# upstream v3 `mel_fn` (GPT_SoVITS/inference_webui.py, TTS_infer_pack/TTS.py)
V3_MEL = MelConfig(sample_rate=24000, n_fft=1024, hop_length=256, win_length=1024, n_mels=100)


def norm_spec(x: torch.Tensor) -> torch.Tensor:
    """Log-mel [..., n_mels, T] to the CFM's [-1, 1] range (upstream v3 norm_spec)."""
    return (x - SPEC_MIN) / (SPEC_MAX - SPEC_MIN) * 2 - 1


def denorm_spec(x: torch.Tensor) -> torch.Tensor:
    """Inverse of `norm_spec`: CFM output [..., n_mels, T] back to log-mel."""
    return (x + 1) / 2 * (SPEC_MAX - SPEC_MIN) + SPEC_MIN


def _hz_to_slaney_mel(hz: np.ndarray) -> np.ndarray:
    # Slaney's Auditory Toolbox scale: linear below 1 kHz, logarithmic above (librosa htk=False).
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, log_step = min_log_hz / f_sp, np.log(6.4) / 27.0
    hz = np.asarray(hz, dtype=np.float64)
    mel = hz / f_sp
    above = hz >= min_log_hz
    mel[above] = min_log_mel + np.log(hz[above] / min_log_hz) / log_step
    return mel


def _slaney_mel_to_hz(mel: np.ndarray) -> np.ndarray:
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, log_step = min_log_hz / f_sp, np.log(6.4) / 27.0
    hz = f_sp * mel
    above = mel >= min_log_mel
    hz[above] = min_log_hz * np.exp(log_step * (mel[above] - min_log_mel))
    return hz


def mel_filterbank(
    sample_rate: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: float | None = None
) -> np.ndarray:
    """Slaney-scale, Slaney-normalised triangular filters, float64 [n_mels, n_fft // 2 + 1].

    Same filters as `librosa.filters.mel(sr, n_fft, n_mels, fmin, fmax)` (its defaults: htk=False,
    norm="slaney"), which upstream uses.
    """
    fmax = sample_rate / 2.0 if fmax is None else float(fmax)
    fft_hz = np.linspace(0.0, sample_rate / 2.0, n_fft // 2 + 1)
    edges_mel = np.linspace(
        _hz_to_slaney_mel(np.array([fmin]))[0], _hz_to_slaney_mel(np.array([fmax]))[0], n_mels + 2
    )
    edges_hz = _slaney_mel_to_hz(edges_mel)
    widths = np.diff(edges_hz)  # [n_mels + 1]
    rising = (fft_hz[None, :] - edges_hz[:-2, None]) / widths[:-1, None]
    falling = (edges_hz[2:, None] - fft_hz[None, :]) / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(rising, falling))
    # Slaney normalisation: each filter has unit area in Hz.
    return weights * (2.0 / (edges_hz[2:] - edges_hz[:-2]))[:, None]


def _stft_magnitude(audio: torch.Tensor, window: torch.Tensor, n_fft: int, hop_length: int) -> torch.Tensor:
    # audio: [B, n] -> [B, n_fft // 2 + 1, frames]
    pad = (n_fft - hop_length) // 2
    if audio.shape[-1] <= pad:
        raise ValueError(
            f"audio of {audio.shape[-1]} samples is too short for n_fft {n_fft}: need more than {pad}"
        )
    padded = torch.nn.functional.pad(audio[:, None, :], (pad, pad), mode="reflect")[:, 0, :]
    spec = torch.stft(
        padded, n_fft, hop_length=hop_length, win_length=window.shape[0], window=window, center=False,
        normalized=False, onesided=True, return_complex=True,
    )  # fmt: skip
    return torch.sqrt(spec.real.pow(2) + spec.imag.pow(2) + MAGNITUDE_EPS)


def linear_spectrogram(audio: torch.Tensor, n_fft: int, hop_length: int, win_length: int) -> torch.Tensor:
    """Magnitude spectrogram as upstream's `spectrogram_torch`.

    audio: [B, n] or [n] float in [-1, 1]; returns [B, n_fft // 2 + 1, frames] in audio's dtype.
    """
    audio = audio[None] if audio.dim() == 1 else audio
    window = torch.hann_window(win_length, dtype=audio.dtype, device=audio.device)
    return _stft_magnitude(audio, window, n_fft, hop_length)


class MelSpectrogram(torch.nn.Module):
    """Log-mel spectrogram (natural log, magnitudes clamped at 1e-5), upstream `mel_spectrogram_torch`.

    The window and filterbank are buffers, so `.to(device, dtype)` moves them once.
    """

    def __init__(self, config: MelConfig = V3_MEL):
        super().__init__()
        self.config = config
        bank = mel_filterbank(config.sample_rate, config.n_fft, config.n_mels, config.fmin, config.fmax)
        # librosa returns float32 filters; upstream multiplies with those, so round the same way.
        self.register_buffer("filterbank", torch.from_numpy(bank.astype(np.float32)), persistent=False)
        self.register_buffer("window", torch.hann_window(config.win_length), persistent=False)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        """audio: [B, n] or [n] at config.sample_rate -> log-mel [B, n_mels, frames]."""
        # audio: [B, n]
        audio = audio[None] if audio.dim() == 1 else audio
        window = self.window.to(audio)
        magnitude = _stft_magnitude(audio, window, self.config.n_fft, self.config.hop_length)
        mel = torch.matmul(self.filterbank.to(audio), magnitude)
        return torch.log(torch.clamp(mel, min=LOG_CLAMP))

    def n_frames(self, n_samples: int) -> int:
        """Frames produced for `n_samples` input samples."""
        pad = (self.config.n_fft - self.config.hop_length) // 2
        return (n_samples + 2 * pad - self.config.n_fft) // self.config.hop_length + 1
