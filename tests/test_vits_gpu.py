"""The VITS model on CUDA: fp32 equals the CPU path, fp16 stays close, generate/stream run there."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from voicehub.models.vits import load, resolve
from voicehub.models.vits.phonemes import Sentence, phoneme_ids

pytestmark = pytest.mark.gpu

CUDA_FP32_TOL = 1e-3  # max abs vs the CPU, noise off (kernels differ, not the function)
FP16_MIN_SNR_DB = 20.0
# Phoneme strings (espeak-ng's output for short sentences), given directly so no phonemizer is needed.
PHONEMES = ("həlˈoʊ wˈɜːld.", "ðə kwˈɪk bɹˈaʊn fˈɑːks dʒˈʌmps ˌoʊvɚ ðə lˈeɪzi dˈɑːɡ.")


def _snr_db(ref: np.ndarray, test: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref**2) / max(np.sum((ref - test) ** 2), 1e-20)))


@pytest.fixture(scope="module")
def voices():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    path = resolve("en_US-joe-medium")
    if path is None:
        pytest.fail(
            "the en_US-joe-medium voice package is not installed here (see ASSETS.md; carry its wheel)"
        )
    return load(path), load(path, device="cuda"), load(path, device="cuda", dtype="fp16")


def _run(model, ids: list[int]) -> np.ndarray:
    with torch.inference_mode(), model.precision():
        out = model.network(torch.tensor([ids], device=model.device), (0.0, 1.0, 0.0))
    return out[0].float().cpu().numpy()


@pytest.mark.parametrize("phonemes", PHONEMES)
def test_cuda_matches_cpu(voices, phonemes):
    cpu, cuda, half = voices
    ids = phoneme_ids(list(phonemes), cpu.voice.phoneme_id_map)
    ref = _run(cpu, ids)
    got = _run(cuda, ids)
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() <= CUDA_FP32_TOL
    got16 = _run(half, ids)
    if got16.shape == ref.shape:  # fp16 durations may round a frame differently
        assert _snr_db(ref, got16) >= FP16_MIN_SNR_DB
    else:
        assert abs(len(got16) - len(ref)) <= 4 * cuda.architecture.hop_length


def test_generate_and_stream_on_cuda(voices, monkeypatch):
    _, cuda, _ = voices
    sentences = [Sentence("Hello world.", tuple(PHONEMES[0])), Sentence("The quick...", tuple(PHONEMES[1]))]
    monkeypatch.setattr(cuda, "phonemize", lambda text: iter(sentences))
    whole = cuda.generate("Hello world. The quick...", seed=2, window_frames=24, context_frames=12)
    chunks = list(cuda.stream("Hello world. The quick...", seed=2, window_frames=24, context_frames=12))
    joined = np.concatenate([c.audio for c in chunks])
    assert joined.shape == whole.audio.shape and np.abs(joined - whole.audio).max() <= 1e-3
    assert chunks[-1].is_last and len(chunks) > 2
