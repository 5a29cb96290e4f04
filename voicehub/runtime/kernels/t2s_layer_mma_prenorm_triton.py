"""The many-row stack's post-norms (`t2s_layer_mma_triton`) and their once-per-row-block form (prenorm).

Off (the default), the GEMM that consumes a norm's output (qkv: the previous layer's LN2, ffn1: LN1, the
head: the last LN2) recomputes it in every program from the residual and the previous GEMM's fp32 output:
each row's statistics over the whole row, then the normalised K chunks. That puts a full pass over the
rows in front of every program's first MMA. On, the GEMM that produces the residual stream (out-proj,
ffn2) normalises it once per row block: each output tile, once stored, counts on an int32 counter per row
block (acq_rel, as split-K counts per tile); the last tile of the row block to arrive computes LN of its
BLOCK_M rows from memory (the same operations and roundings as the chunked form, to the activation
dtype), stores them where the consumer reads them (x_ffn: LN1, x_attn: the next layer's input) and sets
the counter back to 0. qkv, ffn1 and the head then multiply those rows as plain GEMMs. The normalising
program reads only its own rows, and a row's values depend only on that row: a row is bitwise the same
alone or in any batch. No float atomics.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from voicehub.runtime.kernels.t2s_layer_mma_splitk_triton import CounterFactory


@triton.jit
def _residual_sum(res_ptr, out_ptr, bias_ptr, rows, cols, mask, dim, dtype: tl.constexpr):
    # rnd(residual + rnd(out + bias)) [BLOCK_M, cols]: the unfused ops round the linear, then the sum
    offs = rows[:, None] * dim + cols[None, :]
    bias = tl.load(bias_ptr + cols, mask=cols < dim, other=0.0).to(tl.float32)
    branch = (tl.load(out_ptr + offs, mask=mask, other=0.0) + bias[None, :]).to(dtype).to(tl.float32)
    s = tl.load(res_ptr + offs, mask=mask, other=0.0).to(tl.float32) + branch
    return s.to(dtype).to(tl.float32)


@triton.jit
def _row_stats(res_ptr, out_ptr, bias_ptr, rows, rmask, dim, eps, BLOCK_D: tl.constexpr, dtype: tl.constexpr):
    # mean and 1/std [BLOCK_M] of each row's post-norm input, over the whole row at once
    cols = tl.arange(0, BLOCK_D)
    mask = rmask[:, None] & (cols < dim)[None, :]
    s = _residual_sum(res_ptr, out_ptr, bias_ptr, rows, cols, mask, dim, dtype)
    mean = tl.sum(s, axis=1) / dim
    centred = tl.where(mask, s - mean[:, None], 0.0)
    return mean, tl.rsqrt(tl.sum(centred * centred, axis=1) / dim + eps)


@triton.jit
def _normed(
    res_ptr, out_ptr, bias_ptr, nw_ptr, nb_ptr, rows, cols, mask, dim, mean, inv_std, dtype: tl.constexpr
):
    # LN of a [BLOCK_M, BLOCK_K] chunk from the rows' statistics, rounded where the unfused norm stores
    s = _residual_sum(res_ptr, out_ptr, bias_ptr, rows, cols, mask, dim, dtype)
    w = tl.load(nw_ptr + cols, mask=cols < dim, other=0.0).to(tl.float32)
    b = tl.load(nb_ptr + cols, mask=cols < dim, other=0.0).to(tl.float32)
    y = (s - mean[:, None]) * inv_std[:, None] * w[None, :] + b[None, :]
    return tl.where(mask, y, 0.0).to(dtype)


@triton.jit
def _norm_rows_if_last(
    count_ptr, row_block, n_tiles, res_ptr, out_ptr, bias_ptr, nw_ptr, nb_ptr, dst_ptr, rows, rmask, dim, eps,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    # Called by a tile's program once its fp32 output tile is stored: the row block's last tile to arrive
    # stores dst[rows] = LN(res + rnd(out + bias)) [BLOCK_M, dim] (dst's dtype) and resets the counter.
    tl.debug_barrier()  # every thread's part of the tile is written before the counter says so
    if tl.atomic_add(count_ptr + row_block, 1, sem="acq_rel") == n_tiles - 1:
        dtype = dst_ptr.dtype.element_ty
        mean, inv_std = _row_stats(res_ptr, out_ptr, bias_ptr, rows, rmask, dim, eps, BLOCK_D, dtype)
        cols = tl.arange(0, BLOCK_D)
        mask = rmask[:, None] & (cols < dim)[None, :]
        y = _normed(res_ptr, out_ptr, bias_ptr, nw_ptr, nb_ptr, rows, cols, mask, dim, mean, inv_std, dtype)
        tl.store(dst_ptr + rows[:, None] * dim + cols[None, :], y, mask=mask)
        tl.store(count_ptr + row_block, 0)


@triton.jit
def _keeps(pid, STORED: tl.constexpr):
    # whether this program stores its left operand's columns: program 0 of the row block, unless the
    # operand is stored there already (STORED: a prenorm stage wrote it)
    keep = pid == 0
    if STORED:
        keep = pid < 0
    return keep


def row_block_counters(
    n_rows: int, block_m: int, is_on: bool, device: torch.device, counters: CounterFactory
) -> torch.Tensor:
    """int32 counters, one per row block, from `counters` (zeroed; each use leaves them at 0); a
    placeholder when off (no memset joins the step's graph)."""
    if not is_on:
        return torch.empty(1, device=device, dtype=torch.int32)
    return counters(triton.cdiv(n_rows, block_m))
