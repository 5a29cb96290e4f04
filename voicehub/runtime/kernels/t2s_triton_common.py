"""What the T2S decode stacks share: the one-row stack (`t2s_layer_triton`) and the many-row one
(`t2s_layer_mma_triton` and its modules).

Programmatic dependent launch (`_await_previous` in a kernel, `_launch` for its launch options), one
row's post-norm from a branch already summed (`_post_norm_of`), one row's input embedding (`_embed`), and
the attention blocks' fixed-order merge (`_merge_blocks`) with the scratch its partials live in
(`attention_scratch`).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from voicehub.runtime.kernels.t2s_layer import StackWeights


@triton.jit
def _await_previous(PDL: tl.constexpr):
    # Programmatic dependent launch: a kernel may start while the one before it finishes, so each kernel
    # loads only its weights (which no kernel writes) before this point, and reads or writes every other
    # buffer after it. PDL 1 lets the next kernel launch at once, then waits for the previous one to
    # complete; 2 (MmaConfig.pdl_late) waits first, so at most two kernels share the GPU at a time. One
    # edge alone (MmaConfig.pdl_attn): 3 in a kernel launched in order only lets the next one launch, 4 in
    # that next kernel only waits (the kernel after it launches in order).
    if PDL == 1:
        gdc_launch_dependents()
        gdc_wait()
    elif PDL == 2:
        gdc_wait()
        gdc_launch_dependents()
    elif PDL == 3:
        gdc_launch_dependents()
    elif PDL == 4:
        gdc_wait()


@triton.jit
def _embed(tok_ptr, pos_ptr, table_ptr, pe_ptr, alpha_ptr, row, cols, mask, dim, dtype: tl.constexpr):
    # table[token] + alpha * pe[pos] of one row: [BLOCK_D] float32, rounded to the model's dtype where
    # `embed_audio_at` stores a tensor (alpha * pe, then the sum), so layer 0 sees torch's input: only in a
    # kernel launched without FP contraction (enable_fp_fusion=False), else the compiler fuses the product
    # and the sum into one fma.rn.f16 (the one-row qkv kernel's sm_90 PTX holds one)
    tok = tl.load(tok_ptr + row).to(tl.int64)
    pos = tl.load(pos_ptr + row).to(tl.int64)
    e = tl.load(table_ptr + tok * dim + cols, mask=mask, other=0.0).to(tl.float32)
    p = tl.load(pe_ptr + pos * dim + cols, mask=mask, other=0.0).to(tl.float32)
    p = (tl.load(alpha_ptr).to(tl.float32) * p).to(dtype).to(tl.float32)
    return (e + p).to(dtype).to(tl.float32)


@triton.jit
def _post_norm_of(branch, res_ptr, bias_ptr, nw_ptr, nb_ptr, row, cols, mask, dim, eps, dtype: tl.constexpr):
    # LN(residual + rnd(branch + bias)) of one row, branch [BLOCK_D] float32 (0 where ~mask)
    # `.to(dtype).to(tl.float32)`: rounded to the model's dtype where the unfused ops store a tensor
    branch = (branch + tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)).to(dtype).to(tl.float32)
    s = (tl.load(res_ptr + row * dim + cols, mask=mask, other=0.0).to(tl.float32) + branch).to(dtype)
    s = s.to(tl.float32)
    mean = tl.sum(s, axis=0) / dim
    centred = tl.where(mask, s - mean, 0.0)
    inv_std = tl.rsqrt(tl.sum(centred * centred, axis=0) / dim + eps)
    w = tl.load(nw_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(nb_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    return (centred * inv_std * w + b).to(dtype).to(tl.float32)


@triton.jit
def _merge_blocks(m_ptr, l_ptr, part_ptr, b, h, n_splits, N_HEAD: tl.constexpr, DH: tl.constexpr,
                  SPLITS: tl.constexpr):  # fmt: skip
    # Row b's attention output for head h, [DH] float32: every block's partials merged in a fixed order
    # and shape (SPLITS does not depend on the bucket; blocks past the length hold m = -inf and weigh 0)
    base = (b * N_HEAD + h) * SPLITS
    dims = tl.arange(0, DH)
    idx = tl.arange(0, SPLITS)
    have = idx < n_splits
    ms = tl.load(m_ptr + base + idx, mask=have, other=float("-inf"), volatile=True)
    ls = tl.load(l_ptr + base + idx, mask=have, other=0.0, volatile=True)
    accs = tl.load(part_ptr + (base + idx)[:, None] * DH + dims[None, :], mask=have[:, None], other=0.0,
                   volatile=True)  # fmt: skip
    weight = tl.exp(ms - tl.max(ms, axis=0))  # slot 0 is live in block 0: the max is finite
    return tl.sum(weight[:, None] * accs, axis=0) / tl.sum(weight * ls, axis=0)


def attention_scratch(
    n_rows: int, weights: StackWeights, max_slots: int, attn_block: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """What `_attend_block` and `_merge_blocks` hand each other: count [B, H] int32, m, l [B * H * splits]
    and part [B * H * splits, DH] float32, and splits (the blocks of the whole cache: the merge's shape)."""
    n_head, dim = weights.n_head, weights.head_weight.shape[1]
    dev = weights.head_weight.device
    splits = triton.next_power_of_2(triton.cdiv(max_slots, attn_block))
    n_part = n_rows * n_head * splits
    count = torch.empty(n_rows, n_head, device=dev, dtype=torch.int32)
    stats = torch.empty(2, n_part, device=dev, dtype=torch.float32)
    part = torch.empty(n_part, triton.next_power_of_2(dim // n_head), device=dev, dtype=torch.float32)
    return count, stats[0], stats[1], part, splits


@functools.cache
def _has_pdl(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def _launch(cfg: Any, device: torch.device, edge: str = "") -> dict:
    """Launch options: PDL (the kernels' constexpr and Triton's launch flag) where the config (a stack's
    StackConfig or MmaConfig: its pdl, and pdl_late if it has one) asks and the
    GPU has it (Hopper and later); never on the CPU interpreter. The constexpr: 1, or 2 where the config
    asks for the next kernel's launch only after the wait (`_await_previous`). With MmaConfig.pdl_attn
    (pdl off) only the qkv -> attention edge: edge "before" (the qkv kernel) 3, "after" (the attention,
    launched with the flag) 4, any other kernel 0."""
    if not _has_pdl(device):
        return {"PDL": 0}
    if cfg.pdl:
        return {"PDL": 2 if getattr(cfg, "pdl_late", False) else 1, "launch_pdl": True}
    if getattr(cfg, "pdl_attn", False) and edge:
        return {"PDL": 3} if edge == "before" else {"PDL": 4, "launch_pdl": True}
    return {"PDL": 0}
