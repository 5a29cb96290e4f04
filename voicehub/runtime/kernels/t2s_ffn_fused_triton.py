"""The many-row stack's FFN (`t2s_layer_mma_triton`) as one kernel per layer: ffn1, relu and ffn2 fused.

Unfused, the layer's FFN is two GEMM kernels (ffn1: LN1, W1, b1, relu to the model dtype in s.h; ffn2:
h @ W2^T in fp32), and at decode batch sizes each costs its launch, ramp and tail more than its bytes.
Fused (MmaConfig.ffn_slices >= 1), one program per (hidden slice, row block): it normalises its rows
once (LN1 of x + rnd(out + b_o), statistics over the whole row; or reads them where the out-proj's
prenorm stored them), then walks its slice of the hidden units ffn_chunk at a time:
h = relu(rnd(x1 W1[chunk]^T + b1[chunk])) rounded to the model dtype as the unfused h is stored, and
adds h @ W2[:, chunk]^T to an fp32 partial [BLOCK_M, D] over the whole output row. With more than one
slice, each program stores its partial and counts on an int32 counter per row block (split-K's
`_split_is_last`); the last to arrive sums the partials in slice order 0, 1, ... from memory, so the
order never depends on which program finished last. The result is what ffn2 stores: s.out_ffn, fp32,
bias-free (the next qkv or the head adds b2 and normalises; with prenorm the summing program stores
LN2 itself, as the unfused ffn2 does). Slices are a fixed partition of the hidden units (an empty one
adds 0), the same for every batch, and a row's partials depend only on that row: a row is bitwise the
same alone or in any batch. No float atomics. The sums' order differs from the unfused pair's (W2's K
in slices of chunks, W1's K whole): equal to it within the float tolerance, not bitwise.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from voicehub.runtime.kernels.t2s_layer_mma_prenorm_triton import _norm_rows_if_last, _normed, _row_stats
from voicehub.runtime.kernels.t2s_layer_mma_splitk_triton import _mm, _split_is_last, _split_sum, k_span
from voicehub.runtime.kernels.t2s_triton_common import _await_previous, _launch


@triton.jit
def _chunk_weights(w1_ptr, w2_ptr, hid, cols, dim, ffn_dim):
    # W1[hid, :]^T [BLOCK_D, CHUNK] and W2[:, hid]^T [CHUNK, BLOCK_D] (0 past ffn_dim and dim)
    hmask, cmask = hid < ffn_dim, cols < dim
    w1 = tl.load(w1_ptr + hid[None, :] * dim + cols[:, None], mask=hmask[None, :] & cmask[:, None], other=0.0)
    w2 = tl.load(
        w2_ptr + cols[None, :] * ffn_dim + hid[:, None], mask=hmask[:, None] & cmask[None, :], other=0.0
    )
    return w1, w2


@triton.jit
def _chunk_step(
    x1, w1, w2, b1_ptr, hid, ffn_dim, acc, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr, IEEE: tl.constexpr
):
    # acc += relu(rnd(x1 @ w1 + b1[hid])) @ w2: the hidden units rounded to the model dtype as ffn1 stores them
    dtype = x1.dtype
    pre = _mm(x1, w1, tl.zeros([BLOCK_M, CHUNK], tl.float32), IEEE)
    b1 = tl.load(b1_ptr + hid, mask=hid < ffn_dim, other=0.0).to(tl.float32)
    h = tl.maximum((pre + b1[None, :]).to(dtype), 0.0).to(dtype)
    return _mm(h, w2, acc, IEEE)


@triton.jit
def _ffn_fused_kernel(
    xa_ptr, o_ptr, bo_ptr, n1w_ptr, n1b_ptr, w1_ptr, b1_ptr, w2_ptr, xf_ptr, out_ptr, part_ptr, gcount_ptr,
    b2_ptr, n2w_ptr, n2b_ptr, xn_ptr, rcount_ptr, n_rows, dim, ffn_dim, eps, f_span,
    BLOCK_M: tl.constexpr, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, SLICES: tl.constexpr,
    IEEE: tl.constexpr, PDL: tl.constexpr, PRENORM: tl.constexpr,
):  # fmt: skip
    # x1 = LN1(x + rnd(out + b_o)) (slice 0 keeps it in xf: the FFN's residual), or PRENORM: xa is x1
    # already; out [B, D] fp32 = relu(rnd(x1 W1^T + b1)) W2^T over slices [f_lo, f_hi) of the hidden
    # units; PRENORM: the summing program also stores xn = LN2(xf + rnd(out + b2)) (the next layer's input)
    slc, rb = tl.program_id(0), tl.program_id(1)
    dtype = xf_ptr.dtype.element_ty
    rows = rb * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    rmask = rows < n_rows
    mask = rmask[:, None] & (cols < dim)[None, :]
    f_lo = slc * f_span
    f_hi = tl.minimum(ffn_dim, f_lo + f_span)
    hid = f_lo + tl.arange(0, CHUNK)
    w1, w2 = _chunk_weights(w1_ptr, w2_ptr, hid, cols, dim, ffn_dim)  # the first chunk's, before the wait
    _await_previous(PDL)
    if PRENORM:
        x1 = tl.load(xa_ptr + rows[:, None] * dim + cols[None, :], mask=mask, other=0.0)
    else:
        mean, inv_std = _row_stats(xa_ptr, o_ptr, bo_ptr, rows, rmask, dim, eps, BLOCK_D, dtype)
        x1 = _normed(xa_ptr, o_ptr, bo_ptr, n1w_ptr, n1b_ptr, rows, cols, mask, dim, mean, inv_std, dtype)
        if slc == 0:
            tl.store(xf_ptr + rows[:, None] * dim + cols[None, :], x1, mask=mask)
    acc = _chunk_step(
        x1, w1, w2, b1_ptr, hid, ffn_dim, tl.zeros([BLOCK_M, BLOCK_D], tl.float32), BLOCK_M, CHUNK, IEEE
    )
    for f0 in range(f_lo + CHUNK, f_hi, CHUNK):
        hid = f0 + tl.arange(0, CHUNK)
        w1, w2 = _chunk_weights(w1_ptr, w2_ptr, hid, cols, dim, ffn_dim)
        acc = _chunk_step(x1, w1, w2, b1_ptr, hid, ffn_dim, acc, BLOCK_M, CHUNK, IEEE)
    if SLICES == 1:
        _ffn_out(acc, out_ptr, rcount_ptr, rb, xf_ptr, b2_ptr, n2w_ptr, n2b_ptr, xn_ptr, rows, rmask, cols, mask,
                 dim, eps, BLOCK_D, PRENORM)  # fmt: skip
    elif _split_is_last(acc, part_ptr, gcount_ptr, rb, slc, BLOCK_M, BLOCK_D, SLICES):
        acc = _split_sum(part_ptr, gcount_ptr, rb, BLOCK_M, BLOCK_D, SLICES)
        _ffn_out(acc, out_ptr, rcount_ptr, rb, xf_ptr, b2_ptr, n2w_ptr, n2b_ptr, xn_ptr, rows, rmask, cols, mask,
                 dim, eps, BLOCK_D, PRENORM)  # fmt: skip


@triton.jit
def _ffn_out(
    acc, out_ptr, rcount_ptr, rb, xf_ptr, b2_ptr, n2w_ptr, n2b_ptr, xn_ptr, rows, rmask, cols, mask, dim, eps,
    BLOCK_D: tl.constexpr, PRENORM: tl.constexpr,
):  # fmt: skip
    # the row block's whole FFN output (fp32, bias-free); PRENORM: then LN2 of its rows (one tile a row
    # block: the counter says last at once, after the barrier that orders the stores before the reads)
    tl.store(out_ptr + rows[:, None] * dim + cols[None, :], acc, mask=mask)
    if PRENORM:
        _norm_rows_if_last(rcount_ptr, rb, 1, xf_ptr, out_ptr, b2_ptr, n2w_ptr, n2b_ptr, xn_ptr, rows, rmask,
                           dim, eps, BLOCK_D)  # fmt: skip


def fused_scratch_gemm(dim: int, n_slices: int) -> tuple[int, int, int]:
    """The fused FFN's partials as a `split_scratch` GEMM entry (n_out, block_n, splits): one tile of the
    whole (padded) row per row block, n_slices partials each."""
    block_d = triton.next_power_of_2(dim)
    return block_d, block_d, n_slices


def ffn_fused_stage(s, layer, eps: float, cfg) -> None:
    """s (`t2s_layer_mma_scratch.Scratch`): LN1(s.x_attn + s.out_attn + b_o) -> s.x_ffn (cfg.prenorm: read
    from s.x_ffn); relu(x1 W1^T + b1) W2^T -> s.out_ffn [B, D] fp32, bias-free, as ffn1 + ffn2 leave it
    (cfg.prenorm: also LN2(s.x_ffn + that + b2) -> s.x_attn). s.h is not written."""
    n_rows, dim = s.q.shape
    ffn_dim = layer.ffn1_weight.shape[0]
    n_slices = cfg.ffn_slices
    _ffn_fused_kernel[(n_slices, triton.cdiv(n_rows, cfg.block_m))](
        s.x_ffn if cfg.prenorm else s.x_attn, s.out_attn, layer.out_bias, layer.norm1_weight, layer.norm1_bias,
        layer.ffn1_weight, layer.ffn1_bias, layer.ffn2_weight, s.x_ffn, s.out_ffn, s.gemm_part, s.gemm_count,
        layer.ffn2_bias, layer.norm2_weight, layer.norm2_bias, s.x_attn, s.row_count, n_rows, dim, ffn_dim, eps,
        k_span(ffn_dim, cfg.ffn_chunk, n_slices), BLOCK_M=cfg.block_m, CHUNK=cfg.ffn_chunk,
        BLOCK_D=triton.next_power_of_2(dim), SLICES=n_slices, IEEE=s.q.dtype == torch.float32,
        PRENORM=cfg.prenorm, num_warps=cfg.gemm_warps, num_stages=cfg.gemm_stages, **_launch(cfg, s.q.device),
    )  # fmt: skip
