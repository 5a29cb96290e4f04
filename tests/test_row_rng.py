"""Per-row counter noise (runtime/row_rng.py): Exp(1) noise that is never 0, and rows independent of
their batch."""

from __future__ import annotations

import torch

from voicehub.runtime.row_rng import exponential_noise, hash_noise, row_keys, vocab_keys
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
