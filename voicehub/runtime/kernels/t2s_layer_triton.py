"""The post-norm decode stack (`t2s_layer.py`) in Triton: three kernels per layer and one for the head.

At one row a decode step is a chain of small GEMVs, and its time is the number of kernels times
each one's latency, so each kernel is one memory-bound pass over a weight with its neighbours fused:
  qkv       layer 0: the input x, or (T2S_EMBED_STACK) the gather table[token] + alpha * pe[pos];
            other layers: the previous layer's LN2 (recomputed by every program from its 512-vector, cheap), the
            GEMV W_qkv + b, q to a buffer, k and v straight into the cache at slot lengths[b];
  attention one program per (row, head, block of slots) reads only slots below the row's length;
            the last program of a (row, head) to finish (an atomic counter) merges the blocks, then
            multiplies its head's 32 values into the out-projection's 32 columns;
  ffn       LN1 of (residual + out-projection), relu(W1 x + b1) for a block of hidden units, then
            those units' share of W2 h;
  head      the last LN2 and the logits.
Partial sums that cross programs (heads of the out-projection, hidden blocks of W2) are added as
32.32 fixed-point int64 with integer atomics: the sum is exact whatever the order, so results are
deterministic and a row's numbers do not depend on the batch, its bucket or the other rows. (fp32
atomics would make results vary run to run; a second reduction pass costs a kernel per layer.)
On Hopper and later the kernels use programmatic dependent launch (`_await_previous`): each one is
launched while the previous one still runs and loads its weights before it waits for it, so the launch
gaps and the weight loads overlap the previous kernel's tail (`StackConfig.pdl=False` turns it off).
Block sizes depend only on the model's shape and the cache size (`config_for`), never on the batch
or the bucket, for the same reason. Scratch buffers are allocated per call: inside a CUDA graph they
come from the graph's pool, and every accumulator is zeroed by the kernel before the one that adds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from voicehub.runtime.kernels.t2s_layer import (
    FIXED_POINT_SCALE,
    EmbedWeights,
    LayerWeights,
    StackWeights,
    check_args,
    check_embed_args,
)
from voicehub.runtime.kernels.t2s_triton_common import (
    _await_previous,
    _embed,
    _launch,
    _merge_blocks,
    _post_norm_of,
    attention_scratch,
)

_FIXED = tl.constexpr(FIXED_POINT_SCALE)  # float -> accumulator units
_UNFIXED = tl.constexpr(1.0 / FIXED_POINT_SCALE)


@dataclass(frozen=True)
class StackConfig:
    """Per kernel: outputs (qkv, head), KV slots (attention) or hidden units (ffn) per program, and
    warps. All but rows_per_program and pdl change the order of float additions: fixed per model shape."""

    qkv_block: int = 16
    attn_block: int = 64
    ffn_block: int = 16
    head_block: int = 8
    qkv_warps: int = 4
    attn_warps: int = 4
    ffn_warps: int = 4
    head_warps: int = 4
    rows_per_program: int = 4  # batch rows a GEMV program walks through with its weights in registers
    pdl: bool = True  # programmatic dependent launch where the GPU has it (sm_90+): no effect on results

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if name != "pdl" and (value < 1 or value & (value - 1)):
                raise ValueError(f"StackConfig.{name} must be a power of two, got {value}")


# (dim, ffn_dim, n_head, vocab) -> config. v3 T2S: ~100-130 programs per GEMV at one row (132 SMs),
# each reading 16 KB of weights; 64-slot attention blocks give 16 heads x 12 blocks at 730 slots.
# H200 sweep (benchmarks/results/t2s_layer_h200.json): attn_block 32 and ffn_block 32 each beat the
# defaults at one row (395 and 387 us per step vs 406)
CONFIGS = {(512, 2048, 16, 1025): StackConfig(attn_block=32, ffn_block=32)}


def config_for(dim: int, ffn_dim: int, n_head: int, vocab: int) -> StackConfig:
    """The table's entry, else blocks of ~32K weights per program (few programs: small test shapes)."""
    if (dim, ffn_dim, n_head, vocab) in CONFIGS:
        return CONFIGS[dim, ffn_dim, n_head, vocab]
    rows = max(1, 32768 // triton.next_power_of_2(dim))  # weight rows per program
    return StackConfig(qkv_block=rows, ffn_block=max(1, rows // 2), head_block=rows)


@triton.jit
def _post_norm(res_ptr, acc_ptr, bias_ptr, nw_ptr, nb_ptr, row, cols, mask, dim, eps, dtype: tl.constexpr):
    # LN(residual + rnd(from_fixed(acc) + bias)) of one row: [BLOCK_D] float32, 0 where ~mask
    branch = tl.load(acc_ptr + row * dim + cols, mask=mask, other=0).to(tl.float32) * _UNFIXED
    return _post_norm_of(branch, res_ptr, bias_ptr, nw_ptr, nb_ptr, row, cols, mask, dim, eps, dtype)


@triton.jit
def _qkv_kernel(
    x_ptr, acc_ptr, pb_ptr, pnw_ptr, pnb_ptr, w_ptr, bias_ptr,
    q_ptr, xa_ptr, acc_attn_ptr, count_ptr, k_ptr, v_ptr, len_ptr,
    tok_ptr, pos_ptr, table_ptr, pe_ptr, alpha_ptr,
    n_rows, dim, max_slots, eps, sxb, skb, skh, sks, svb, svh, svs,
    N_HEAD: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, FIRST: tl.constexpr,
    EMBED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    dtype = q_ptr.dtype.element_ty
    outs = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    omask = outs < 3 * dim
    cols = tl.arange(0, BLOCK_D)
    cmask = cols < dim
    w = tl.load(w_ptr + outs[:, None] * dim + cols[None, :], mask=omask[:, None] & cmask[None, :], other=0.0)
    bias = tl.load(bias_ptr + outs, mask=omask, other=0.0).to(tl.float32)
    part = outs // dim  # 0: q, 1: k, 2: v
    head = (outs % dim) // HEAD_DIM
    d = outs % HEAD_DIM
    heads = tl.arange(0, HEADS)
    _await_previous(PDL)
    for i in range(ROWS):
        b = tl.program_id(1) * ROWS + i
        ok = b < n_rows  # masks below compare with a limit that is 0 past the batch
        row_cols = cols < tl.where(ok, dim, 0)
        if EMBED:  # layer 0 gathers its input (the token index clamped: rows past the batch load nothing)
            x = _embed(tok_ptr, pos_ptr, table_ptr, pe_ptr, alpha_ptr, tl.minimum(b, n_rows - 1), cols,
                       row_cols, dim, dtype)  # fmt: skip
        elif FIRST:
            x = tl.load(x_ptr + b * sxb + cols, mask=row_cols, other=0.0).to(tl.float32)
        else:  # the previous layer's last step: LN2(x1 + ffn + b2)
            x = _post_norm(x_ptr, acc_ptr, pb_ptr, pnw_ptr, pnb_ptr, b, cols, row_cols, dim, eps, dtype)
        if pid == 0:  # the residual for kernel 3; the accumulators kernel 2 adds into start at 0
            tl.store(xa_ptr + b * dim + cols, x.to(dtype), mask=row_cols)
            tl.store(acc_attn_ptr + b * dim + cols, tl.zeros([BLOCK_D], tl.int64), mask=row_cols)
            tl.store(count_ptr + b * N_HEAD + heads, tl.zeros([HEADS], tl.int32),
                     mask=heads < tl.where(ok, N_HEAD, 0))  # fmt: skip
        y = (tl.sum(w.to(tl.float32) * x[None, :], axis=1) + bias).to(dtype)
        slot = tl.load(len_ptr + tl.minimum(b, n_rows - 1))
        b64 = b.to(tl.int64)
        tl.store(q_ptr + b * dim + (outs % dim), y, mask=(outs < tl.where(ok, dim, 0)))
        kv_ok = outs < tl.where(ok, tl.where(slot < max_slots, 3 * dim, 0), 0)
        tl.store(k_ptr + b64 * skb + head * skh + slot * sks + d, y, mask=kv_ok & (part == 1))
        tl.store(v_ptr + b64 * svb + head * svh + slot * svs + d, y, mask=kv_ok & (part == 2))


@triton.jit
def _attend_block(
    q_ptr, k_ptr, v_ptr, len_ptr, m_ptr, l_ptr, part_ptr, count_ptr, b, h, split,
    n_slots, n_splits, dim, scale, skb, skh, sks, svb, svh, svs,
    N_HEAD: tl.constexpr, HEAD_DIM: tl.constexpr, DH: tl.constexpr, BLOCK_S: tl.constexpr, SPLITS: tl.constexpr,
):  # fmt: skip
    # One block of row b's cached slots (only those below its length) for head h: the block's softmax
    # partials (max m, sum l, p-weighted values) to the scratch. True in the program that finishes the
    # (row, head) last, which then merges every block (`_merge_blocks`).
    n = tl.minimum(tl.load(len_ptr + b).to(tl.int32) + 1, n_slots)
    slots = split * BLOCK_S + tl.arange(0, BLOCK_S)
    dims = tl.arange(0, DH)
    dmask = dims < HEAD_DIM
    live = slots < n
    q = tl.load(q_ptr + b * dim + h * HEAD_DIM + dims, mask=dmask, other=0.0).to(tl.float32)
    kv_mask = live[:, None] & dmask[None, :]
    b64 = b.to(tl.int64)
    k = tl.load(k_ptr + b64 * skb + h * skh + slots[:, None] * sks + dims[None, :], mask=kv_mask, other=0.0)
    v = tl.load(v_ptr + b64 * svb + h * svh + slots[:, None] * svs + dims[None, :], mask=kv_mask, other=0.0)
    s = tl.where(live, tl.sum(k.to(tl.float32) * q[None, :], axis=1) * scale, float("-inf"))
    m = tl.max(s, axis=0)
    p = tl.exp(s - tl.where(m == float("-inf"), 0.0, m))  # 0 for dead slots, no NaN when all are
    base = (b * N_HEAD + h) * SPLITS
    tl.store(part_ptr + (base + split) * DH + dims, tl.sum(p[:, None] * v.to(tl.float32), axis=0))
    tl.store(m_ptr + base + split, m)
    tl.store(l_ptr + base + split, tl.sum(p, axis=0))
    tl.debug_barrier()  # every thread's partial is written before the counter says so
    return tl.atomic_add(count_ptr + b * N_HEAD + h, 1, sem="acq_rel") == n_splits - 1


@triton.jit
def _attention_kernel(
    q_ptr, k_ptr, v_ptr, len_ptr, m_ptr, l_ptr, part_ptr, count_ptr, wo_ptr, acc_attn_ptr, acc_ffn_ptr,
    n_slots, n_splits, dim, scale, skb, skh, sks, svb, svh, svs,
    N_HEAD: tl.constexpr, HEAD_DIM: tl.constexpr, DH: tl.constexpr, BLOCK_S: tl.constexpr,
    SPLITS: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    _await_previous(PDL)  # nothing of this kernel's own to read first (W_o only in the merging program)
    split = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    dtype = q_ptr.dtype.element_ty
    rows = tl.arange(0, BLOCK_D)
    if split + h == 0:  # kernel 3 adds into it next
        tl.store(acc_ffn_ptr + b * dim + rows, tl.zeros([BLOCK_D], tl.int64), mask=rows < dim)
    last = _attend_block(q_ptr, k_ptr, v_ptr, len_ptr, m_ptr, l_ptr, part_ptr, count_ptr, b, h, split, n_slots,
                         n_splits, dim, scale, skb, skh, sks, svb, svh, svs, N_HEAD, HEAD_DIM, DH, BLOCK_S,
                         SPLITS)  # fmt: skip
    if last:
        # the last block of this (row, head): the merge, then its head's share of the out-projection
        dims = tl.arange(0, DH)
        wo_mask = (rows < dim)[:, None] & (dims < HEAD_DIM)[None, :]
        wo = tl.load(wo_ptr + rows[:, None] * dim + h * HEAD_DIM + dims[None, :], mask=wo_mask, other=0.0)
        a = _merge_blocks(m_ptr, l_ptr, part_ptr, b, h, n_splits, N_HEAD, DH, SPLITS).to(dtype).to(tl.float32)
        out = tl.sum(wo.to(tl.float32) * a[None, :], axis=1)
        tl.atomic_add(
            acc_attn_ptr + b * dim + rows, (out * _FIXED).to(tl.int64), mask=rows < dim, sem="relaxed"
        )


@triton.jit
def _ffn_kernel(
    xa_ptr, acc_attn_ptr, bo_ptr, n1w_ptr, n1b_ptr, w1_ptr, b1_ptr, w2_ptr, xf_ptr, acc_ffn_ptr,
    n_rows, dim, ffn_dim, eps,
    BLOCK_F: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    dtype = xf_ptr.dtype.element_ty
    hid = pid * BLOCK_F + tl.arange(0, BLOCK_F)
    hmask = hid < ffn_dim
    cols = tl.arange(0, BLOCK_D)
    cmask = cols < dim
    wmask = hmask[:, None] & cmask[None, :]
    w1 = tl.load(w1_ptr + hid[:, None] * dim + cols[None, :], mask=wmask, other=0.0)
    b1 = tl.load(b1_ptr + hid, mask=hmask, other=0.0).to(tl.float32)
    w2t = tl.load(w2_ptr + cols[None, :] * ffn_dim + hid[:, None], mask=wmask, other=0.0)  # W2[:, hid]^T
    _await_previous(PDL)
    for i in range(ROWS):
        b = tl.program_id(1) * ROWS + i
        row_cols = cols < tl.where(b < n_rows, dim, 0)
        x1 = _post_norm(xa_ptr, acc_attn_ptr, bo_ptr, n1w_ptr, n1b_ptr, b, cols, row_cols, dim, eps, dtype)
        if pid == 0:  # the residual of this layer's FFN, read by the next kernel
            tl.store(xf_ptr + b * dim + cols, x1.to(dtype), mask=row_cols)
        hidden = (tl.sum(w1.to(tl.float32) * x1[None, :], axis=1) + b1).to(dtype).to(tl.float32)
        hidden = tl.maximum(hidden, 0.0)
        out = tl.sum(w2t.to(tl.float32) * hidden[:, None], axis=0)
        tl.atomic_add(acc_ffn_ptr + b * dim + cols, (out * _FIXED).to(tl.int64), mask=row_cols, sem="relaxed")


@triton.jit
def _head_kernel(
    xf_ptr, acc_ptr, b2_ptr, n2w_ptr, n2b_ptr, w_ptr, out_ptr, n_rows, dim, vocab, eps,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    outs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    omask = outs < vocab
    cols = tl.arange(0, BLOCK_D)
    cmask = cols < dim
    w = tl.load(w_ptr + outs[:, None] * dim + cols[None, :], mask=omask[:, None] & cmask[None, :], other=0.0)
    _await_previous(PDL)
    for i in range(ROWS):
        b = tl.program_id(1) * ROWS + i
        ok = b < n_rows
        row_cols = cols < tl.where(ok, dim, 0)
        x = _post_norm(xf_ptr, acc_ptr, b2_ptr, n2w_ptr, n2b_ptr, b, cols, row_cols, dim, eps,
                       out_ptr.dtype.element_ty)  # fmt: skip
        y = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
        tl.store(
            out_ptr + b * vocab + outs, y.to(out_ptr.dtype.element_ty), mask=outs < tl.where(ok, vocab, 0)
        )


@dataclass
class Scratch:
    """The buffers kernels hand to each other, [B, D] unless noted: q, x_attn (a layer's input),
    x_ffn (LN1's output), acc_attn and acc_ffn (int64 accumulators), count [B, H] int32, and the
    attention blocks' partials m, l [B * H * splits] and part [B * H * splits, DH] (float32)."""

    q: torch.Tensor
    x_attn: torch.Tensor
    x_ffn: torch.Tensor
    acc_attn: torch.Tensor
    acc_ffn: torch.Tensor
    count: torch.Tensor
    m: torch.Tensor
    l: torch.Tensor  # noqa: E741
    part: torch.Tensor
    splits: int  # attention blocks of the whole cache: the merge's fixed shape

    @classmethod
    def allocate(cls, n_rows: int, weights: StackWeights, max_slots: int, cfg: StackConfig) -> Scratch:
        """Buffers for n_rows rows of a stack of `weights` (their dim, head count, dtype, device)."""
        dim, dtype, dev = weights.head_weight.shape[1], weights.head_weight.dtype, weights.head_weight.device

        def like_x() -> torch.Tensor:
            return torch.empty(n_rows, dim, device=dev, dtype=dtype)

        acc = torch.empty(2, n_rows, dim, device=dev, dtype=torch.int64)
        attn = attention_scratch(n_rows, weights, max_slots, cfg.attn_block)
        return cls(like_x(), like_x(), like_x(), acc[0], acc[1], *attn)


def _rows(n_rows: int, cfg: StackConfig) -> int:
    return min(cfg.rows_per_program, triton.next_power_of_2(n_rows))


class TokenInput(NamedTuple):
    """Layer 0's input as T2S_EMBED_STACK takes it: tokens, audio_pos [B] integer and the embedding."""

    tokens: torch.Tensor
    audio_pos: torch.Tensor
    embed: EmbedWeights


def qkv_stage(
    s: Scratch, x_in: torch.Tensor | TokenInput, prev: LayerWeights | None, layer: LayerWeights,
    k_layer: torch.Tensor, v_layer: torch.Tensor, lengths: torch.Tensor, eps: float, cfg: StackConfig,
) -> None:  # fmt: skip
    """Kernel 1 (`qkv_stage_reference`): x_in is the embedded input or a `TokenInput` whose embedding
    the kernel gathers (prev None), or the previous x_ffn, with s.acc_ffn; writes s.x_attn (the
    layer's input, the residual of kernel 3), s.q, the cache at lengths; zeroes s.acc_attn and s.count."""
    (n_rows, dim), n_head = s.q.shape, s.count.shape[1]
    rows = _rows(n_rows, cfg)
    p = prev or layer  # unused by the first layer
    is_embed = isinstance(x_in, TokenInput)
    # unused pointers get a tensor of the right device (the kernel's constexpr branches never read them)
    x, gather = (s.x_attn, (x_in.tokens, x_in.audio_pos, *x_in.embed)) if is_embed else (x_in, (lengths,) * 5)
    _qkv_kernel[(triton.cdiv(3 * dim, cfg.qkv_block), triton.cdiv(n_rows, rows))](
        x, s.acc_ffn, p.ffn2_bias, p.norm2_weight, p.norm2_bias, layer.qkv_weight, layer.qkv_bias,
        s.q, s.x_attn, s.acc_attn, s.count, k_layer, v_layer, lengths, *gather,
        n_rows, dim, k_layer.shape[2], eps, x.stride(0), *k_layer.stride()[:3], *v_layer.stride()[:3],
        N_HEAD=n_head, HEADS=triton.next_power_of_2(n_head), HEAD_DIM=dim // n_head, FIRST=prev is None,
        EMBED=is_embed, BLOCK_N=cfg.qkv_block, BLOCK_D=triton.next_power_of_2(dim), ROWS=rows,
        num_warps=cfg.qkv_warps, **_launch(cfg, s.q.device),
    )  # fmt: skip


def attention_stage(
    s: Scratch, out_weight: torch.Tensor, k_layer: torch.Tensor, v_layer: torch.Tensor,
    lengths: torch.Tensor, n_slots: int, cfg: StackConfig,
) -> None:  # fmt: skip
    """Kernel 2 (`attention_stage_reference`): adds into s.acc_attn (zeroed by kernel 1); zeroes s.acc_ffn."""
    (n_rows, dim), n_head = s.q.shape, s.count.shape[1]
    head_dim = dim // n_head
    n_splits = triton.cdiv(n_slots, cfg.attn_block)
    _attention_kernel[(n_splits, n_head, n_rows)](
        s.q, k_layer, v_layer, lengths, s.m, s.l, s.part, s.count, out_weight, s.acc_attn, s.acc_ffn,
        n_slots, n_splits, dim, 1.0 / math.sqrt(head_dim), *k_layer.stride()[:3], *v_layer.stride()[:3],
        N_HEAD=n_head, HEAD_DIM=head_dim, DH=s.part.shape[1], BLOCK_S=cfg.attn_block, SPLITS=s.splits,
        BLOCK_D=triton.next_power_of_2(dim), num_warps=cfg.attn_warps, **_launch(cfg, s.q.device),
    )  # fmt: skip


def ffn_stage(s: Scratch, layer: LayerWeights, eps: float, cfg: StackConfig) -> None:
    """Kernel 3 (`ffn_stage_reference`): reads s.x_attn and s.acc_attn; writes s.x_ffn, adds into s.acc_ffn."""
    n_rows, dim = s.q.shape
    ffn_dim = layer.ffn1_weight.shape[0]
    rows = _rows(n_rows, cfg)
    _ffn_kernel[(triton.cdiv(ffn_dim, cfg.ffn_block), triton.cdiv(n_rows, rows))](
        s.x_attn, s.acc_attn, layer.out_bias, layer.norm1_weight, layer.norm1_bias, layer.ffn1_weight,
        layer.ffn1_bias, layer.ffn2_weight, s.x_ffn, s.acc_ffn, n_rows, dim, ffn_dim, eps,
        BLOCK_F=cfg.ffn_block, BLOCK_D=triton.next_power_of_2(dim), ROWS=rows, num_warps=cfg.ffn_warps,
        **_launch(cfg, s.q.device),
    )  # fmt: skip


def head_stage(
    s: Scratch, last: LayerWeights, head_weight: torch.Tensor, out: torch.Tensor, eps: float, cfg: StackConfig
) -> None:
    """The head kernel (`head_stage_reference`): reads s.x_ffn and s.acc_ffn; writes out [B, V]."""
    n_rows, dim = s.q.shape
    vocab = head_weight.shape[0]
    rows = _rows(n_rows, cfg)
    _head_kernel[(triton.cdiv(vocab, cfg.head_block), triton.cdiv(n_rows, rows))](
        s.x_ffn, s.acc_ffn, last.ffn2_bias, last.norm2_weight, last.norm2_bias, head_weight, out,
        n_rows, dim, vocab, eps,
        BLOCK_N=cfg.head_block, BLOCK_D=triton.next_power_of_2(dim), ROWS=rows, num_warps=cfg.head_warps,
        **_launch(cfg, s.q.device),
    )  # fmt: skip


def run_stack(
    n_rows: int, x: torch.Tensor | TokenInput, weights: StackWeights, k_cache: torch.Tensor,
    v_cache: torch.Tensor, lengths: torch.Tensor, n_slots: int, config: StackConfig | None,
) -> torch.Tensor:  # fmt: skip
    """Every layer's three kernels and the head, layer 0 reading x (checked by the caller). -> [B, V]"""
    first, last = weights.layers[0], weights.layers[-1]
    (vocab, dim), dtype = weights.head_weight.shape, weights.head_weight.dtype
    cfg = config or config_for(dim, first.ffn1_weight.shape[0], weights.n_head, vocab)
    s = Scratch.allocate(n_rows, weights, k_cache.shape[3], cfg)
    x_in, prev = x, None
    for i, layer in enumerate(weights.layers):
        qkv_stage(s, x_in, prev, layer, k_cache[i], v_cache[i], lengths, weights.eps, cfg)
        attention_stage(s, layer.out_weight, k_cache[i], v_cache[i], lengths, n_slots, cfg)
        ffn_stage(s, layer, weights.eps, cfg)
        x_in, prev = s.x_ffn, layer
    logits = torch.empty(n_rows, vocab, device=k_cache.device, dtype=dtype)
    head_stage(s, last, weights.head_weight, logits, weights.eps, cfg)
    return logits


def decode_stack_triton(
    x: torch.Tensor, weights: StackWeights, k_cache: torch.Tensor, v_cache: torch.Tensor,
    lengths: torch.Tensor, n_slots: int, *, config: StackConfig | None = None,
) -> torch.Tensor:  # fmt: skip
    """The `triton` backend of T2S_LAYER_STACK: x [B, D] -> logits [B, V] in x's dtype (see `t2s_layer.py`).

    config: block sizes overriding `config_for` (for tuning; other blocks change the rounding)."""
    check_args(x, weights, k_cache, v_cache, lengths, n_slots)
    return run_stack(x.shape[0], x, weights, k_cache, v_cache, lengths, n_slots, config)


def embed_stack_triton(
    tokens: torch.Tensor, audio_pos: torch.Tensor, embed: EmbedWeights, weights: StackWeights,
    k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor, n_slots: int, *,
    config: StackConfig | None = None,
) -> torch.Tensor:  # fmt: skip
    """The `triton` backend of T2S_EMBED_STACK: tokens, audio_pos [B] -> logits [B, V]. Layer 0's
    QKV kernel gathers the embedding itself: no kernel runs before the stack's first."""
    check_embed_args(tokens, audio_pos, embed, weights)
    # the stack's checks, on a stand-in of x's shape and dtype (no [B, D] tensor exists here)
    check_args(embed.table[:1].expand(tokens.shape[0], -1), weights, k_cache, v_cache, lengths, n_slots)
    return run_stack(tokens.shape[0], TokenInput(tokens, audio_pos, embed), weights, k_cache, v_cache,
                     lengths, n_slots, config)  # fmt: skip
