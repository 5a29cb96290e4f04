"""GEMM tiles of the many-row stack (`t2s_layer_mma_triton`), shared by its kernels and the ticketed FFN.

A tile is [BLOCK_M rows, BLOCK_N outputs] of x @ W^T over a fixed range of K in chunks of BLOCK_K
(tl.dot: fp16 operands, fp32 accumulation); its left operand is the raw rows or their post-norm, recomputed
chunk by chunk from the rows' statistics (`t2s_layer_mma_prenorm_triton`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from voicehub.runtime.kernels.t2s_layer_mma_prenorm_triton import _norm_rows_if_last, _normed, _row_stats
from voicehub.runtime.kernels.t2s_layer_mma_splitk_triton import _mm, _split_is_last, _split_sum
from voicehub.runtime.kernels.t2s_triton_common import _await_previous


@triton.jit
def _w_chunk(w_ptr, outs, n_out, ks, n_in):
    # W[outs, ks]^T [BLOCK_K, BLOCK_N] (0 past n_out and n_in)
    mask = (outs < n_out)[None, :] & (ks < n_in)[:, None]
    return tl.load(w_ptr + outs[None, :] * n_in + ks[:, None], mask=mask, other=0.0)


@triton.jit
def _x_chunk(
    x_ptr, sxb, out_ptr, bias_ptr, nw_ptr, nb_ptr, keep_ptr, keep, rows, rmask, ks, dim, mean, inv_std,
    RAW: tl.constexpr, dtype: tl.constexpr,
):  # fmt: skip
    # columns ks of the GEMM's left operand [BLOCK_M, BLOCK_K]: the raw rows or their LN; keep: stored too
    mask = rmask[:, None] & (ks < dim)[None, :]
    if RAW:
        x = tl.load(x_ptr + rows[:, None] * sxb + ks[None, :], mask=mask, other=0.0)
    else:
        x = _normed(x_ptr, out_ptr, bias_ptr, nw_ptr, nb_ptr, rows, ks, mask, dim, mean, inv_std, dtype)
    if keep:
        tl.store(keep_ptr + rows[:, None] * dim + ks[None, :], x, mask=mask)
    return x


@triton.jit
def _normed_dot(
    x_ptr, sxb, out_ptr, bias_ptr, nw_ptr, nb_ptr, w_ptr, keep_ptr, keep, rows, rmask, outs, n_out, dim, eps,
    k_lo, k_hi, RAW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr, dtype: tl.constexpr,
):  # fmt: skip
    # [BLOCK_M, BLOCK_N] fp32 = x[:, k_lo:k_hi] @ W[outs, k_lo:k_hi]^T (k_lo a multiple of BLOCK_K), x = the
    # raw rows (RAW) or LN(x + rnd(out + bias)) (statistics over the whole row); keep: this program also
    # stores x's columns k_lo:k_hi (the layer's residual) to keep_ptr. The first chunk is peeled: its
    # weights (W's whole tile when BLOCK_K covers the row) are read before waiting for the previous
    # kernel (PDL); the loop's loads are left plain for Triton's software pipelining.
    ks = k_lo + tl.arange(0, BLOCK_K)
    w = _w_chunk(w_ptr, outs, n_out, ks, dim)
    _await_previous(PDL)
    mean = tl.zeros([BLOCK_M], tl.float32)  # unused by RAW
    inv_std = mean
    if not RAW:
        mean, inv_std = _row_stats(x_ptr, out_ptr, bias_ptr, rows, rmask, dim, eps, BLOCK_D, dtype)
    x = _x_chunk(x_ptr, sxb, out_ptr, bias_ptr, nw_ptr, nb_ptr, keep_ptr, keep, rows, rmask, ks, dim, mean,
                 inv_std, RAW, dtype)  # fmt: skip
    acc = _mm(x, w, tl.zeros([BLOCK_M, BLOCK_N], tl.float32), IEEE)
    for k0 in range(k_lo + BLOCK_K, k_hi, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = _x_chunk(x_ptr, sxb, out_ptr, bias_ptr, nw_ptr, nb_ptr, keep_ptr, keep, rows, rmask, ks, dim,
                     mean, inv_std, RAW, dtype)  # fmt: skip
        acc = _mm(x, _w_chunk(w_ptr, outs, n_out, ks, dim), acc, IEEE)
    return acc


@triton.jit
def _a_chunk(a_ptr, rows, rmask, ks, n_in):
    return tl.load(
        a_ptr + rows[:, None] * n_in + ks[None, :], mask=rmask[:, None] & (ks < n_in)[None, :], other=0.0
    )


@triton.jit
def _a_dot(
    a_ptr, w_ptr, w, rows, rmask, outs, n_out, n_in, k_lo, k_hi, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, IEEE: tl.constexpr,
):  # fmt: skip
    # [BLOCK_M, BLOCK_N] fp32 = a[rows, k_lo:k_hi] @ W[outs, k_lo:k_hi]^T; w: the first chunk's weights,
    # loaded by the caller (before it waits for a's producer)
    ks = k_lo + tl.arange(0, BLOCK_K)
    acc = _mm(_a_chunk(a_ptr, rows, rmask, ks, n_in), w, tl.zeros([BLOCK_M, BLOCK_N], tl.float32), IEEE)
    for k0 in range(k_lo + BLOCK_K, k_hi, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        acc = _mm(_a_chunk(a_ptr, rows, rmask, ks, n_in), _w_chunk(w_ptr, outs, n_out, ks, n_in), acc, IEEE)
    return acc


@triton.jit
def _ffn1_out(acc, b1_ptr, h_ptr, rows, rmask, hid, ffn_dim):
    dtype = h_ptr.dtype.element_ty
    b1 = tl.load(b1_ptr + hid, mask=hid < ffn_dim, other=0.0).to(tl.float32)
    h = tl.maximum((acc + b1[None, :]).to(dtype), 0.0).to(dtype)
    tl.store(
        h_ptr + rows[:, None] * ffn_dim + hid[None, :], h, mask=rmask[:, None] & (hid < ffn_dim)[None, :]
    )


@triton.jit
def _linear_tail(
    acc, out_ptr, part_ptr, count_ptr, tile, split, rcount_ptr, row_block, n_tiles, res_ptr, bias_ptr, nw_ptr,
    nb_ptr, dst_ptr, rows, rmask, outs, n_out, eps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, SPLITS: tl.constexpr, NORM: tl.constexpr,
):  # fmt: skip
    # a bias-free linear's tile [BLOCK_M, BLOCK_N] (fp32) to out: at once (SPLITS 1), or this split's partial
    # and, in the tile's last split to arrive, their fixed-order sum; NORM: then, in the row block's last
    # tile (of n_tiles), dst = LN(res + rnd(out + bias)) (`_norm_rows_if_last`)
    offs, mask = rows[:, None] * n_out + outs[None, :], rmask[:, None] & (outs < n_out)[None, :]
    if SPLITS == 1:
        tl.store(out_ptr + offs, acc, mask=mask)
        if NORM:
            _norm_rows_if_last(rcount_ptr, row_block, n_tiles, res_ptr, out_ptr, bias_ptr, nw_ptr, nb_ptr, dst_ptr,
                               rows, rmask, n_out, eps, BLOCK_D)  # fmt: skip
    elif _split_is_last(acc, part_ptr, count_ptr, tile, split, BLOCK_M, BLOCK_N, SPLITS):
        tl.store(out_ptr + offs, _split_sum(part_ptr, count_ptr, tile, BLOCK_M, BLOCK_N, SPLITS), mask=mask)
        if NORM:
            _norm_rows_if_last(rcount_ptr, row_block, n_tiles, res_ptr, out_ptr, bias_ptr, nw_ptr, nb_ptr, dst_ptr,
                               rows, rmask, n_out, eps, BLOCK_D)  # fmt: skip


@triton.jit
def _ffn1_tail(
    acc, part_ptr, count_ptr, tile, split, b1_ptr, h_ptr, rows, rmask, hid, ffn_dim, ready_ptr,
    BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr, SPLITS: tl.constexpr, SIGNAL: tl.constexpr,
):  # fmt: skip
    # ffn1's tile: h = relu(rnd(acc + b1)) stored at once (SPLITS 1), or by the tile's last split to arrive
    # from the partials' fixed-order sum; SIGNAL: the program that stored h then adds 1 to ready_ptr
    # (release: the ticketed FFN's ffn2 tiles wait on it)
    if SPLITS == 1:
        _ffn1_out(acc, b1_ptr, h_ptr, rows, rmask, hid, ffn_dim)
        _signal_stored(ready_ptr, SIGNAL)
    elif _split_is_last(acc, part_ptr, count_ptr, tile, split, BLOCK_M, BLOCK_F, SPLITS):
        _ffn1_out(_split_sum(part_ptr, count_ptr, tile, BLOCK_M, BLOCK_F, SPLITS), b1_ptr, h_ptr, rows, rmask, hid,
                  ffn_dim)  # fmt: skip
        _signal_stored(ready_ptr, SIGNAL)


@triton.jit
def _signal_stored(ready_ptr, SIGNAL: tl.constexpr):
    if SIGNAL:
        tl.debug_barrier()  # every thread's part of the tile is stored before the counter says so
        tl.atomic_add(ready_ptr, 1, sem="release")
