"""ROW_NOISE (`runtime/row_rng.py:row_noise`) as one Triton kernel: a batched decode step's noise.

The torch definition is ~110 elementwise kernels over [B] and [B, V] int64 tensors (lowbias32 in
16-bit halves, then the uniform and its log in float64); inside a CUDA graph each costs its launch,
about a sixth of a 64-row T2S step. Here one program per (row, block of the vocabulary) hashes the
row's key and its block of entries with the same integer operations (so the hashes are equal bit for
bit), then -log(u) in float64 as the definition computes it, rounded to float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from voicehub.runtime import row_rng

BLOCK_V = 256  # vocabulary entries per program
# the definition's constants (row_rng.py), as the kernels' compile-time values
_MASK32 = tl.constexpr(row_rng.MASK32)
_MIX_A, _MIX_B = tl.constexpr(row_rng.MIX_A), tl.constexpr(row_rng.MIX_B)
_KEY_STEP = tl.constexpr(row_rng.KEY_STEP)
_DROP_BITS = tl.constexpr(32 - row_rng.UNIFORM_BITS)  # hash bits below the uniform's
_ULP = tl.constexpr(1.0 / (1 << row_rng.UNIFORM_BITS))


@triton.jit
def _mul32(x, c: tl.constexpr):
    # (x * c) mod 2^32 for x in [0, 2^32) int64, c split in 16-bit halves (no int64 overflow), as torch's
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _MASK32


@triton.jit
def _mix32(x):
    # lowbias32 (row_rng.mix32) on int64 values
    x = x & _MASK32
    x = _mul32(x ^ (x >> 16), _MIX_A)
    x = _mul32(x ^ (x >> 15), _MIX_B)
    return x ^ (x >> 16)


@triton.jit
def _row_noise_kernel(
    lo_ptr, hi_ptr, step_ptr, vocab_ptr, out_ptr, n_vocab, s_lo, s_hi, s_step, s_vocab, s_out, BLOCK: tl.constexpr
):  # fmt: skip
    b = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    valid = cols < n_vocab
    seed_lo = tl.load(lo_ptr + b * s_lo).to(tl.int64)  # strided: the prefill passes columns of one tensor
    seed_hi = tl.load(hi_ptr + b * s_hi).to(tl.int64)
    step = tl.load(step_ptr + b * s_step).to(tl.int64)
    key = _mix32(_mix32(_mix32(seed_lo) ^ seed_hi) ^ ((step * 2 + 1) & _MASK32) ^ _KEY_STEP)  # row_keys
    vocab = tl.load(vocab_ptr + cols * s_vocab, mask=valid, other=0).to(tl.int64)
    h = _mix32(_mix32(key ^ vocab) ^ key)  # exponential_noise
    u = ((h >> _DROP_BITS).to(tl.float64) + 0.5) * _ULP  # hash_noise: the top UNIFORM_BITS bits, in (0, 1)
    tl.store(out_ptr + b.to(tl.int64) * s_out + cols, (-tl.log(u)).to(tl.float32), mask=valid)


def row_noise_triton(
    seed_lo: torch.Tensor, seed_hi: torch.Tensor, step: torch.Tensor, vocab: torch.Tensor
) -> torch.Tensor:
    """ROW_NOISE: seed_lo, seed_hi, step [B] int64 (any stride), vocab [V] int64 (`vocab_keys`) -> noise
    [B, V] float32."""
    n_rows, n_vocab = seed_lo.shape[0], vocab.shape[0]
    out = torch.empty(n_rows, n_vocab, device=vocab.device, dtype=torch.float32)
    if n_rows and n_vocab:
        _row_noise_kernel[(n_rows, triton.cdiv(n_vocab, BLOCK_V))](
            seed_lo, seed_hi, step, vocab, out, n_vocab, seed_lo.stride(0), seed_hi.stride(0), step.stride(0),
            vocab.stride(0), out.stride(0), BLOCK=BLOCK_V,
        )  # fmt: skip
    return out
