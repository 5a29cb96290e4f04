"""The many-row stack's FFN (`t2s_layer_mma_triton`) as one kernel of tickets: ffn1 and ffn2 overlapped.

Unfused, ffn2 starts when the last ffn1 program has ended: each layer pays a kernel's drain and ramp
between the two GEMMs, and ffn2 reads its first weights only then. Here (MmaConfig.ffn_tickets) one
kernel runs both GEMMs' programs, the same tiles with the same operations as the two kernels: each
program takes a ticket (an int32 counter, atomically); tickets 0 .. n1 - 1 are ffn1's tiles (row block
major, then hidden tile, then K split), the rest ffn2's (row block, K split, output tile). An ffn1 tile,
once its h (relu(rnd(x1 W1^T + b1)), the model dtype) is stored, counts on a ready counter of its row
block and of the ffn2 split whose K range holds its hidden units; an ffn2 tile loads its first W2 chunk,
then waits until that counter says all its K range of h is stored (acquire), then multiplies as the
unfused ffn2 does (split-K partials summed in split order, LN2 once per row block with prenorm).

No deadlock whatever the number of resident programs: tickets are taken in order, so every ffn1 tile
an ffn2 tile waits for was taken before it by a program that is running and never waits. The last
program to end sets the ticket and ready counters back to 0 (zeroed once per call: a scratch reused
across calls stays valid). The float operations are the unfused pair's, in the same order: the output
is bitwise the two kernels' (tests), and a row is bitwise the same alone or in any batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from voicehub.runtime.kernels.t2s_layer import LayerWeights
from voicehub.runtime.kernels.t2s_layer_mma_gemm_triton import (
    _a_dot,
    _ffn1_tail,
    _linear_tail,
    _normed_dot,
    _w_chunk,
)
from voicehub.runtime.kernels.t2s_layer_mma_prenorm_triton import _keeps
from voicehub.runtime.kernels.t2s_layer_mma_splitk_triton import CounterFactory, k_span
from voicehub.runtime.kernels.t2s_triton_common import _await_previous, _launch

if TYPE_CHECKING:
    from voicehub.runtime.kernels.t2s_layer_mma_config import MmaConfig
    from voicehub.runtime.kernels.t2s_layer_mma_scratch import Scratch

# sync's layout: the ticket, the programs ended, then the ready counters
_TICKET, _DONE, _READY = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)


@triton.jit
def _unravel(i, n_middle, n_inner):
    # i -> (outer, middle, inner), inner fastest: a ticket's (row block, ..., ...)
    return i // (n_middle * n_inner), (i // n_inner) % n_middle, i % n_inner


@triton.jit
def _ffn1_tile(
    t, xa_ptr, o_ptr, bo_ptr, n1w_ptr, n1b_ptr, w1_ptr, b1_ptr, xf_ptr, h_ptr, part_ptr, count_ptr, ready_ptr,
    n_rows, dim, ffn_dim, eps, span1, span2, f_tiles,
    BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
    SPLITS1: tl.constexpr, SPLITS2: tl.constexpr, IEEE: tl.constexpr, PRENORM: tl.constexpr,
):  # fmt: skip
    # ticket t < n1: ffn1's tile (row block, hidden tile f, split) as `_ffn1_kernel` computes it; the
    # program that stores h counts on ready[row block, the ffn2 split holding hidden units f * BLOCK_F..]
    rb, f, split = _unravel(t, f_tiles, SPLITS1)
    rows = rb * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < n_rows
    hid = f * BLOCK_F + tl.arange(0, BLOCK_F)
    k_lo = split * span1
    acc = _normed_dot(
        xa_ptr, dim, o_ptr, bo_ptr, n1w_ptr, n1b_ptr, w1_ptr, xf_ptr, _keeps(f, PRENORM), rows, rmask, hid,
        ffn_dim, dim, eps, k_lo, tl.minimum(dim, k_lo + span1), PRENORM, BLOCK_M, BLOCK_F, BLOCK_K, BLOCK_D,
        IEEE, False, h_ptr.dtype.element_ty,
    )  # fmt: skip
    ready = ready_ptr + rb * SPLITS2 + (f * BLOCK_F) // span2
    _ffn1_tail(acc, part_ptr, count_ptr, rb * f_tiles + f, split, b1_ptr, h_ptr, rows, rmask, hid, ffn_dim, ready,
               BLOCK_M, BLOCK_F, SPLITS1, True)  # fmt: skip


@triton.jit
def _ffn2_tile(
    u, h_ptr, w2_ptr, out_ptr, part_ptr, count_ptr, ready_ptr, xf_ptr, b2_ptr, n2w_ptr, n2b_ptr, xn_ptr,
    rcount_ptr, n_rows, dim, ffn_dim, eps, span2, n_tiles,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr, SPLITS2: tl.constexpr, IEEE: tl.constexpr, PRENORM: tl.constexpr,
):  # fmt: skip
    # ffn2's tile u (row block, split, output tile c) as `_linear_kernel` computes it, once its K range
    # of h is stored
    rb, split, c = _unravel(u, SPLITS2, n_tiles)
    rows = rb * BLOCK_M + tl.arange(0, BLOCK_M)
    outs = c * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < n_rows
    k_lo = split * span2
    k_hi = tl.minimum(ffn_dim, k_lo + span2)
    ks = k_lo + tl.arange(0, BLOCK_K)
    w = _w_chunk(w2_ptr, outs, dim, ks, ffn_dim)  # no kernel writes W2: read before the wait
    need = tl.cdiv(tl.maximum(k_hi - k_lo, 0), BLOCK_F)  # ffn1 tiles in this K range (0: an empty split)
    ready = ready_ptr + rb * SPLITS2 + split
    seen = tl.atomic_add(ready, 0, sem="acquire")
    while seen < need:
        seen = tl.atomic_add(ready, 0, sem="acquire")
    tl.debug_barrier()  # no thread reads h before the counter said it is stored
    acc = _a_dot(
        h_ptr, w2_ptr, w, rows, rmask, outs, dim, ffn_dim, k_lo, k_hi, BLOCK_M, BLOCK_N, BLOCK_K, IEEE
    )
    _linear_tail(acc, out_ptr, part_ptr, count_ptr, rb * n_tiles + c, split, rcount_ptr, rb, n_tiles, xf_ptr, b2_ptr,
                 n2w_ptr, n2b_ptr, xn_ptr, rows, rmask, outs, dim, eps, BLOCK_M, BLOCK_N, BLOCK_D, SPLITS2,
                 PRENORM)  # fmt: skip


@triton.jit
def _ffn_ticket_kernel(
    xa_ptr, o_ptr, bo_ptr, n1w_ptr, n1b_ptr, w1_ptr, b1_ptr, xf_ptr, h_ptr, w2_ptr, out_ptr,
    part1_ptr, count1_ptr, part2_ptr, count2_ptr, sync_ptr, b2_ptr, n2w_ptr, n2b_ptr, xn_ptr, rcount_ptr,
    n_rows, dim, ffn_dim, eps, span1, span2,
    BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr, SPLITS1: tl.constexpr, SPLITS2: tl.constexpr, IEEE: tl.constexpr,
    PDL: tl.constexpr, PRENORM: tl.constexpr,
):  # fmt: skip
    _await_previous(PDL)
    row_blocks = tl.cdiv(n_rows, BLOCK_M)
    f_tiles = tl.cdiv(ffn_dim, BLOCK_F)
    n_tiles = tl.cdiv(dim, BLOCK_N)
    n1 = row_blocks * f_tiles * SPLITS1
    ready_ptr = sync_ptr + _READY
    t = tl.atomic_add(sync_ptr + _TICKET, 1, sem="relaxed")
    if t < n1:
        _ffn1_tile(t, xa_ptr, o_ptr, bo_ptr, n1w_ptr, n1b_ptr, w1_ptr, b1_ptr, xf_ptr, h_ptr, part1_ptr,
                   count1_ptr, ready_ptr, n_rows, dim, ffn_dim, eps, span1, span2, f_tiles, BLOCK_M, BLOCK_F,
                   BLOCK_K, BLOCK_D, SPLITS1, SPLITS2, IEEE, PRENORM)  # fmt: skip
    else:
        _ffn2_tile(t - n1, h_ptr, w2_ptr, out_ptr, part2_ptr, count2_ptr, ready_ptr, xf_ptr, b2_ptr, n2w_ptr,
                   n2b_ptr, xn_ptr, rcount_ptr, n_rows, dim, ffn_dim, eps, span2, n_tiles, BLOCK_M, BLOCK_N,
                   BLOCK_F, BLOCK_K, BLOCK_D, SPLITS2, IEEE, PRENORM)  # fmt: skip
    tl.debug_barrier()
    if tl.atomic_add(sync_ptr + _DONE, 1, sem="acq_rel") == tl.num_programs(0) - 1:
        for i in range(0, row_blocks * SPLITS2):  # every program has ended: nothing reads them now
            tl.store(ready_ptr + i, 0)
        tl.store(sync_ptr + _TICKET, 0)
        tl.store(sync_ptr + _DONE, 0)


def ticket_scratch(
    n_rows: int, dim: int, ffn_dim: int, cfg: MmaConfig, device: torch.device, counters: CounterFactory
) -> tuple:
    """(part1, count1, part2, count2, sync): ffn1's and ffn2's split-K partials (fp32) and per-tile counters,
    and the ticket / ended / ready counters (int32, from `counters`: zeroed; each call leaves them at 0)."""
    row_blocks = triton.cdiv(n_rows, cfg.block_m)
    tiles1, tiles2 = (
        row_blocks * triton.cdiv(ffn_dim, cfg.ffn_block),
        row_blocks * triton.cdiv(dim, cfg.block_n),
    )
    part1 = torch.empty(
        tiles1 * cfg.ffn1_splits * cfg.block_m * cfg.ffn_block, device=device, dtype=torch.float32
    )
    part2 = torch.empty(
        tiles2 * cfg.ffn2_splits * cfg.block_m * cfg.block_n, device=device, dtype=torch.float32
    )
    counts = counters(tiles1 + tiles2 + _READY.value + row_blocks * cfg.ffn2_splits)
    return part1, counts[:tiles1], part2, counts[tiles1 : tiles1 + tiles2], counts[tiles1 + tiles2 :]


def ffn_ticket_stage(s: Scratch, layer: LayerWeights, eps: float, cfg: MmaConfig) -> None:
    """What ffn1_stage + ffn2_stage leave (s.h, s.out_ffn; cfg.prenorm: LN2 -> s.x_attn; without it,
    LN1 -> s.x_ffn), in one kernel (s.ticket: `ticket_scratch`)."""
    n_rows, dim = s.q.shape
    ffn_dim = s.h.shape[1]
    span1, span2 = k_span(dim, cfg.block_k, cfg.ffn1_splits), k_span(ffn_dim, cfg.block_k, cfg.ffn2_splits)
    if span2 % cfg.ffn_block:
        raise ValueError(
            f"ffn_tickets: ffn2's K span {span2} is not a whole number of ffn_block {cfg.ffn_block}"
        )
    row_blocks = triton.cdiv(n_rows, cfg.block_m)
    n_programs = row_blocks * (
        triton.cdiv(ffn_dim, cfg.ffn_block) * cfg.ffn1_splits
        + triton.cdiv(dim, cfg.block_n) * cfg.ffn2_splits
    )
    _ffn_ticket_kernel[(n_programs,)](
        s.x_ffn if cfg.prenorm else s.x_attn, s.out_attn, layer.out_bias, layer.norm1_weight, layer.norm1_bias,
        layer.ffn1_weight, layer.ffn1_bias, s.x_ffn, s.h, layer.ffn2_weight, s.out_ffn, *s.ticket,
        layer.ffn2_bias, layer.norm2_weight, layer.norm2_bias, s.x_attn, s.row_count,
        n_rows, dim, ffn_dim, eps, span1, span2,
        BLOCK_M=cfg.block_m, BLOCK_F=cfg.ffn_block, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        BLOCK_D=triton.next_power_of_2(dim), SPLITS1=cfg.ffn1_splits, SPLITS2=cfg.ffn2_splits,
        IEEE=s.q.dtype == torch.float32, PRENORM=cfg.prenorm, num_warps=cfg.gemm_warps,
        num_stages=cfg.gemm_stages, **_launch(cfg, s.q.device),
    )  # fmt: skip
