"""Reference handling: Voice, upstream's 3-10 s rule, the three reference inputs, the feature cache."""

import threading

import numpy as np
import pytest
import soundfile as sf
import torch

from voicehub.audio.load import sinc_hann_resample
from voicehub.audio.mel import MelSpectrogram, linear_spectrogram
from voicehub.errors import AudioFormatError, InvalidTextError
from voicehub.models.gpt_sovits.reference import (
    ReferenceAudioError,
    ReferenceCache,
    SpecConfig,
    Voice,
    load_reference_audio,
    reference_log_mel,
    reference_spectrogram,
)
from voicehub.text.options import Language


def _write(path, seconds, sr=24000, channels=1, amplitude=0.3):
    rng = np.random.default_rng(int(seconds * 1000) + channels)
    audio = (amplitude * rng.standard_normal((int(round(seconds * sr)), channels))).astype(np.float32)
    sf.write(path, audio, sr, subtype="FLOAT")
    return audio


def test_voice_parses_language_and_rejects_empty_prompt(tmp_path):
    voice = Voice(str(tmp_path / "a.wav"), "你好。", "中文")
    assert voice.prompt_language is Language.ALL_ZH and voice.ref_audio_path == tmp_path / "a.wav"
    with pytest.raises(InvalidTextError, match="prompt text is empty"):
        Voice(tmp_path / "a.wav", "  \n", "en")
    with pytest.raises(ValueError, match="all_zh"):
        Voice(tmp_path / "a.wav", "hi", "klingon")
    with pytest.raises(AttributeError):
        voice.prompt_text = "x"  # frozen


@pytest.mark.parametrize("seconds, ok", [(2.9, False), (3.0, True), (10.0, True), (10.1, False)])
def test_three_to_ten_seconds(tmp_path, seconds, ok):
    path = tmp_path / "r.wav"
    _write(path, seconds, sr=44100)
    if ok:
        ref = load_reference_audio(path)
        assert ref.duration_s == pytest.approx(seconds, abs=1e-3) and ref.sample_rate == 44100
    else:
        with pytest.raises(ReferenceAudioError, match=f"{seconds:.2f} s long.*3 to 10 s"):
            load_reference_audio(path)


def test_unreadable_reference(tmp_path):
    path = tmp_path / "bad.wav"
    path.write_bytes(b"RIFF....nonsense")
    with pytest.raises(AudioFormatError, match="bad.wav"):
        load_reference_audio(path)


def test_mel_and_spectrogram_follow_upstream_recipe(tmp_path):
    path = tmp_path / "r.wav"
    audio = _write(path, 3.5, sr=48000, channels=2, amplitude=0.8)  # peaks above 1 exercise the peak rule
    ref = load_reference_audio(path)
    mono = torch.from_numpy(audio.mean(axis=1))[None]
    mel = reference_log_mel(ref)  # raw log-mel: encode_reference applies norm_spec
    expected_mel = MelSpectrogram()(sinc_hann_resample(mono, 48000, 24000))
    torch.testing.assert_close(mel, expected_mel, atol=1e-5, rtol=1e-5)
    assert mel.shape == (1, 100, 3.5 * 24000 // 256)
    x32 = sinc_hann_resample(mono, 48000, 32000)
    assert x32.abs().max() > 1
    x32 = x32 / min(2.0, float(x32.abs().max()))
    spec = reference_spectrogram(ref, SpecConfig())
    torch.testing.assert_close(spec, linear_spectrogram(x32, 2048, 640, 2048), atol=1e-5, rtol=1e-5)
    assert spec.shape == (1, 1025, 3.5 * 32000 // 640)


def test_cache_by_content_and_model(tmp_path):
    a, b, a_copy = tmp_path / "a.wav", tmp_path / "b.wav", tmp_path / "a_copy.wav"
    _write(a, 3.2)
    _write(b, 4.0)
    a_copy.write_bytes(a.read_bytes())
    cache = ReferenceCache(capacity=2)
    calls = []

    def compute(tag):
        return lambda: calls.append(tag) or tag

    assert cache.get_or_compute(a, "m1", compute("a1")) == "a1"
    assert cache.get_or_compute(a_copy, "m1", compute("again")) == "a1"  # same bytes, other name: a hit
    assert cache.get_or_compute(a, "m2", compute("a2")) == "a2"  # another model: a miss
    assert cache.get_or_compute(b, "m1", compute("b1")) == "b1"  # evicts (a, m1), the least recent
    assert cache.get_or_compute(a, "m1", compute("a1'")) == "a1'"
    assert calls == ["a1", "a2", "b1", "a1'"] and (cache.hits, cache.misses) == (1, 4) and len(cache) == 2


def test_cache_names_a_missing_file(tmp_path):
    cache = ReferenceCache()
    for missing in (tmp_path / "gone.wav", tmp_path):  # no file, and a folder
        with pytest.raises(AudioFormatError, match=f"{missing.name}.*does not exist"):
            cache.get_or_compute(missing, "m", lambda: 1)
    assert cache.misses == 0 and len(cache) == 0


def test_cache_capacity_zero_and_threads(tmp_path):
    a = tmp_path / "a.wav"
    _write(a, 3.2)
    off = ReferenceCache(capacity=0)
    off.get_or_compute(a, "m", lambda: 1)
    assert len(off) == 0 and off.misses == 1
    with pytest.raises(ValueError, match=">= 0"):
        ReferenceCache(capacity=-1)
    cache = ReferenceCache(capacity=4)
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(cache.get_or_compute(a, "m", lambda: 7)))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [7] * 8 and len(cache) == 1 and cache.hits + cache.misses == 8
