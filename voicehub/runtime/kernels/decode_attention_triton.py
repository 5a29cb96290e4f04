"""Flash-decoding for one query per sequence over a static KV cache, in two Triton kernels.

Split pass: program (row*head, split) scores its block of slots against the query and keeps a
partial softmax (max, sum, weighted values); blocks at or past the row's length read nothing (the
loads are masked off), so padded slots never enter. Combine pass: one program per (row, head)
rescales and sums the partials. The number of splits depends only on the static shapes, so a CUDA
graph captured for one KV bucket replays for any lengths within it; one stream's attention is
spread over many SMs.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from voicehub.runtime.kernels.decode_attention import check_args
from voicehub.runtime.kernels.outputs import check_out

TARGET_PROGRAMS = 2048  # split programs per call to aim for: several waves on a 132-SM GPU
MIN_BLOCK, MAX_BLOCK = 32, 256  # slots per split program


@triton.jit
def _split_kernel(
    q_ptr, k_ptr, v_ptr, n_ptr, acc_ptr, m_ptr, l_ptr,
    n_head, n_slots, n_splits, scale,
    sqb, sqh, sqd, skb, skh, sks, skd, svb, svh, svs, svd,
    HEAD_DIM: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // n_head
    h = bh % n_head
    n = tl.minimum(tl.load(n_ptr + b).to(tl.int32), n_slots)
    slots = split * BLOCK + tl.arange(0, BLOCK)
    dims = tl.arange(0, D)
    live = slots < n
    dmask = dims < HEAD_DIM
    q = tl.load(q_ptr + b * sqb + h * sqh + dims * sqd, mask=dmask, other=0.0).to(tl.float32)
    kv_mask = live[:, None] & dmask[None, :]
    k_off = b.to(tl.int64) * skb + h * skh + slots[:, None] * sks + dims[None, :] * skd
    k = tl.load(k_ptr + k_off, mask=kv_mask, other=0.0).to(tl.float32)
    s = tl.sum(k * q[None, :], axis=1) * scale  # [BLOCK]
    s = tl.where(live, s, float("-inf"))
    m = tl.max(s, axis=0)
    p = tl.exp(s - tl.where(m == float("-inf"), 0.0, m))  # 0 for dead slots, no NaN when all dead
    v_off = b.to(tl.int64) * svb + h * svh + slots[:, None] * svs + dims[None, :] * svd
    v = tl.load(v_ptr + v_off, mask=kv_mask, other=0.0).to(tl.float32)
    part = bh * n_splits + split
    tl.store(acc_ptr + part * D + dims, tl.sum(p[:, None] * v, axis=0))
    tl.store(m_ptr + part, m)
    tl.store(l_ptr + part, tl.sum(p, axis=0))


@triton.jit
def _combine_kernel(
    acc_ptr, m_ptr, l_ptr, out_ptr, n_splits, HEAD_DIM: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr
):
    bh = tl.program_id(0)
    idx = tl.arange(0, SPLITS)
    dims = tl.arange(0, D)
    in_range = idx < n_splits
    m = tl.load(m_ptr + bh * n_splits + idx, mask=in_range, other=float("-inf"))
    l_part = tl.load(l_ptr + bh * n_splits + idx, mask=in_range, other=0.0)
    m_all = tl.max(m, axis=0)
    w = tl.exp(m - tl.where(m_all == float("-inf"), 0.0, m_all))  # splits with no live slot weigh 0
    acc_off = (bh * n_splits + idx)[:, None] * D + dims[None, :]
    acc = tl.load(acc_ptr + acc_off, mask=in_range[:, None], other=0.0)
    total = tl.sum(w * l_part, axis=0)
    out = tl.sum(w[:, None] * acc, axis=0) / tl.where(total > 0.0, total, 1.0)
    tl.store(out_ptr + bh * HEAD_DIM + dims, out.to(out_ptr.dtype.element_ty), mask=dims < HEAD_DIM)


def pick_block(n_rows_heads: int, n_slots: int) -> int:
    """Slots per split program: small blocks when few (row, head) pairs must fill the GPU."""
    want = triton.next_power_of_2(max(1, n_rows_heads * n_slots // TARGET_PROGRAMS))
    return min(MAX_BLOCK, max(MIN_BLOCK, want))


def decode_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    n_valid: torch.Tensor,
    scale: float | None = None,
    *,
    block: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The `triton` backend: q [B, H, Dh], k, v [B, H, S, Dh], n_valid [B] -> [B, H, Dh].

    block: slots per split program (a power of two >= 16), overriding the heuristic, for tuning.
    out: an optional contiguous [B, H, Dh] tensor of q's dtype to write into."""
    check_args(q, k, v, n_valid)
    batch, n_head, n_slots, head_dim = k.shape
    if out is None:
        out = torch.empty(batch, n_head, head_dim, device=q.device, dtype=q.dtype)
    else:
        check_out(out, (batch, n_head, head_dim), q.dtype)
    if block is not None and (block < 16 or block & (block - 1)):
        raise ValueError(f"decode_attention: block must be a power of two >= 16, got {block}")
    if out.numel() == 0 or n_slots == 0:
        return out.zero_()
    block = block or pick_block(batch * n_head, n_slots)
    n_splits = triton.cdiv(n_slots, block)
    d = triton.next_power_of_2(head_dim)
    acc = torch.empty(batch * n_head * n_splits, d, device=q.device, dtype=torch.float32)
    m = torch.empty(batch * n_head * n_splits, device=q.device, dtype=torch.float32)
    l_sum = torch.empty_like(m)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    _split_kernel[(batch * n_head, n_splits)](
        q, k, v, n_valid, acc, m, l_sum, n_head, n_slots, n_splits, scale,
        *q.stride(), *k.stride(), *v.stride(),
        HEAD_DIM=head_dim, D=d, BLOCK=block, num_warps=4 if block >= 128 else 2,
    )  # fmt: skip
    _combine_kernel[(batch * n_head,)](
        acc, m, l_sum, out, n_splits, HEAD_DIM=head_dim, D=d, SPLITS=triton.next_power_of_2(n_splits),
        num_warps=1 if n_splits <= 32 else 4,
    )  # fmt: skip
    return out
