"""Per-row random streams for batched sampling: counter-based Exp(1) noise, no generator state.

A shared `torch.Generator` hands each row of a batch the next slice of one stream, so a row's draws
depend on which other rows happen to share its steps. For continuous batching (rows join and leave
at any step) a row's tokens must depend on its own inputs only. Here the noise of entry
(row seed, row step, vocab index) is a pure function of those three integers: a 32-bit integer hash
(Wellons' "lowbias32" mixer, applied in rounds over the key words) turned into a uniform in (0, 1)
and then into Exp(1) noise by -log(u). It is computed with plain int64 tensor ops on the device, so
a step that draws it stays capturable (no host sync, no branch on values) and its result is the same
on any device and for any batch composition.

The choice against a Philox generator per row: torch exposes no per-row offset for one generator,
and B generators would mean B kernel launches per step. The hash is not a cryptographic or
statistically certified generator; 24 bits of each hash give the uniform, enough for the
exponential race (ties at 2^-24 resolution are far rarer than logit ties).

This is NOT upstream's stream: a fixed seed gives different tokens than GPT-SoVITS's
`torch.manual_seed` path. Decoders that must match upstream keep the shared generator.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
UNIFORM_BITS = 24  # bits of the hash kept for the uniform (u and its log in float64: `hash_noise`)
# lowbias32 multipliers (Chris Wellons, hash-prospector), and odd constants that separate key words
MIX_A, MIX_B = 0x7FEB352D, 0x846CA68B
KEY_STEP, KEY_VOCAB = 0x9E3779B9, 0x85EBCA6B


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for x in [0, 2^32) int64, without int64 overflow: c is split in 16-bit halves."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & MASK32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32: a bijective avalanche of 32-bit values held in int64 tensors (any shape)."""
    x = x & MASK32
    x = _mul32(x ^ (x >> 16), MIX_A)
    x = _mul32(x ^ (x >> 15), MIX_B)
    return x ^ (x >> 16)


def split_seed(seed: int) -> tuple[int, int]:
    """A Python int seed (any size, negative allowed) as two 32-bit words (low, high)."""
    seed &= (1 << 64) - 1
    return seed & MASK32, seed >> 32


def row_keys(seed_lo: torch.Tensor, seed_hi: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """One 32-bit key per row for this step. seed_lo, seed_hi, step: [B] int64 -> [B] int64."""
    h = mix32(seed_lo)
    h = mix32(h ^ seed_hi)
    return mix32(h ^ ((step * 2 + 1) & MASK32) ^ KEY_STEP)


def vocab_keys(n_vocab: int, device: torch.device | str) -> torch.Tensor:
    """[V] int64 hashes of the vocabulary indices; allocate once and reuse every step."""
    return mix32(torch.arange(n_vocab, dtype=torch.long, device=device) ^ KEY_VOCAB)


def exponential_noise(keys: torch.Tensor, vocab: torch.Tensor) -> torch.Tensor:
    """Exp(1) noise [B, V] float32 from row keys [B] and vocab hashes [V] (both int64).

    Entry (b, j) depends on keys[b] and vocab[j] only, so a row's noise is the same whatever rows
    it shares the batch with, and the same for a narrowed vocabulary (a prefix of it)."""
    h = mix32(mix32(keys.unsqueeze(1) ^ vocab.unsqueeze(0)) ^ keys.unsqueeze(1))  # [B, V]
    return hash_noise(h)


def hash_noise(h: torch.Tensor) -> torch.Tensor:
    """Exp(1) noise, float32 and > 0, from 32-bit hashes (int64): the top UNIFORM_BITS as a uniform u in
    (0, 1), then -log(u). u and its log are computed in float64: in float32 the largest u, 1 - 2^-25,
    rounds to 1.0 and its noise to 0, and a zero turns the exponential race's filtered-out entries into
    0 / 0 = NaN, which argmax takes: a wrong token about once in 2^24 entries, even for top_k 1."""
    u = ((h >> (32 - UNIFORM_BITS)).double() + 0.5) * (1.0 / (1 << UNIFORM_BITS))
    return (-torch.log(u)).float()


def row_noise(
    seed_lo: torch.Tensor, seed_hi: torch.Tensor, step: torch.Tensor, vocab: torch.Tensor
) -> torch.Tensor:
    """ROW_NOISE's definition: `exponential_noise(row_keys(seed_lo, seed_hi, step), vocab)`, a decode
    step's noise [B, V] float32 (~110 elementwise kernels in torch; one in `row_noise_triton`)."""
    return exponential_noise(row_keys(seed_lo, seed_hi, step), vocab)
