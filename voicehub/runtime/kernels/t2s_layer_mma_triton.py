"""The post-norm decode stack (`t2s_layer.py`) for many rows: tensor-core tiles over blocks of rows.

`t2s_layer_triton` walks rows one at a time through GEMVs, which is the fastest at one row but
re-reads every weight tile per row group. Here each GEMM program multiplies BLOCK_M rows at once
(tl.dot: fp16 operands, fp32 accumulation), five kernels per layer:
  qkv        x [BLOCK_M, D] @ W_qkv^T + b; x is the input (layer 0) or the previous layer's LN2,
             recomputed by every program from x_ffn and the FFN's fp32 output (two passes: the rows'
             statistics, then the normalised K chunks); q to a buffer, k and v into the cache at slot lengths[b];
  attention  one program per (row, head, block of slots), online softmax below the row's length, the
             blocks merged in a fixed order, the head's 32 values rounded to the model dtype
             (`t2s_layer_mma_attention_triton`; with attn_out, the v3 table's choice, its programs also
             do the out-projection and LN1, and the out-proj kernel is skipped: four kernels a layer);
  out-proj   attn @ W_o^T, stored as fp32 (no atomics: each program owns its outputs, whole K, or
             with out_splits > 1 a fixed part of K, summed in split order by the last to finish);
  ffn1       LN1(x + out + b_o) @ W1^T + b1, relu, stored in the model dtype (as torch rounds it);
  ffn2       h @ W2^T, stored as fp32: the next layer's qkv (or the head) adds b2 and normalises;
             with ffn_slices, ffn1 and ffn2 are one kernel (`t2s_ffn_fused_triton`): four a layer.
No sum crosses programs but the attention merge, so nothing waits on float atomics and nothing is
summed in an order that depends on the batch. A row's numbers do not depend on the other rows, the
batch size or the KV bucket: every block size is fixed per model shape (`t2s_layer_mma_config`), rows past
the batch are masked to zero, and a tile's output element depends only on its own row and column.
Scratch buffers come per call (`t2s_layer_mma_scratch`; inside a CUDA graph, from the graph's pool); the
attention counters are zeroed by the qkv kernel before the attention kernel counts. On Hopper and later
the kernels use
programmatic dependent launch as `t2s_layer_triton` does: a GEMM reads its first K chunk of weights
(all of them when block_k covers the row) before it waits for the previous kernel. With
MmaConfig.row_groups the rows go in groups of whole row blocks on CUDA streams of their own, the
groups' attentions taking turns (`step_groups`, `t2s_layer_mma_groups`): the same kernels a group, so the
same numbers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from voicehub.runtime.kernels.t2s_ffn_fused_triton import ffn_fused_stage
from voicehub.runtime.kernels.t2s_ffn_ticket_triton import ffn_ticket_stage
from voicehub.runtime.kernels.t2s_l2_prefetch_triton import check_device
from voicehub.runtime.kernels.t2s_layer import (
    EmbedWeights,
    LayerWeights,
    StackWeights,
    check_args,
    check_embed_args,
)
from voicehub.runtime.kernels.t2s_layer_mma_attention_triton import attention_stage
from voicehub.runtime.kernels.t2s_layer_mma_config import MmaConfig, config_for
from voicehub.runtime.kernels.t2s_layer_mma_gemm_triton import (
    _a_dot,
    _ffn1_tail,
    _linear_tail,
    _normed_dot,
    _w_chunk,
)
from voicehub.runtime.kernels.t2s_layer_mma_groups import GroupStreams, row_spans
from voicehub.runtime.kernels.t2s_layer_mma_prenorm_triton import (
    _keeps,
)
from voicehub.runtime.kernels.t2s_layer_mma_scratch import Scratch
from voicehub.runtime.kernels.t2s_layer_mma_splitk_triton import (
    _split_is_last,
    _split_sum,
    k_span,
)
from voicehub.runtime.kernels.t2s_triton_common import _await_previous, _embed, _launch


@triton.jit
def _qkv_kernel(
    x_ptr, sxb, out_ptr, pb_ptr, pnw_ptr, pnb_ptr, w_ptr, bias_ptr,
    q_ptr, xa_ptr, count_ptr, k_ptr, v_ptr, len_ptr, part_ptr, gcount_ptr,
    n_rows, dim, max_slots, eps, k_span, skb, skh, sks, svb, svh, svs,
    N_HEAD: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, RAW: tl.constexpr,
    STORED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr, SPLITS: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    # RAW: x is the GEMM's operand (the first layer's input, or x_attn normalised by the previous ffn2);
    # programs 0 store it to x_attn (the layer's residual) unless it is there already (STORED)
    pid, split = tl.program_id(0), tl.program_id(2)
    dtype = q_ptr.dtype.element_ty
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < n_rows
    outs = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    k_lo = split * k_span
    acc = _normed_dot(
        x_ptr, sxb, out_ptr, pb_ptr, pnw_ptr, pnb_ptr, w_ptr, xa_ptr, _keeps(pid, STORED), rows, rmask,
        outs, 3 * dim, dim, eps, k_lo, tl.minimum(dim, k_lo + k_span), RAW, BLOCK_M, BLOCK_N, BLOCK_K,
        BLOCK_D, IEEE, PDL, dtype,
    )  # fmt: skip
    # the counters the attention kernel adds to start at 0 (after the wait: the last one read them)
    if pid + split == 0:
        heads = tl.arange(0, HEADS)
        tl.store(count_ptr + rows[:, None] * N_HEAD + heads[None, :], tl.zeros([BLOCK_M, HEADS], tl.int32),
                 mask=rmask[:, None] & (heads < N_HEAD)[None, :])  # fmt: skip
    if SPLITS == 1:
        _qkv_out(acc, bias_ptr, q_ptr, k_ptr, v_ptr, len_ptr, rows, rmask, outs, dim, max_slots, skb, skh, sks,
                 svb, svh, svs, HEAD_DIM)  # fmt: skip
    else:
        tile = tl.program_id(1) * tl.num_programs(0) + pid
        if _split_is_last(acc, part_ptr, gcount_ptr, tile, split, BLOCK_M, BLOCK_N, SPLITS):
            acc = _split_sum(part_ptr, gcount_ptr, tile, BLOCK_M, BLOCK_N, SPLITS)
            _qkv_out(acc, bias_ptr, q_ptr, k_ptr, v_ptr, len_ptr, rows, rmask, outs, dim, max_slots, skb, skh,
                     sks, svb, svh, svs, HEAD_DIM)  # fmt: skip


@triton.jit
def _qkv_out(
    acc, bias_ptr, q_ptr, k_ptr, v_ptr, len_ptr, rows, rmask, outs, dim, max_slots, skb, skh, sks, svb, svh, svs,
    HEAD_DIM: tl.constexpr,
):  # fmt: skip
    # rnd(acc + bias) [BLOCK_M, BLOCK_N]: q to its buffer, k and v into the cache at slot lengths[row]
    dtype = q_ptr.dtype.element_ty
    bias = tl.load(bias_ptr + outs, mask=outs < 3 * dim, other=0.0).to(tl.float32)
    y = (acc + bias[None, :]).to(dtype)
    part, head, d = outs // dim, (outs % dim) // HEAD_DIM, outs % HEAD_DIM  # part 0: q, 1: k, 2: v
    tl.store(q_ptr + rows[:, None] * dim + outs[None, :], y, mask=rmask[:, None] & (outs < dim)[None, :])
    slot = tl.load(len_ptr + rows, mask=rmask, other=max_slots).to(tl.int64)
    ok = (rmask & (slot < max_slots))[:, None]
    r64 = rows.to(tl.int64)[:, None]
    k_off = r64 * skb + (head * skh + d)[None, :] + slot[:, None] * sks
    v_off = r64 * svb + (head * svh + d)[None, :] + slot[:, None] * svs
    tl.store(k_ptr + k_off, y, mask=ok & (part == 1)[None, :])
    tl.store(v_ptr + v_off, y, mask=ok & (part == 2)[None, :])


@triton.jit
def _linear_kernel(
    a_ptr, w_ptr, out_ptr, part_ptr, gcount_ptr, n_rows, n_out, n_in, k_span,
    res_ptr, bias_ptr, nw_ptr, nb_ptr, dst_ptr, rcount_ptr, eps,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLITS: tl.constexpr,
    IEEE: tl.constexpr, PDL: tl.constexpr, NORM: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    # out [B, n_out] fp32 = a [B, n_in] @ W [n_out, n_in]^T, bias-free (the next kernel adds it); NORM: the
    # row block's last tile also stores dst = LN(res + rnd(out + bias)) (`_norm_rows_if_last`)
    split = tl.program_id(2)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    outs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < n_rows
    k_lo = split * k_span
    ks = k_lo + tl.arange(0, BLOCK_K)
    w = _w_chunk(w_ptr, outs, n_out, ks, n_in)  # the peeled first chunk's weights before the wait
    _await_previous(PDL)
    acc = _a_dot(a_ptr, w_ptr, w, rows, rmask, outs, n_out, n_in, k_lo, tl.minimum(n_in, k_lo + k_span), BLOCK_M,
                 BLOCK_N, BLOCK_K, IEEE)  # fmt: skip
    tile = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    _linear_tail(acc, out_ptr, part_ptr, gcount_ptr, tile, split, rcount_ptr, tl.program_id(1), tl.num_programs(0),
                 res_ptr, bias_ptr, nw_ptr, nb_ptr, dst_ptr, rows, rmask, outs, n_out, eps, BLOCK_M, BLOCK_N,
                 BLOCK_D, SPLITS, NORM)  # fmt: skip


@triton.jit
def _ffn1_kernel(
    xa_ptr, o_ptr, bo_ptr, n1w_ptr, n1b_ptr, w1_ptr, b1_ptr, xf_ptr, h_ptr, part_ptr, gcount_ptr,
    n_rows, dim, ffn_dim, eps, k_span,
    BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
    SPLITS: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr, PRENORM: tl.constexpr,
):  # fmt: skip
    # x1 = LN1(x + rnd(out + b_o)) (programs 0 keep it: the FFN's residual); h = relu(rnd(x1 W1^T + b1));
    # PRENORM: xa_ptr is x1 already (the out-proj stored it), a plain GEMM
    pid, split = tl.program_id(0), tl.program_id(2)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < n_rows
    hid = pid * BLOCK_F + tl.arange(0, BLOCK_F)
    k_lo = split * k_span
    acc = _normed_dot(
        xa_ptr, dim, o_ptr, bo_ptr, n1w_ptr, n1b_ptr, w1_ptr, xf_ptr, _keeps(pid, PRENORM), rows, rmask,
        hid, ffn_dim, dim, eps, k_lo, tl.minimum(dim, k_lo + k_span), PRENORM, BLOCK_M, BLOCK_F, BLOCK_K,
        BLOCK_D, IEEE, PDL, h_ptr.dtype.element_ty,
    )  # fmt: skip
    tile = tl.program_id(1) * tl.num_programs(0) + pid
    _ffn1_tail(acc, part_ptr, gcount_ptr, tile, split, b1_ptr, h_ptr, rows, rmask, hid, ffn_dim, gcount_ptr,
               BLOCK_M, BLOCK_F, SPLITS, False)  # fmt: skip


@triton.jit
def _head_kernel(
    xf_ptr, o_ptr, b2_ptr, n2w_ptr, n2b_ptr, w_ptr, logits_ptr, n_rows, dim, vocab, eps,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
    IEEE: tl.constexpr, PDL: tl.constexpr, PRENORM: tl.constexpr,
):  # fmt: skip
    # PRENORM: xf_ptr holds the last LN2's output (the last ffn2 stored it), a plain GEMM
    dtype = logits_ptr.dtype.element_ty
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < n_rows
    outs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = _normed_dot(
        xf_ptr, dim, o_ptr, b2_ptr, n2w_ptr, n2b_ptr, w_ptr, xf_ptr, False, rows, rmask, outs, vocab, dim,
        eps, 0, dim, PRENORM, BLOCK_M, BLOCK_N, BLOCK_K, BLOCK_D, IEEE, PDL, dtype,
    )  # fmt: skip
    mask = rmask[:, None] & (outs < vocab)[None, :]
    tl.store(logits_ptr + rows[:, None] * vocab + outs[None, :], acc.to(dtype), mask=mask)


@triton.jit
def _embed_kernel(tok_ptr, pos_ptr, table_ptr, pe_ptr, alpha_ptr, x_ptr, dim, BLOCK_D: tl.constexpr):
    # x[row] = table[token] + alpha * pe[pos], rounded as `embed_audio_at` stores it (`_embed`)
    row, cols = tl.program_id(0), tl.arange(0, BLOCK_D)
    mask = cols < dim
    dtype = x_ptr.dtype.element_ty
    x = _embed(tok_ptr, pos_ptr, table_ptr, pe_ptr, alpha_ptr, row, cols, mask, dim, dtype)
    tl.store(x_ptr + row * dim + cols, x.to(dtype), mask=mask)


def _dims(s: Scratch, cfg: MmaConfig, edge: str = "") -> dict:
    dim = s.q.shape[1]
    return dict(BLOCK_M=cfg.block_m, BLOCK_K=cfg.block_k, BLOCK_D=triton.next_power_of_2(dim),
                IEEE=s.q.dtype == torch.float32, num_warps=cfg.gemm_warps, num_stages=cfg.gemm_stages,
                **_launch(cfg, s.q.device, edge))  # fmt: skip


def qkv_stage(
    s: Scratch, x_in: torch.Tensor, prev: LayerWeights | None, layer: LayerWeights,
    k_layer: torch.Tensor, v_layer: torch.Tensor, lengths: torch.Tensor, eps: float, cfg: MmaConfig,
) -> None:  # fmt: skip
    """x_in: the input [B, D] (prev None) or the previous x_ffn with s.out_ffn: writes s.x_attn, s.q,
    k and v at slot lengths; zeroes s.count. With cfg.prenorm (and prev), x_in is unused: the previous
    ffn2 stored this layer's input in s.x_attn."""
    (n_rows, dim), n_head = s.q.shape, s.count.shape[1]
    p = prev or layer  # unused by the first layer
    is_stored = prev is not None and cfg.prenorm  # the previous ffn2 normalised it into s.x_attn
    x_in = s.x_attn if is_stored else x_in
    _qkv_kernel[(triton.cdiv(3 * dim, cfg.block_n), triton.cdiv(n_rows, cfg.block_m), cfg.qkv_splits)](
        x_in, x_in.stride(0), s.out_ffn, p.ffn2_bias, p.norm2_weight, p.norm2_bias, layer.qkv_weight,
        layer.qkv_bias, s.q, s.x_attn, s.count, k_layer, v_layer, lengths, s.gemm_part, s.gemm_count,
        n_rows, dim, k_layer.shape[2], eps, k_span(dim, cfg.block_k, cfg.qkv_splits), *k_layer.stride()[:3],
        *v_layer.stride()[:3], N_HEAD=n_head, HEADS=triton.next_power_of_2(n_head), HEAD_DIM=dim // n_head,
        RAW=prev is None or is_stored, STORED=is_stored, BLOCK_N=cfg.block_n, SPLITS=cfg.qkv_splits,
        **_dims(s, cfg, "before"),
    )  # fmt: skip


def linear_stage(
    s: Scratch, a: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, splits: int, cfg: MmaConfig,
    norm: tuple[torch.Tensor, ...] | None = None, eps: float = 0.0,
) -> None:  # fmt: skip
    """out [B, N] fp32 = a [B, K] @ weight [N, K]^T, K in `splits` fixed parts (s.gemm_part, s.gemm_count).
    norm: (res, bias, norm_w, norm_b, dst): also dst [B, N] = LN(res + rnd(out + bias)) (s.row_count)."""
    n_rows, n_in = a.shape
    n_out = weight.shape[0]
    res, bias, norm_w, norm_b, dst = norm or (out,) * 5  # unread without NORM
    _linear_kernel[(triton.cdiv(n_out, cfg.block_n), triton.cdiv(n_rows, cfg.block_m), splits)](
        a, weight, out, s.gemm_part, s.gemm_count, n_rows, n_out, n_in, k_span(n_in, cfg.block_k, splits),
        res, bias, norm_w, norm_b, dst, s.row_count, eps,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLITS=splits,
        IEEE=a.dtype == torch.float32, NORM=norm is not None, BLOCK_D=triton.next_power_of_2(n_out),
        num_warps=cfg.gemm_warps, num_stages=cfg.gemm_stages, **_launch(cfg, a.device),
    )  # fmt: skip


def out_proj_stage(s: Scratch, layer: LayerWeights, eps: float, cfg: MmaConfig) -> None:
    """s.attn @ W_o^T -> s.out_attn (fp32, bias-free); cfg.prenorm: LN1(s.x_attn + that + b_o) -> s.x_ffn.
    cfg.attn_out: nothing (the attention kernel stored LN1)."""
    if cfg.attn_out:
        return
    norm = (s.x_attn, layer.out_bias, layer.norm1_weight, layer.norm1_bias, s.x_ffn) if cfg.prenorm else None
    linear_stage(s, s.attn, layer.out_weight, s.out_attn, cfg.out_splits, cfg, norm, eps)


def ffn2_stage(s: Scratch, layer: LayerWeights, eps: float, cfg: MmaConfig) -> None:
    """s.h @ W2^T -> s.out_ffn (fp32, bias-free); cfg.prenorm: LN2(s.x_ffn + that + b2) -> s.x_attn (the
    next layer's input, or the head's). cfg.ffn_slices or cfg.ffn_tickets: nothing (ffn1_stage ran the
    whole FFN)."""
    if cfg.ffn_slices or cfg.ffn_tickets:
        return
    norm = (s.x_ffn, layer.ffn2_bias, layer.norm2_weight, layer.norm2_bias, s.x_attn) if cfg.prenorm else None
    linear_stage(s, s.h, layer.ffn2_weight, s.out_ffn, cfg.ffn2_splits, cfg, norm, eps)


def ffn1_stage(s: Scratch, layer: LayerWeights, eps: float, cfg: MmaConfig) -> None:
    """x1 = LN1(s.x_attn + s.out_attn + b_o) -> s.x_ffn; relu(x1 W1^T + b1) -> s.h (cfg.prenorm: x1 read
    from s.x_ffn, where the out-proj stored it). cfg.ffn_slices: the whole FFN in one kernel, s.out_ffn
    as ffn2_stage leaves it (`t2s_ffn_fused_triton`; s.h unused). cfg.ffn_tickets: ffn1 and ffn2 in one
    kernel (`t2s_ffn_ticket_triton`), what the two leave."""
    if cfg.ffn_slices:
        ffn_fused_stage(s, layer, eps, cfg)
        return
    if cfg.ffn_tickets:
        ffn_ticket_stage(s, layer, eps, cfg)
        return
    n_rows, dim = s.q.shape
    ffn_dim = s.h.shape[1]
    _ffn1_kernel[(triton.cdiv(ffn_dim, cfg.ffn_block), triton.cdiv(n_rows, cfg.block_m), cfg.ffn1_splits)](
        s.x_ffn if cfg.prenorm else s.x_attn, s.out_attn, layer.out_bias, layer.norm1_weight,
        layer.norm1_bias, layer.ffn1_weight,
        layer.ffn1_bias, s.x_ffn, s.h, s.gemm_part, s.gemm_count, n_rows, dim, ffn_dim, eps,
        k_span(dim, cfg.block_k, cfg.ffn1_splits), BLOCK_F=cfg.ffn_block, SPLITS=cfg.ffn1_splits,
        PRENORM=cfg.prenorm, **_dims(s, cfg),
    )  # fmt: skip


def head_stage(
    s: Scratch,
    last: LayerWeights,
    head_weight: torch.Tensor,
    logits: torch.Tensor,
    eps: float,
    cfg: MmaConfig,
) -> None:
    """LN2(s.x_ffn + s.out_ffn + b2) of the last layer @ head^T -> logits [B, V] (cfg.prenorm: LN2 read
    from s.x_attn, where the last ffn2 stored it)."""
    n_rows, dim = s.q.shape
    vocab = head_weight.shape[0]
    _head_kernel[(triton.cdiv(vocab, cfg.block_n), triton.cdiv(n_rows, cfg.block_m))](
        s.x_attn if cfg.prenorm else s.x_ffn, s.out_ffn, last.ffn2_bias, last.norm2_weight, last.norm2_bias,
        head_weight, logits, n_rows, dim, vocab, eps, BLOCK_N=cfg.block_n, PRENORM=cfg.prenorm,
        **_dims(s, cfg),
    )  # fmt: skip


def step_rows(
    s: Scratch, x: torch.Tensor, weights: StackWeights, k_cache: torch.Tensor, v_cache: torch.Tensor,
    lengths: torch.Tensor, n_slots: int, cfg: MmaConfig, logits: torch.Tensor,
) -> None:  # fmt: skip
    """Every layer and the head into logits [B, V], with scratch s (a caller may hold one per row group):
    `step_groups` with one group."""
    step_groups([s], [(0, x.shape[0])], x, weights, k_cache, v_cache, lengths, n_slots, cfg, logits)


def step_groups(
    scratch: list[Scratch], spans: list[tuple[int, int]], x: torch.Tensor, weights: StackWeights,
    k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor, n_slots: int, cfg: MmaConfig,
    logits: torch.Tensor,
) -> None:  # fmt: skip
    """Every layer and the head into logits [B, V] over row groups (`row_spans`, a scratch each), each
    group's kernels on the streams `GroupStreams` gives it (the attentions in (layer, group) order, beside
    the other groups' GEMMs). On the CPU the groups run one after another."""
    check_device(cfg, x.device)  # an L2 prefetch the GPU cannot run raises before any kernel launches
    streams = GroupStreams(x, len(spans), cfg)
    x_in, prev = [x[lo:hi] for lo, hi in spans], None
    for i, layer in enumerate(weights.layers):
        for g, ((lo, hi), s) in enumerate(zip(spans, scratch)):
            k, v, rows = k_cache[i, lo:hi], v_cache[i, lo:hi], lengths[lo:hi]
            with streams.gemms(g):
                qkv_stage(s, x_in[g], prev, layer, k, v, rows, weights.eps, cfg)
            nxt = (i + 1) % len(weights.layers)  # the last layer's attention prefetches the next step's first
            kv_next = (k_cache[nxt, lo:hi], v_cache[nxt, lo:hi]) if cfg.kv_prefetch else None
            after = weights.layers[nxt]  # the GEMMs after this attention: W1, W2 here, W_qkv and W_o next
            w_next = (layer.ffn1_weight, layer.ffn2_weight, after.qkv_weight, after.out_weight)
            w_next = w_next if g == 0 and cfg.w_prefetch else None  # once a layer
            with streams.attention(g):
                attention_stage(s, layer, k, v, rows, n_slots, weights.eps, cfg, kv_next, w_next)
            with streams.gemms(g):
                out_proj_stage(s, layer, weights.eps, cfg)
                ffn1_stage(s, layer, weights.eps, cfg)
                ffn2_stage(s, layer, weights.eps, cfg)
            x_in[g] = s.x_ffn
        prev = layer
    for g, ((lo, hi), s) in enumerate(zip(spans, scratch)):
        with streams.gemms(g):
            head_stage(s, weights.layers[-1], weights.head_weight, logits[lo:hi], weights.eps, cfg)
    streams.join()


def decode_stack_mma(
    x: torch.Tensor, weights: StackWeights, k_cache: torch.Tensor, v_cache: torch.Tensor,
    lengths: torch.Tensor, n_slots: int, *, config: MmaConfig | None = None,
) -> torch.Tensor:  # fmt: skip
    """The `triton` backend of T2S_LAYER_STACK_ROWS: x [B, D] -> logits [B, V] in x's dtype, the
    contract of T2S_LAYER_STACK (`t2s_layer.py`), tiled over rows for batches of many streams.

    config: block sizes overriding `config_for` (for tuning; other blocks change the rounding)."""
    check_args(x, weights, k_cache, v_cache, lengths, n_slots)
    return _run_stack(x, weights, k_cache, v_cache, lengths, n_slots, config)


def embed_stack_mma(
    tokens: torch.Tensor, audio_pos: torch.Tensor, embed: EmbedWeights, weights: StackWeights,
    k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor, n_slots: int, *,
    config: MmaConfig | None = None,
) -> torch.Tensor:  # fmt: skip
    """The `triton` backend of T2S_EMBED_STACK_ROWS: tokens, audio_pos [B] -> logits [B, V], the contract
    of T2S_EMBED_STACK tiled over rows: one kernel gathers the embedding (torch's `embed_audio_at` is four:
    two gathers, a product and a sum), then `decode_stack_mma`, bitwise."""
    check_embed_args(tokens, audio_pos, embed, weights)
    dim = weights.head_weight.shape[1]
    x = torch.empty(tokens.shape[0], dim, device=tokens.device, dtype=weights.head_weight.dtype)
    check_args(x, weights, k_cache, v_cache, lengths, n_slots)
    if x.shape[0]:
        # no FP contraction: LLVM narrows the rounded product and sum to half ops and would fuse them into
        # one fma.rn.f16, skipping the product's rounding that torch (and `_embed`) keep
        _embed_kernel[(x.shape[0],)](tokens, audio_pos, *embed, x, dim, BLOCK_D=triton.next_power_of_2(dim),
                                     enable_fp_fusion=False)  # fmt: skip
    return _run_stack(x, weights, k_cache, v_cache, lengths, n_slots, config)


def _run_stack(
    x: torch.Tensor, weights: StackWeights, k_cache: torch.Tensor, v_cache: torch.Tensor,
    lengths: torch.Tensor, n_slots: int, config: MmaConfig | None,
) -> torch.Tensor:  # fmt: skip
    (vocab, dim), n_rows = weights.head_weight.shape, x.shape[0]
    ffn_dim = weights.layers[0].ffn1_weight.shape[0]
    cfg = config or config_for(dim, ffn_dim, weights.n_head, vocab, n_rows, n_slots)
    logits = torch.empty(n_rows, vocab, device=x.device, dtype=x.dtype)
    spans = row_spans(n_rows, cfg)
    scratch = Scratch.allocate_groups([hi - lo for lo, hi in spans], weights, k_cache.shape[3], cfg)
    step_groups(scratch, spans, x, weights, k_cache, v_cache, lengths, n_slots, cfg, logits)
    return logits
