"""Per-row counter noise (runtime/row_rng.py): Exp(1) noise that is never 0, and rows independent of
their batch; the ROW_NOISE op's Triton kernel equal to its definition bit for bit (interpreted on the
CPU; compiled on a GPU)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from voicehub.runtime.kernels import registry
from voicehub.runtime.row_rng import MASK32, exponential_noise, hash_noise, row_keys, row_noise, vocab_keys
from voicehub.runtime.sampling import draw

TOP = 0xFFFFFFFF  # every kept bit set: the largest uniform, 1 - 2^-25


def test_noise_is_positive_and_finite_at_the_extreme_hashes():
    noise = hash_noise(torch.tensor([0, 0xFF, 0x7FFFFF00, 0xFFFFFE00, TOP]))
    assert noise.dtype == torch.float32
    assert bool(torch.isfinite(noise).all()) and bool((noise > 0).all())
    assert abs(float(noise[-1]) - 2.0**-25) < 1e-12  # -log(1 - 2^-25); float32 arithmetic gave 0
    assert abs(float(noise[0]) - 17.3287) < 1e-3  # -log(2^-25), the smallest uniform


def test_a_top_k_1_race_never_takes_a_filtered_token():
    """A zero in the noise made filtered entries 0 / 0 = NaN, and argmax took the NaN: a wrong token."""
    probs = torch.zeros(1, 8)
    probs[0, 3] = 1.0  # top_k 1: one token left
    h = torch.full((1, 8), 0x12345678)
    h[0, 0] = TOP  # the largest hash on a filtered entry
    assert int(draw(probs, noise=hash_noise(h))[0]) == 3


def test_a_rows_noise_does_not_depend_on_its_batch():
    vocab = vocab_keys(1025, "cpu")
    lo, hi, step = torch.tensor([5, 7, 9]), torch.tensor([0, 1, 2]), torch.tensor([0, 3, 11])
    together = exponential_noise(row_keys(lo, hi, step), vocab)
    alone = exponential_noise(row_keys(lo[1:2], hi[1:2], step[1:2]), vocab)
    assert torch.equal(together[1:2], alone) and bool((together > 0).all())
    assert abs(float(together.mean()) - 1.0) < 0.05  # Exp(1)


def noise_inputs(n_rows: int, device: str = "cpu") -> tuple[torch.Tensor, ...]:
    """(seed_lo, seed_hi, step): seeds over all 64 bits (the extremes included), steps from 0 to 2000."""
    g = torch.Generator().manual_seed(n_rows)
    # columns of one [B, 7] tensor, as the engine's prefill passes them (strided)
    packed = torch.randint(0, MASK32 + 1, (n_rows, 7), generator=g)
    packed[:, 2] = torch.randint(0, 2000, (n_rows,), generator=g)  # the steps, to past the decode limit
    packed[0, 2], packed[0, 5], packed[0, 6] = 0, 0, MASK32
    packed[-1, 5], packed[-1, 6] = MASK32, 0
    packed = packed.to(device)
    return packed[:, 5], packed[:, 6], packed[:, 2]


@pytest.mark.parametrize(("n_rows", "n_vocab"), [(1, 1025), (3, 7), (5, 300)])
def test_row_noise_triton_equals_the_definition_bit_for_bit(n_rows: int, n_vocab: int, monkeypatch):
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed (pip install triton): the noise kernel is untested here")
    if torch.cuda.is_available():
        pytest.skip(
            "the interpreted kernel is tested on CPU-only machines (the GPU test below runs it compiled)"
        )
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kernel = registry.resolve(registry.ROW_NOISE, "triton", "cpu")
    vocab = vocab_keys(n_vocab, "cpu")
    lo, hi, step = noise_inputs(n_rows)
    got = kernel(lo, hi, step, vocab)
    assert got.dtype == torch.float32 and got.shape == (n_rows, n_vocab)
    assert torch.equal(got, row_noise(lo, hi, step, vocab))
    assert registry.reference(registry.ROW_NOISE) is row_noise


@pytest.mark.gpu
def test_cuda_row_noise_triton_equals_the_definition_bit_for_bit():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    kernel = registry.resolve(registry.ROW_NOISE, "triton", "cuda")
    for n_rows in (1, 64, 128):
        vocab = vocab_keys(1025, "cuda")
        lo, hi, step = noise_inputs(n_rows, "cuda")
        got = kernel(lo, hi, step, vocab)
        assert torch.equal(got, row_noise(lo, hi, step, vocab)), n_rows
        assert torch.equal(got.cpu(), row_noise(lo.cpu(), hi.cpu(), step.cpu(), vocab.cpu())), n_rows
