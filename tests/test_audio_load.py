"""Audio loading: decoding, mono mix, both resamplers against the libraries upstream uses, errors."""

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from voicehub.audio.load import load_audio, parse_resample_method, read_audio, resample, sinc_hann_resample
from voicehub.errors import AudioFormatError

DATA = Path(__file__).parent / "data" / "mel"


def _tone(sr: int, seconds: float, freq: float = 440.0) -> np.ndarray:
    t = np.arange(int(sr * seconds)) / sr
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def test_stereo_is_averaged_and_rate_kept(tmp_path):
    left, right = _tone(22050, 0.2), _tone(22050, 0.2, 880.0)
    path = tmp_path / "st.wav"
    sf.write(path, np.stack([left, right], axis=1), 22050, subtype="FLOAT")
    audio, sr = read_audio(path)
    assert sr == 22050 and audio.dtype == np.float32 and audio.shape == left.shape
    np.testing.assert_allclose(audio, (left + right) / 2, atol=1e-7)


@pytest.mark.parametrize("fmt, subtype", [("wav", "PCM_16"), ("flac", "PCM_16"), ("ogg", "VORBIS")])
def test_load_equals_librosa_load(tmp_path, fmt, subtype):
    """Upstream loads the HuBERT input with librosa.load(path, sr=16000) (soxr_hq); we must equal it."""
    librosa = pytest.importorskip("librosa")
    path = tmp_path / f"a.{fmt}"
    sf.write(path, np.stack([_tone(44100, 0.5), _tone(44100, 0.5, 300.0)], axis=1), 44100, format=fmt.upper(),
             subtype=subtype)  # fmt: skip
    ours = load_audio(path, 16000)
    theirs, _ = librosa.load(path, sr=16000)
    assert ours.shape == theirs.shape
    np.testing.assert_array_equal(ours, theirs)


def test_soxr_resample_keeps_a_tone():
    out = resample(_tone(48000, 1.0, 1000.0), 48000, 16000)
    assert out.shape == (16000,)
    spectrum = np.abs(np.fft.rfft(out))
    assert abs(int(np.argmax(spectrum)) - 1000) <= 1  # 1 Hz bins over one second


@pytest.mark.parametrize("rates", ["44100_24000", "16000_24000", "48000_32000", "22050_16000"])
def test_sinc_hann_equals_torchaudio(rates):
    """Upstream resamples the reference for its mel and spectrogram with torchaudio.transforms.Resample."""
    data = np.load(DATA / "torchaudio_resample.npz")
    sr0, sr1 = map(int, rates.split("_"))
    ours = sinc_hann_resample(torch.from_numpy(data[f"in_{rates}"]), sr0, sr1).numpy()
    assert ours.shape == data[f"out_{rates}"].shape
    np.testing.assert_allclose(ours, data[f"out_{rates}"], atol=1e-6, rtol=0)
    # `resample(..., "sinc_hann")` must route to the same resampler. Not bit for bit: CPU conv1d can round
    # differently (1 ulp) on another buffer of the same values. soxr, the other route, differs by far more.
    routed = resample(data[f"in_{rates}"], sr0, sr1, "sinc_hann")
    np.testing.assert_allclose(routed, ours, atol=1e-6, rtol=0)
    assert np.abs(resample(data[f"in_{rates}"], sr0, sr1, "soxr_hq") - ours).max() > 1e-4


def test_same_rate_is_a_copy():
    x = _tone(16000, 0.1)
    y = resample(x, 16000, 16000)
    assert y is not x
    np.testing.assert_array_equal(x, y)


def test_missing_file_names_it(tmp_path):
    with pytest.raises(AudioFormatError, match="nope.wav"):
        load_audio(tmp_path / "nope.wav")


def test_undecodable_file_names_it(tmp_path):
    path = tmp_path / "junk.wav"
    path.write_bytes(b"this is not audio" * 10)
    with pytest.raises(AudioFormatError, match="junk.wav"):
        load_audio(path, 16000)


def test_empty_file_raises(tmp_path):
    path = tmp_path / "empty.wav"
    sf.write(path, np.zeros(0, dtype=np.float32), 16000)
    with pytest.raises(AudioFormatError, match="no samples"):
        read_audio(path)


def test_bad_arguments():
    with pytest.raises(ValueError, match="soxr_hq, sinc_hann"):
        parse_resample_method("linear")
    with pytest.raises(ValueError, match="mono"):
        resample(np.zeros((2, 10), np.float32), 16000, 8000)
