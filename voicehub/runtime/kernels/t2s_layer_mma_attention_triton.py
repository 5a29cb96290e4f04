"""The many-row stack's attention kernel (`t2s_layer_mma_triton`), with the out-projection in its tails.

One program per (row, head, block of attn_tiles tiles of attn_block slots): online softmax over the
block's tiles below the row's length; the last of a (row, head) to finish (an int32 counter per program)
merges the blocks in a fixed order (a block as large as the cache: one program per (row, head), no
partials and no merge). The head's 32 values, rounded to the model dtype, go to `attn` for the
out-projection kernel, or, with MmaConfig.attn_out, through the head's share of the out-projection
(W_o's 32 columns of the head, fp32, stored per head); the row's last head to arrive sums the 16 shares
in head order and stores LN1(x_attn + rnd(out + b_o)) to x_ffn, where ffn1 (prenorm) reads it. A row's
numbers depend only on that row: bitwise the same alone or in any batch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from voicehub.runtime.kernels.t2s_layer import LayerWeights
from voicehub.runtime.kernels.t2s_triton_common import _await_previous, _launch, _merge_blocks, _post_norm_of

if TYPE_CHECKING:
    from voicehub.runtime.kernels.t2s_layer_mma_config import MmaConfig
    from voicehub.runtime.kernels.t2s_layer_mma_triton import Scratch

ATTN_OUT_BLOCK = 128  # out-projection outputs per chunk in a head's program (MmaConfig.attn_out)
ATTN_IN_BLOCK = 64  # input columns per chunk of a head's q / k / v projection (MmaConfig.attn_in)


@triton.jit
def _attend_tiles(
    q, k_ptr, v_ptr, b, h, start, n, scale, skb, skh, sks, svb, svh, svs,
    HEAD_DIM: tl.constexpr, DH: tl.constexpr, BLOCK_S: tl.constexpr, TILES: tl.constexpr,
    KV_POLICY: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    # Head h (its query q [DH] fp32) of row b over slots [start, start + TILES * BLOCK_S), online softmax tile by tile, visiting
    # only the tiles that hold a live slot (< n): (max m, sum of exp(s - m), p-weighted values [DH]), fp32.
    # A block with no live slot keeps m = -inf, sum 0 (it weighs nothing in the merge). STAGES > 1: Triton
    # pipelines the tiles' K/V loads (cp.async into shared memory, STAGES - 1 tiles ahead; the same values
    # and operations); 1: each tile's loads, then its math.
    dims = tl.arange(0, DH)
    dmask = dims < HEAD_DIM
    b64 = b.to(tl.int64)
    k_row = k_ptr + b64 * skb + h * skh
    v_row = v_ptr + b64 * svb + h * svh
    m = tl.max(tl.full([BLOCK_S], float("-inf"), tl.float32), axis=0)  # a scalar -inf of the loop's type
    denom = tl.sum(tl.zeros([BLOCK_S], tl.float32), axis=0)
    acc = tl.zeros([DH], tl.float32)
    # num_stages 1 compiles to the plain loop's code (PTX compared on Triton 3.6 and 3.9)
    for t in tl.range(0, tl.minimum(tl.cdiv(n - start, BLOCK_S), TILES), num_stages=STAGES):
        slots = start + t * BLOCK_S + tl.arange(0, BLOCK_S)
        live = slots < n
        kv_mask = live[:, None] & dmask[None, :]
        k = tl.load(
            k_row + slots[:, None] * sks + dims[None, :], mask=kv_mask, other=0.0, eviction_policy=KV_POLICY
        )
        v = tl.load(
            v_row + slots[:, None] * svs + dims[None, :], mask=kv_mask, other=0.0, eviction_policy=KV_POLICY
        )
        s = tl.where(live, tl.sum(k.to(tl.float32) * q[None, :], axis=1) * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))  # finite: the tile has a live slot
        alpha = tl.exp(m - m_new)  # 0 on the first tile (m = -inf)
        p = tl.exp(s - m_new)
        denom = denom * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
        m = m_new
    return m, denom, acc


@triton.jit
def _head_in_proj(
    xa_ptr, w_ptr, bias_ptr, b, h, dim, HEAD_DIM: tl.constexpr, DH: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_I: tl.constexpr,
):  # fmt: skip
    # Row b's query, key and value of head h (MmaConfig.attn_in): rnd(x W^T + bias) over W_qkv's rows of the
    # head (q, k, v: HEAD_DIM rows each), x = xa[b] the layer's input, accumulated BLOCK_I columns at a time
    # in column order (fp32), rounded to the model dtype as the qkv kernel stores them; [DH] each
    dims = tl.arange(0, DH)
    dmask = dims < HEAD_DIM
    w_rows = h * HEAD_DIM + dims
    q = tl.zeros([DH], tl.float32)
    k = tl.zeros([DH], tl.float32)
    v = tl.zeros([DH], tl.float32)
    for c0 in tl.static_range(0, BLOCK_D, BLOCK_I):
        cols = c0 + tl.arange(0, BLOCK_I)
        cmask = cols < dim
        x = tl.load(xa_ptr + b * dim + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
        w = w_ptr + w_rows[:, None] * dim + cols[None, :]
        wmask = dmask[:, None] & cmask[None, :]
        q += tl.sum(tl.load(w, mask=wmask, other=0.0).to(tl.float32) * x, axis=1)
        k += tl.sum(tl.load(w + dim * dim, mask=wmask, other=0.0).to(tl.float32) * x, axis=1)
        v += tl.sum(tl.load(w + 2 * dim * dim, mask=wmask, other=0.0).to(tl.float32) * x, axis=1)
    dtype = xa_ptr.dtype.element_ty
    q = (q + tl.load(bias_ptr + w_rows, mask=dmask, other=0.0).to(tl.float32)).to(dtype)
    k = (k + tl.load(bias_ptr + dim + w_rows, mask=dmask, other=0.0).to(tl.float32)).to(dtype)
    v = (v + tl.load(bias_ptr + 2 * dim + w_rows, mask=dmask, other=0.0).to(tl.float32)).to(dtype)
    return q, k, v


@triton.jit
def _store_new_kv(
    k, v, k_ptr, v_ptr, slot, b, h, split, span, n_splits, max_slots, skb, skh, sks, svb, svh, svs,
    HEAD_DIM: tl.constexpr, DH: tl.constexpr,
):  # fmt: skip
    # the new token's k and v into the cache at slot `slot`, by the block that holds the slot (the last block
    # for a slot past the bucket; none past the cache, as the qkv kernel), then a barrier: the block's threads
    # read the slot back among its tiles
    dims = tl.arange(0, DH)
    owner = (split == tl.minimum(slot // span, n_splits - 1)) & (slot < max_slots)
    mask = (dims < HEAD_DIM) & (tl.zeros([DH], tl.int32) + owner.to(tl.int32) != 0)
    b64, slot64 = b.to(tl.int64), slot.to(tl.int64)
    tl.store(k_ptr + b64 * skb + h * skh + slot64 * sks + dims, k, mask=mask)
    tl.store(v_ptr + b64 * svb + h * svh + slot64 * svs + dims, v, mask=mask)
    tl.debug_barrier()


@triton.jit
def _attention_kernel(
    q_ptr, k_ptr, v_ptr, len_ptr, m_ptr, l_ptr, part_ptr, count_ptr, attn_ptr,
    wo_ptr, bo_ptr, n1w_ptr, n1b_ptr, xa_ptr, xf_ptr, opart_ptr, rcount_ptr, eps, wqkv_ptr, bqkv_ptr,
    n_slots, n_splits, max_slots, dim, scale, skb, skh, sks, svb, svh, svs,
    N_HEAD: tl.constexpr, HEAD_DIM: tl.constexpr, DH: tl.constexpr, BLOCK_S: tl.constexpr,
    TILES: tl.constexpr, SPLITS: tl.constexpr, PDL: tl.constexpr, OUT: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_O: tl.constexpr, KV_POLICY: tl.constexpr, STAGES: tl.constexpr, IN_PROJ: tl.constexpr,
    BLOCK_I: tl.constexpr,
):  # fmt: skip
    # OUT (MmaConfig.attn_out): the head's output goes through its share of the out-projection
    # (`_head_out_proj`) instead of to attn; wo..rcount_ptr, eps are unread without it. IN_PROJ
    # (MmaConfig.attn_in): the program projects its own query and the new token's key and value from xa
    # (`_head_in_proj`; no qkv kernel, q_ptr unread) and stores k, v at the row's slot (`_store_new_kv`)
    _await_previous(PDL)  # no weights here to read first
    split = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    dims = tl.arange(0, DH)
    slot = tl.load(len_ptr + b).to(tl.int32)
    if IN_PROJ:
        q, k_new, v_new = _head_in_proj(xa_ptr, wqkv_ptr, bqkv_ptr, b, h, dim, HEAD_DIM, DH, BLOCK_D, BLOCK_I)
        _store_new_kv(k_new, v_new, k_ptr, v_ptr, slot, b, h, split, TILES * BLOCK_S, n_splits, max_slots, skb,
                      skh, sks, svb, svh, svs, HEAD_DIM, DH)  # fmt: skip
        q = q.to(tl.float32)
    else:
        q = tl.load(q_ptr + b * dim + h * HEAD_DIM + dims, mask=dims < HEAD_DIM, other=0.0).to(tl.float32)
    # the row's slots below its length + 1 (within the bucket's n_slots), this program's TILES tiles of them
    m, denom, acc = _attend_tiles(q, k_ptr, v_ptr, b, h, split * TILES * BLOCK_S, tl.minimum(slot + 1, n_slots),
                                  scale, skb, skh, sks, svb, svh, svs, HEAD_DIM, DH, BLOCK_S, TILES, KV_POLICY,
                                  STAGES)  # fmt: skip
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
        tl.store(count_ptr + b * N_HEAD + h, 0)  # at 0 for the next layer (attn_in: no qkv kernel zeroes it)
        if OUT:
            _head_out_proj(a, wo_ptr, bo_ptr, n1w_ptr, n1b_ptr, xa_ptr, xf_ptr, opart_ptr, rcount_ptr, b, h, dim,
                           eps, N_HEAD, HEAD_DIM, DH, BLOCK_D, BLOCK_O)  # fmt: skip
        else:
            tl.store(out, a, mask=dims < HEAD_DIM)


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
    n_slots: int, eps: float, cfg: MmaConfig, x_layer: torch.Tensor | None = None,
) -> None:  # fmt: skip
    """Attention of s.q over each row's slots [0, min(lengths + 1, n_slots)) -> s.attn (model dtype); with
    cfg.attn_out, instead LN1(s.x_attn + s.attn @ W_o^T + b_o) -> s.x_ffn (what out_proj_stage stores).
    cfg.attn_in: q, and k and v at slot lengths, projected here from the layer's input x_layer (None:
    s.x_attn, where the previous layer's ffn2 stored it), the residual of attn_out's LN1 too."""
    (n_rows, dim), n_head = s.q.shape, s.count.shape[1]
    x_layer = s.x_attn if x_layer is None else x_layer
    head_dim = dim // n_head
    n_splits = triton.cdiv(n_slots, attn_span(cfg))
    block_d = triton.next_power_of_2(dim)
    _attention_kernel[(n_splits, n_head, n_rows)](
        s.q, k_layer, v_layer, lengths, s.m, s.l, s.part, s.count, s.attn,
        layer.out_weight, layer.out_bias, layer.norm1_weight, layer.norm1_bias, x_layer, s.x_ffn, s.out_part,
        s.out_count, eps, layer.qkv_weight, layer.qkv_bias,
        n_slots, n_splits, k_layer.shape[2], dim, 1.0 / math.sqrt(head_dim), *k_layer.stride()[:3],
        *v_layer.stride()[:3], N_HEAD=n_head, HEAD_DIM=head_dim, DH=s.part.shape[1], BLOCK_S=cfg.attn_block,
        TILES=cfg.attn_tiles, SPLITS=s.splits, OUT=cfg.attn_out, BLOCK_D=block_d,
        BLOCK_O=min(block_d, ATTN_OUT_BLOCK), KV_POLICY=kv_policy(cfg), STAGES=cfg.attn_stages,
        IN_PROJ=cfg.attn_in, BLOCK_I=min(block_d, ATTN_IN_BLOCK), num_warps=cfg.attn_warps,
        **_launch(cfg, s.q.device),
    )  # fmt: skip
