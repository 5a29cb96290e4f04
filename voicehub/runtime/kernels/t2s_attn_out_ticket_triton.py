"""The many-row stack's attention and out-projection (`t2s_layer_mma_triton`) as one launch.

With MmaConfig.attn_out every (row, head) program multiplies its head's 32 values by the head's 32
columns of W_o: 1,024 programs a layer at 64 rows each read 32 KB of W_o from L2 (~5.8 us a layer on an
H100), while the out-projection kernel reads each W_o tile once a row block but costs a kernel boundary.
Here (MmaConfig.out_tickets) one launch does both with the out-projection kernel's tiles: programs
0 .. n_attn - 1 are the attention's (row, head, block) items, row major, which store the head's output to
attn as the attention kernel does and count on a ready counter of their row block (release); the last
programs are the out-projection's tiles (row block, block_n outputs), which load their first W_o chunk,
wait until every head of every row of their row block is stored (acquire), then multiply and normalise as
the out-projection kernel does with prenorm (`_linear_tail`: out_attn, then LN1 of the row block -> x_ffn
by its last tile); the row block's last tile past its wait sets its counters back to 0.

No deadlock: the items a tile waits for never wait, and the GPU starts a launch's programs in id order, so
every item has started before any tile spins; and were the order not kept, the tiles (no more than the GPU's
SMs a scratch, checked when it is made; row groups' launches, a scratch each, may run side by side) would not
fill the slots of SMs that hold 4 of these programs at v3's shapes (240 registers a thread, 2 warps). (Session
31's version took tickets from one atomic counter to order the programs, and counted every program's end
on another: 1,822 us a 64-row step against 1,217 for the two kernels on the H200.) The float operations are
the attention kernel's and the out-projection kernel's, in the same order; a row's values depend only on
that row (bitwise the same alone or in any batch).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from voicehub.runtime.kernels.t2s_layer import LayerWeights
from voicehub.runtime.kernels.t2s_layer_mma_attention_triton import (
    _attend_block,
    _block_is_last,
    attn_span,
    kv_policy,
)
from voicehub.runtime.kernels.t2s_layer_mma_gemm_triton import _a_dot, _linear_tail, _signal_stored, _w_chunk
from voicehub.runtime.kernels.t2s_triton_common import _await_previous, _launch, _merge_blocks

if TYPE_CHECKING:
    from voicehub.runtime.kernels.t2s_layer_mma_config import MmaConfig
    from voicehub.runtime.kernels.t2s_layer_mma_triton import Scratch

# the kernel's num_stages: the out-projection tile's K loop unpipelined (v3: one chunk after the peeled one),
# so the launch holds 24 KB of shared memory a program, not 48 (sm_90), and as many attention programs fit
# an SM; the attention's tile loop sets its own depth (attn_stages)
OUT_TILE_STAGES = 1


@triton.jit
def _attend_item(
    t, q_ptr, k_ptr, v_ptr, len_ptr, m_ptr, l_ptr, part_ptr, count_ptr, attn_ptr, ready_ptr,
    n_slots, n_splits, dim, scale, skb, skh, sks, svb, svh, svs,
    N_HEAD: tl.constexpr, HEAD_DIM: tl.constexpr, DH: tl.constexpr, BLOCK_S: tl.constexpr, TILES: tl.constexpr,
    SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, KV_POLICY: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    # item t -> (row b, head h, block split), the block fastest: the attention kernel's program (split,
    # h, b) without the out-projection; the program that stores the head's output counts it on b's row block
    b, h, split = t // (N_HEAD * n_splits), (t // n_splits) % N_HEAD, t % n_splits
    m, denom, acc = _attend_block(q_ptr, k_ptr, v_ptr, len_ptr, b, h, split, n_slots, dim, scale, skb, skh, sks,
                                  svb, svh, svs, HEAD_DIM, DH, BLOCK_S, TILES, KV_POLICY, STAGES)  # fmt: skip
    dims = tl.arange(0, DH)
    out = attn_ptr + b * dim + h * HEAD_DIM + dims
    dtype = attn_ptr.dtype.element_ty
    if SPLITS == 1:  # one block covers the whole cache: no partials, no merge
        tl.store(out, (acc / denom).to(dtype), mask=dims < HEAD_DIM)
        _signal_stored(ready_ptr + b // BLOCK_M, True)
    elif _block_is_last(
        m, denom, acc, m_ptr, l_ptr, part_ptr, count_ptr, b, h, split, n_splits, N_HEAD, DH, SPLITS
    ):
        a = _merge_blocks(m_ptr, l_ptr, part_ptr, b, h, n_splits, N_HEAD, DH, SPLITS)
        tl.store(out, a.to(dtype), mask=dims < HEAD_DIM)
        _signal_stored(ready_ptr + b // BLOCK_M, True)


@triton.jit
def _out_tile(
    u, attn_ptr, wo_ptr, out_ptr, ready_ptr, rcount_ptr, xa_ptr, bo_ptr, n1w_ptr, n1b_ptr, xf_ptr,
    n_rows, dim, eps, n_tiles,
    N_HEAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr, IEEE: tl.constexpr,
):  # fmt: skip
    # tile u -> (row block rb, output block c): the out-projection kernel's program (c, rb) with prenorm,
    # once every head of rb's rows is in attn
    rb, c = u // n_tiles, u % n_tiles
    rows = rb * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < n_rows
    outs = c * BLOCK_N + tl.arange(0, BLOCK_N)
    w = _w_chunk(wo_ptr, outs, dim, tl.arange(0, BLOCK_K), dim)  # no kernel writes W_o: read before the wait
    need = tl.minimum(BLOCK_M, n_rows - rb * BLOCK_M) * N_HEAD
    seen = tl.atomic_add(ready_ptr + rb, 0, sem="acquire")
    while seen < need:
        seen = tl.atomic_add(ready_ptr + rb, 0, sem="acquire")
    tl.debug_barrier()  # no thread reads attn before the counter said it is stored
    acc = _a_dot(attn_ptr, wo_ptr, w, rows, rmask, outs, dim, dim, 0, dim, BLOCK_M, BLOCK_N, BLOCK_K, IEEE)
    _linear_tail(acc, out_ptr, out_ptr, rcount_ptr, u, 0, rcount_ptr, rb, n_tiles, xa_ptr, bo_ptr, n1w_ptr, n1b_ptr,
                 xf_ptr, rows, rmask, outs, dim, eps, BLOCK_M, BLOCK_N, BLOCK_D, 1, True)  # fmt: skip


@triton.jit
def _attn_out_ticket_kernel(
    q_ptr, k_ptr, v_ptr, len_ptr, m_ptr, l_ptr, part_ptr, count_ptr, attn_ptr,
    wo_ptr, out_ptr, bo_ptr, n1w_ptr, n1b_ptr, xa_ptr, xf_ptr, rcount_ptr, sync_ptr, eps,
    n_rows, n_slots, n_splits, dim, scale, skb, skh, sks, svb, svh, svs,
    N_HEAD: tl.constexpr, HEAD_DIM: tl.constexpr, DH: tl.constexpr, BLOCK_S: tl.constexpr, TILES: tl.constexpr,
    SPLITS: tl.constexpr, KV_POLICY: tl.constexpr, STAGES: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    _await_previous(PDL)
    n_attn = n_rows * N_HEAD * n_splits
    n_blocks = tl.cdiv(n_rows, BLOCK_M)
    ready_ptr = sync_ptr
    t = tl.program_id(0)
    if t < n_attn:
        _attend_item(t, q_ptr, k_ptr, v_ptr, len_ptr, m_ptr, l_ptr, part_ptr, count_ptr, attn_ptr, ready_ptr,
                     n_slots, n_splits, dim, scale, skb, skh, sks, svb, svh, svs, N_HEAD, HEAD_DIM, DH, BLOCK_S,
                     TILES, SPLITS, BLOCK_M, KV_POLICY, STAGES)  # fmt: skip
    else:
        n_tiles = tl.cdiv(dim, BLOCK_N)
        u = t - n_attn
        _out_tile(u, attn_ptr, wo_ptr, out_ptr, ready_ptr, rcount_ptr, xa_ptr, bo_ptr, n1w_ptr, n1b_ptr, xf_ptr,
                  n_rows, dim, eps, n_tiles, N_HEAD, BLOCK_M, BLOCK_N, BLOCK_K, BLOCK_D, IEEE)  # fmt: skip
        # the row block's last tile past its wait sets the block's ready and passed counters back to 0
        rb = u // n_tiles
        tl.debug_barrier()
        if tl.atomic_add(sync_ptr + n_blocks + rb, 1, sem="acq_rel") == n_tiles - 1:
            tl.store(ready_ptr + rb, 0)
            tl.store(sync_ptr + n_blocks + rb, 0)


def out_sync_scratch(n_rows: int, dim: int, cfg: MmaConfig, device: torch.device) -> torch.Tensor:
    """Per row block, a ready counter (heads stored) then a passed counter (tiles past their wait) (int32;
    zeroed, each call leaves them at 0); a placeholder without cfg.out_tickets (no memset joins the step's
    graph). ValueError where n_rows would give a launch more out-projection tiles than the GPU has SMs."""
    if not cfg.out_tickets:
        return torch.empty(1, device=device, dtype=torch.int32)
    n_tiles = triton.cdiv(n_rows, cfg.block_m) * triton.cdiv(dim, cfg.block_n)
    if device.type == "cuda" and n_tiles > torch.cuda.get_device_properties(device).multi_processor_count:
        raise ValueError(f"MmaConfig.out_tickets: {n_rows} rows give {n_tiles} out-projection tiles, more than the "
                         "GPU's SMs (fewer rows a call, or a wider block_n)")  # fmt: skip
    return torch.zeros(2 * triton.cdiv(n_rows, cfg.block_m), device=device, dtype=torch.int32)


def attention_out_ticket_stage(
    s: Scratch, layer: LayerWeights, k_layer: torch.Tensor, v_layer: torch.Tensor, lengths: torch.Tensor,
    n_slots: int, eps: float, cfg: MmaConfig,
) -> None:  # fmt: skip
    """What attention_stage + out_proj_stage leave with prenorm (s.attn, s.out_attn, LN1 -> s.x_ffn), in one
    kernel (s.out_sync: `out_sync_scratch`)."""
    (n_rows, dim), n_head = s.q.shape, s.count.shape[1]
    head_dim = dim // n_head
    n_splits = triton.cdiv(n_slots, attn_span(cfg))
    n_tiles = triton.cdiv(n_rows, cfg.block_m) * triton.cdiv(dim, cfg.block_n)  # checked by out_sync_scratch
    n_programs = n_rows * n_head * n_splits + n_tiles
    _attn_out_ticket_kernel[(n_programs,)](
        s.q, k_layer, v_layer, lengths, s.m, s.l, s.part, s.count, s.attn,
        layer.out_weight, s.out_attn, layer.out_bias, layer.norm1_weight, layer.norm1_bias, s.x_attn, s.x_ffn,
        s.row_count, s.out_sync, eps,
        n_rows, n_slots, n_splits, dim, 1.0 / math.sqrt(head_dim), *k_layer.stride()[:3], *v_layer.stride()[:3],
        N_HEAD=n_head, HEAD_DIM=head_dim, DH=s.part.shape[1], BLOCK_S=cfg.attn_block, TILES=cfg.attn_tiles,
        SPLITS=s.splits, KV_POLICY=kv_policy(cfg), STAGES=cfg.attn_stages, BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, BLOCK_D=triton.next_power_of_2(dim),
        IEEE=s.q.dtype == torch.float32, num_warps=cfg.attn_warps, num_stages=OUT_TILE_STAGES,
        **_launch(cfg, s.q.device), **({"maxnreg": cfg.out_tickets_regs} if cfg.out_tickets_regs else {}),
    )  # fmt: skip
