"""The many-row stack's attention kernel (`t2s_layer_mma_triton`), with the out-projection in its tails.

One program per (row, head, block of attn_tiles tiles of attn_block slots): online softmax over the
block's tiles below the row's length; the last of a (row, head) to finish (an int32 counter per program)
merges the blocks in a fixed order (a block as large as the cache: one program per (row, head), no
partials and no merge). The head's 32 values, rounded to the model dtype, go to `attn` for the
out-projection kernel, or, with MmaConfig.attn_out, through the head's share of the out-projection
(W_o's 32 columns of the head, fp32, stored per head); the row's last head to arrive sums the 16 shares
in head order and stores LN1(x_attn + rnd(out + b_o)) to x_ffn, where ffn1 (prenorm) reads it. A row's
numbers depend only on that row: bitwise the same alone or in any batch. MmaConfig.kv_prefetch / kv_prefetch_own /
w_prefetch: L2 prefetches of the next layer's K/V, the program's own, the next GEMMs' weights
(`t2s_l2_prefetch_triton`; no value changes).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from voicehub.runtime.kernels.t2s_l2_prefetch_triton import (
    N_WEIGHTS,
    kv_own_prefetched,
    kv_prefetched,
    kv_targets,
    prefetch_l2,
    weight_targets,
    weights_prefetched,
)
from voicehub.runtime.kernels.t2s_layer import LayerWeights
from voicehub.runtime.kernels.t2s_triton_common import _await_previous, _launch, _merge_blocks, _post_norm_of

if TYPE_CHECKING:
    from voicehub.runtime.kernels.t2s_layer_mma_config import MmaConfig
    from voicehub.runtime.kernels.t2s_layer_mma_scratch import Scratch

ATTN_OUT_BLOCK = 128  # out-projection outputs per chunk in a head's program (MmaConfig.attn_out)


@triton.jit
def _kv_tile(k_row, v_row, slots, live, dims, dmask, sks, svs, KV_POLICY: tl.constexpr):
    # K and V of one tile [BLOCK_S, DH] (0 where not live or past the head's dims)
    kv_mask = live[:, None] & dmask[None, :]
    k = tl.load(
        k_row + slots[:, None] * sks + dims[None, :], mask=kv_mask, other=0.0, eviction_policy=KV_POLICY
    )
    v = tl.load(
        v_row + slots[:, None] * svs + dims[None, :], mask=kv_mask, other=0.0, eviction_policy=KV_POLICY
    )
    return k, v


@triton.jit
def _tile_update(k, v, q, live, scale, m, denom, acc):
    # one tile of the online softmax: (m, sum, values) updated with the tile's live slots (one at least)
    s = tl.where(live, tl.sum(k.to(tl.float32) * q[None, :], axis=1) * scale, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=0))  # finite: the tile has a live slot
    alpha = tl.exp(m - m_new)  # 0 on the first tile (m = -inf)
    p = tl.exp(s - m_new)
    denom = denom * alpha + tl.sum(p, axis=0)
    acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
    return m_new, denom, acc


@triton.jit
def _attend_tiles(
    q_ptr, k_ptr, v_ptr, b, h, start, n, dim, scale, skb, skh, sks, svb, svh, svs, k0, v0,
    HEAD_DIM: tl.constexpr, DH: tl.constexpr, BLOCK_S: tl.constexpr, TILES: tl.constexpr,
    KV_POLICY: tl.constexpr, STAGES: tl.constexpr, FIRST: tl.constexpr,
):  # fmt: skip
    # Head h of row b over slots [start, start + TILES * BLOCK_S), online softmax tile by tile, visiting
    # only the tiles that hold a live slot (< n): (max m, sum of exp(s - m), p-weighted values [DH]), fp32.
    # A block with no live slot keeps m = -inf, sum 0 (it weighs nothing in the merge). STAGES > 1: Triton
    # pipelines the tiles' K/V loads (cp.async into shared memory, STAGES - 1 tiles ahead; the same values
    # and operations); 1: each tile's loads, then its math. FIRST: the first tile's K/V, k0 and v0, were
    # loaded before the previous kernel ended (MmaConfig.pdl_attn, `_attention_kernel`); unread without it.
    dims = tl.arange(0, DH)
    dmask = dims < HEAD_DIM
    q = tl.load(q_ptr + b * dim + h * HEAD_DIM + dims, mask=dmask, other=0.0).to(tl.float32)
    b64 = b.to(tl.int64)
    k_row = k_ptr + b64 * skb + h * skh
    v_row = v_ptr + b64 * svb + h * svh
    m = tl.max(tl.full([BLOCK_S], float("-inf"), tl.float32), axis=0)  # a scalar -inf of the loop's type
    denom = tl.sum(tl.zeros([BLOCK_S], tl.float32), axis=0)
    acc = tl.zeros([DH], tl.float32)
    n_tiles = tl.minimum(tl.cdiv(n - start, BLOCK_S), TILES)
    first = 0
    if FIRST:
        first = 1
        if n_tiles > 0:
            m, denom, acc = _tile_update(k0, v0, q, start + tl.arange(0, BLOCK_S) < n, scale, m, denom, acc)
    # num_stages 1 compiles to the plain loop's code (PTX compared on Triton 3.6 and 3.9)
    for t in tl.range(first, n_tiles, num_stages=STAGES):
        slots = start + t * BLOCK_S + tl.arange(0, BLOCK_S)
        live = slots < n
        k, v = _kv_tile(k_row, v_row, slots, live, dims, dmask, sks, svs, KV_POLICY)
        m, denom, acc = _tile_update(k, v, q, live, scale, m, denom, acc)
    return m, denom, acc


@triton.jit
def _first_tile(
    k_ptr, v_ptr, len_ptr, b, h, split, n_slots, skb, skh, sks, svb, svh, svs, DH: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, TILES: tl.constexpr, KV_POLICY: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    # MmaConfig.pdl_attn: the block's first tile of K/V loaded while the qkv kernel still runs (slots below
    # the row's length: earlier steps' values, which no kernel of this step writes), then the wait; a tile
    # that holds this step's slot (the length, just written by qkv) is loaded again after it
    dims = tl.arange(0, DH)
    dmask = dims < HEAD_DIM
    b64 = b.to(tl.int64)
    k_row = k_ptr + b64 * skb + h * skh
    v_row = v_ptr + b64 * svb + h * svh
    length = tl.load(len_ptr + b).to(tl.int32)
    slots = split * TILES * BLOCK_S + tl.arange(0, BLOCK_S)
    k0, v0 = _kv_tile(
        k_row, v_row, slots, slots < tl.minimum(length, n_slots), dims, dmask, sks, svs, KV_POLICY
    )
    _await_previous(PDL)
    if length < split * TILES * BLOCK_S + BLOCK_S:
        k0, v0 = _kv_tile(k_row, v_row, slots, slots < tl.minimum(length + 1, n_slots), dims, dmask, sks, svs,
                          KV_POLICY)  # fmt: skip
    return k0, v0


@triton.jit
def _attend_block(
    q_ptr, k_ptr, v_ptr, len_ptr, b, h, split, n_slots, dim, scale, skb, skh, sks, svb, svh, svs, k0, v0,
    HEAD_DIM: tl.constexpr, DH: tl.constexpr, BLOCK_S: tl.constexpr, TILES: tl.constexpr,
    KV_POLICY: tl.constexpr, STAGES: tl.constexpr, FIRST: tl.constexpr,
):  # fmt: skip
    # block `split` (TILES tiles of BLOCK_S slots) of head h of row b, over the row's slots below its length
    # + 1 (within the bucket's n_slots): `_attend_tiles`' (m, sum, values)
    n = tl.minimum(tl.load(len_ptr + b).to(tl.int32) + 1, n_slots)
    return _attend_tiles(q_ptr, k_ptr, v_ptr, b, h, split * TILES * BLOCK_S, n, dim, scale, skb, skh, sks, svb,
                         svh, svs, k0, v0, HEAD_DIM, DH, BLOCK_S, TILES, KV_POLICY, STAGES, FIRST)  # fmt: skip


@triton.jit
def _attention_kernel(
    q_ptr, k_ptr, v_ptr, len_ptr, m_ptr, l_ptr, part_ptr, count_ptr, attn_ptr,
    wo_ptr, bo_ptr, n1w_ptr, n1b_ptr, xa_ptr, xf_ptr, opart_ptr, rcount_ptr, eps, kn_ptr, vn_ptr, pf_slots,
    w1_ptr, w2_ptr, w3_ptr, w4_ptr, w1_bytes, w2_bytes, w3_bytes, w4_bytes,
    n_slots, n_splits, dim, scale, skb, skh, sks, svb, svh, svs,
    N_HEAD: tl.constexpr, HEAD_DIM: tl.constexpr, DH: tl.constexpr, BLOCK_S: tl.constexpr,
    TILES: tl.constexpr, SPLITS: tl.constexpr, PDL: tl.constexpr, OUT: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_O: tl.constexpr, KV_POLICY: tl.constexpr, STAGES: tl.constexpr, FIRST: tl.constexpr,
    PREFETCH: tl.constexpr, WPREFETCH: tl.constexpr, OWN: tl.constexpr, LANES: tl.constexpr,
):  # fmt: skip
    # OUT (MmaConfig.attn_out): the head's output goes through its share of the out-projection
    # (`_head_out_proj`) instead of to attn; wo..rcount_ptr, eps are unread without it. FIRST
    # (MmaConfig.pdl_attn): the first tile's K/V loaded before the wait (`_first_tile`). PREFETCH
    # (MmaConfig.kv_prefetch): once its own tiles are read, the next layer's K/V below pf_slots into L2
    # (`kv_targets`; kn, vn, pf_slots unread without it). WPREFETCH (MmaConfig.w_prefetch): first, the program's
    # share of the weights w1..w4 into L2 (`weight_targets`; unread without it). OWN (MmaConfig.kv_prefetch_own):
    # then its own span's K/V into L2
    split = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    if WPREFETCH:  # weights, which no kernel writes: before the wait
        ptrs, nbytes, on = weight_targets(w1_ptr, w2_ptr, w3_ptr, w4_ptr, w1_bytes, w2_bytes, w3_bytes, w4_bytes,
                                          split, h, b, LANES)  # fmt: skip
        prefetch_l2(ptrs, nbytes, on)
    if OWN:  # its own span at once (earlier steps' slots; this step's, written by qkv, stays coherent in L2)
        ptrs, nbytes, on = kv_targets(k_ptr, v_ptr, len_ptr, b, h, split, n_slots, n_slots, skb, skh, sks, svb, svh,
                                      svs, BLOCK_S, TILES, LANES)  # fmt: skip
        prefetch_l2(ptrs, nbytes, on)
    if FIRST:
        k0, v0 = _first_tile(k_ptr, v_ptr, len_ptr, b, h, split, n_slots, skb, skh, sks, svb, svh, svs, DH,
                             HEAD_DIM, BLOCK_S, TILES, KV_POLICY, PDL)  # fmt: skip
    else:
        _await_previous(PDL)  # no weights here to read first
        k0, v0 = q_ptr, q_ptr  # unread
    m, denom, acc = _attend_block(q_ptr, k_ptr, v_ptr, len_ptr, b, h, split, n_slots, dim, scale, skb, skh, sks,
                                  svb, svh, svs, k0, v0, HEAD_DIM, DH, BLOCK_S, TILES, KV_POLICY, STAGES,
                                  FIRST)  # fmt: skip
    dims = tl.arange(0, DH)
    out = attn_ptr + b * dim + h * HEAD_DIM + dims
    dtype = attn_ptr.dtype.element_ty
    if SPLITS == 1:  # one program covers the whole cache: no partials, no counter, no merge
        a = (acc / denom).to(dtype)
        if OUT:
            _head_out_proj(a, wo_ptr, bo_ptr, n1w_ptr, n1b_ptr, xa_ptr, xf_ptr, opart_ptr, rcount_ptr, b, h, dim,
                           eps, N_HEAD, HEAD_DIM, DH, BLOCK_D, BLOCK_O)  # fmt: skip
        else:
            tl.store(out, a, mask=dims < HEAD_DIM)
    elif _block_is_last(
        m, denom, acc, m_ptr, l_ptr, part_ptr, count_ptr, b, h, split, n_splits, N_HEAD, DH, SPLITS
    ):
        a = _merge_blocks(m_ptr, l_ptr, part_ptr, b, h, n_splits, N_HEAD, DH, SPLITS).to(dtype)
        if OUT:
            _head_out_proj(a, wo_ptr, bo_ptr, n1w_ptr, n1b_ptr, xa_ptr, xf_ptr, opart_ptr, rcount_ptr, b, h, dim,
                           eps, N_HEAD, HEAD_DIM, DH, BLOCK_D, BLOCK_O)  # fmt: skip
        else:
            tl.store(out, a, mask=dims < HEAD_DIM)
    if PREFETCH:  # last: the fewest values live (80 registers as without it, 104 before the merge)
        ptrs, nbytes, on = kv_targets(kn_ptr, vn_ptr, len_ptr, b, h, split, n_slots, pf_slots, skb, skh, sks, svb,
                                      svh, svs, BLOCK_S, TILES, LANES)  # fmt: skip
        prefetch_l2(ptrs, nbytes, on)


@triton.jit
def _block_is_last(
    m, denom, acc, m_ptr, l_ptr, part_ptr, count_ptr, b, h, split, n_splits,
    N_HEAD: tl.constexpr, DH: tl.constexpr, SPLITS: tl.constexpr,
):  # fmt: skip
    # this block's partials (m, sum, values) stored; True in the last of the (row, head)'s blocks to finish,
    # which merges them (`_merge_blocks`)
    base = (b * N_HEAD + h) * SPLITS
    tl.store(part_ptr + (base + split) * DH + tl.arange(0, DH), acc)
    tl.store(m_ptr + base + split, m)
    tl.store(l_ptr + base + split, denom)
    tl.debug_barrier()  # every thread's partial is written before the counter says so
    return tl.atomic_add(count_ptr + b * N_HEAD + h, 1, sem="acq_rel") == n_splits - 1


@triton.jit
def _head_out_proj(
    a, wo_ptr, bo_ptr, n1w_ptr, n1b_ptr, xa_ptr, xf_ptr, opart_ptr, rcount_ptr, b, h, dim, eps,
    N_HEAD: tl.constexpr, HEAD_DIM: tl.constexpr, DH: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_O: tl.constexpr,
):  # fmt: skip
    # Head h's output a [DH] (the model dtype, as torch stores attn) times W_o[:, h's columns]^T, BLOCK_O
    # outputs at a time, stored as the head's share opart[b, h] [D] fp32; then the row's last head to arrive
    # (an int32 counter per row, left at 0 for the next layer) sums the shares in head order and stores
    # x_ffn[b] = LN1(x_attn[b] + rnd(out + b_o)).
    dims = tl.arange(0, DH)
    dmask = dims < HEAD_DIM
    af = a.to(tl.float32)
    for o0 in tl.static_range(0, BLOCK_D, BLOCK_O):
        outs = o0 + tl.arange(0, BLOCK_O)
        omask = outs < dim
        wo = tl.load(wo_ptr + outs[:, None] * dim + h * HEAD_DIM + dims[None, :], mask=omask[:, None] & dmask[None, :],
                     other=0.0)  # fmt: skip
        share = tl.sum(wo.to(tl.float32) * af[None, :], axis=1)
        tl.store(opart_ptr + (b * N_HEAD + h) * dim + outs, share, mask=omask)
    tl.debug_barrier()  # every thread's share is stored before the counter says so
    if tl.atomic_add(rcount_ptr + b, 1, sem="acq_rel") == N_HEAD - 1:
        cols = tl.arange(0, BLOCK_D)
        cmask = cols < dim
        out = tl.zeros([BLOCK_D], tl.float32)
        for hh in tl.static_range(N_HEAD):
            out += tl.load(opart_ptr + (b * N_HEAD + hh) * dim + cols, mask=cmask, other=0.0, volatile=True)
        dtype = xf_ptr.dtype.element_ty
        x1 = _post_norm_of(out, xa_ptr, bo_ptr, n1w_ptr, n1b_ptr, b, cols, cmask, dim, eps, dtype)
        tl.store(xf_ptr + b * dim + cols, x1.to(dtype), mask=cmask)
        tl.store(rcount_ptr + b, 0)


def kv_policy(cfg: MmaConfig) -> str:
    """The K/V loads' L2 eviction policy (the kernel's KV_POLICY): evict_first with cfg.kv_evict_first."""
    return "evict_first" if cfg.kv_evict_first else ""


def attn_span(cfg: MmaConfig) -> int:
    return cfg.attn_block * cfg.attn_tiles  # KV slots per attention program


def attention_stage(
    s: Scratch, layer: LayerWeights, k_layer: torch.Tensor, v_layer: torch.Tensor, lengths: torch.Tensor,
    n_slots: int, eps: float, cfg: MmaConfig, kv_next: tuple[torch.Tensor, torch.Tensor] | None = None,
    w_next: tuple[torch.Tensor, ...] | None = None,
) -> None:  # fmt: skip
    """Attention of s.q over each row's slots [0, min(lengths + 1, n_slots)) -> s.attn (model dtype); with
    cfg.attn_out, instead LN1(s.x_attn + s.attn @ W_o^T + b_o) -> s.x_ffn (what out_proj_stage stores).
    kv_next: the K / V cache of the layer whose attention runs next for these rows, which cfg.kv_prefetch
    prefetches into L2; w_next: the weights the next GEMMs read (W1, W2, the next W_qkv, W_o), which
    cfg.w_prefetch prefetches (`t2s_l2_prefetch_triton`)."""
    (n_rows, dim), n_head = s.q.shape, s.count.shape[1]
    head_dim = dim // n_head
    n_splits = triton.cdiv(n_slots, attn_span(cfg))
    block_d = triton.next_power_of_2(dim)
    kv = (k_layer, v_layer)
    prefetch, own = kv_prefetched(cfg, kv, kv_next), kv_own_prefetched(cfg, kv)
    w_prefetch = weights_prefetched(cfg, w_next, n_splits * n_head * n_rows)
    k_next, v_next = kv_next if prefetch else kv  # unread without the prefetch
    ws = w_next if w_prefetch else (layer.out_weight,) * N_WEIGHTS  # unread without the prefetch
    w_bytes = [w.numel() * w.element_size() for w in ws]
    _attention_kernel[(n_splits, n_head, n_rows)](
        s.q, k_layer, v_layer, lengths, s.m, s.l, s.part, s.count, s.attn,
        layer.out_weight, layer.out_bias, layer.norm1_weight, layer.norm1_bias, s.x_attn, s.x_ffn, s.out_part,
        s.out_count, eps, k_next, v_next, cfg.kv_prefetch * cfg.attn_block, *ws, *w_bytes,
        n_slots, n_splits, dim, 1.0 / math.sqrt(head_dim), *k_layer.stride()[:3], *v_layer.stride()[:3],
        N_HEAD=n_head, HEAD_DIM=head_dim, DH=s.part.shape[1], BLOCK_S=cfg.attn_block, TILES=cfg.attn_tiles,
        SPLITS=s.splits, OUT=cfg.attn_out, BLOCK_D=block_d, BLOCK_O=min(block_d, ATTN_OUT_BLOCK),
        KV_POLICY=kv_policy(cfg), STAGES=cfg.attn_stages, FIRST=cfg.pdl_attn, PREFETCH=prefetch,
        WPREFETCH=w_prefetch, OWN=own, LANES=32 * cfg.attn_warps, num_warps=cfg.attn_warps,
        **_launch(cfg, s.q.device, "after"),
    )  # fmt: skip
