"""v3 mel and reference spectrogram: against an independent float64 reference and against upstream's arrays."""

from pathlib import Path

import numpy as np
import pytest
import torch

from voicehub.audio.mel import (
    SPEC_MAX,
    SPEC_MIN,
    V3_MEL,
    MelConfig,
    MelSpectrogram,
    denorm_spec,
    linear_spectrogram,
    mel_filterbank,
    norm_spec,
)

DATA = Path(__file__).parent / "data" / "mel"


def _reference_log_mel(signal: np.ndarray, cfg: MelConfig) -> np.ndarray:
    """float64 log-mel from first principles: reflect pad, framing, periodic Hann, rfft, librosa filters."""
    librosa = pytest.importorskip("librosa")
    pad = (cfg.n_fft - cfg.hop_length) // 2
    x = np.pad(signal.astype(np.float64), (pad, pad), mode="reflect")
    n_frames = (len(x) - cfg.n_fft) // cfg.hop_length + 1
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(cfg.win_length) / cfg.win_length)
    frames = np.stack(
        [x[i * cfg.hop_length : i * cfg.hop_length + cfg.n_fft] * window for i in range(n_frames)]
    )
    magnitude = np.sqrt(np.abs(np.fft.rfft(frames, axis=1)) ** 2 + 1e-8).T  # [n_fft // 2 + 1, frames]
    bank = librosa.filters.mel(sr=cfg.sample_rate, n_fft=cfg.n_fft, n_mels=cfg.n_mels, fmin=cfg.fmin,
                               fmax=cfg.fmax, dtype=np.float64)  # fmt: skip
    return np.log(np.maximum(bank @ magnitude, 1e-5))


def test_filterbank_equals_librosa_slaney():
    librosa = pytest.importorskip("librosa")
    for sr, n_fft, n_mels, fmax in (
        (24000, 1024, 100, None),
        (32000, 1280, 100, None),
        (22050, 1024, 80, 8000),
    ):
        ours = mel_filterbank(sr, n_fft, n_mels, 0.0, fmax)
        theirs = librosa.filters.mel(sr=sr, n_fft=n_fft, n_mels=n_mels, fmin=0.0, fmax=fmax, dtype=np.float64)
        np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-14)


def test_v3_mel_matches_float64_reference():
    rng = np.random.default_rng(0)
    t = np.arange(12000) / 24000
    signal = (0.5 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.standard_normal(12000)).astype(np.float32)
    ours = MelSpectrogram(V3_MEL)(torch.from_numpy(signal))[0].numpy()
    ref = _reference_log_mel(signal, V3_MEL)
    assert ours.shape == (100, 12000 // 256) == ref.shape
    # float32 STFT against float64: magnitudes agree to ~1e-5 relative, so log-mel to ~1e-4 absolute.
    np.testing.assert_allclose(ours, ref, atol=2e-4, rtol=0)


def test_v3_mel_matches_upstream_array():
    data = np.load(DATA / "upstream_v3_mel.npz")
    ours = MelSpectrogram()(torch.from_numpy(data["signal"])[None])[0].numpy()
    assert ours.shape == data["mel"].shape == (100, 28)
    np.testing.assert_allclose(ours, data["mel"], atol=1e-5, rtol=0)


def test_refer_spectrogram_matches_upstream_array():
    data = np.load(DATA / "upstream_v3_refer_spec.npz")
    ours = linear_spectrogram(torch.from_numpy(data["signal"]), n_fft=2048, hop_length=640, win_length=2048)
    assert ours.shape[1:] == data["spec"].shape == (1025, 10)
    # fp32 FFT rounding is up to ~eps * log2(n_fft) * max|X| (2.6e-4 here, max|X| ~199): a clean CI machine's
    # FFT path missed atol 1e-5 by 1.5e-5 on one bin of 10,250; a wrong window, hop or padding is off by ~1e-1
    atol = float(np.finfo(np.float32).eps * np.log2(2048) * np.abs(data["spec"]).max())
    np.testing.assert_allclose(ours[0].numpy(), data["spec"], rtol=1e-5, atol=atol)


def test_frame_count_and_batch():
    mel = MelSpectrogram()
    audio = torch.randn(2, 24000) * 0.1
    out = mel(audio)
    assert out.shape == (2, 100, mel.n_frames(24000)) == (2, 100, 93)
    torch.testing.assert_close(out[1], mel(audio[1])[0])


def test_too_short_audio_raises():
    with pytest.raises(ValueError, match="too short"):
        MelSpectrogram()(torch.zeros(100))


def test_norm_denorm_roundtrip_and_range():
    x = torch.linspace(SPEC_MIN, SPEC_MAX, 11)
    y = norm_spec(x)
    assert y[0].item() == pytest.approx(-1.0) and y[-1].item() == pytest.approx(1.0)
    torch.testing.assert_close(denorm_spec(y), x)


def test_bad_config_raises():
    with pytest.raises(ValueError, match="win_length"):
        MelConfig(sample_rate=24000, n_fft=512, hop_length=256, win_length=1024, n_mels=100)
