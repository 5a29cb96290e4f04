"""VITS relative-position attention through a fused SDPA kernel (the `attention=sdpa` transform).

The same function as `relative_attention_native`, computed another way:
- relative keys: their logits q . r_k(j - i) are nonzero only within the window, so they are made
  as a band [T, 2W+1] and scattered into the kernel's additive score bias [T, T];
- the kernel (memory-efficient attention on CUDA, flash attention on the CPU) gives p @ v and
  each row's log-sum-exp of the scores;
- relative values: sum_j p_ij r_v(j - i) needs only the weights within the window, and those are
  exp(s_ij - lse_i) for the 2W+1 scores of the band, recomputed here.
So the T x T weights are never materialised. Masked scores: the native path replaces them with
-1e4, here -1e4 is added to them; both give weight 0 in any row that has a valid key (rows
with none are padding, masked again by the encoder).

Compatibility fact: torch.nn.functional.scaled_dot_product_attention does not return the
log-sum-exp, so the kernels are called through their aten ops
(`_scaled_dot_product_efficient_attention`, `_scaled_dot_product_flash_attention_for_cpu`), which
are internal to torch: `sdpa_unavailable` probes them on the model's device and dtype before the
transform is applied.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from voicehub.models.vits.text_encoder import MASKED_SCORE, rel_to_abs, relative_attention_native

BIAS_ALIGN = 16  # elements: the memory-efficient kernel wants the bias rows 16-aligned


def _band(x: torch.Tensor, w: int) -> torch.Tensor:
    """x: [B, H, T, D] -> [B, H, T, D, 2w+1]: row i holds x[i-w .. i+w] (zeros past the ends)."""
    return F.pad(x, (0, 0, w, w)).unfold(2, 2 * w + 1, 1)


def _kernel(q, k, v, bias) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T + bias) v [B, H, T, D] and the scores' log-sum-exp [B, H, T] (float32)."""
    t = q.shape[2]
    if q.device.type == "cuda":
        pad = -t % BIAS_ALIGN
        bias = F.pad(bias, (0, pad))[..., :t] if pad else bias  # aligned rows, same values
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, scale=1.0)[:2]
        return out, lse[..., :t]  # the kernel pads the log-sum-exp to a multiple of 32 rows
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=bias, scale=1.0)[
        :2
    ]
    return out, lse


def relative_attention_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    emb_rel_k: torch.Tensor,
    emb_rel_v: torch.Tensor,
    attn_mask: torch.Tensor,
) -> torch.Tensor:
    """Same inputs and result as `relative_attention_native` (see text_encoder.RelativeAttentionFn)."""
    # q (scaled), k, v: [B, H, T, D]; emb_rel_*: [n_rel, 2W+1, D]; attn_mask: [B, 1, T, T]
    t = q.shape[2]
    window = (emb_rel_k.shape[1] - 1) // 2
    w = min(window, t - 1)  # offsets beyond the sequence never occur
    rel_k = emb_rel_k[:, window - w : window + w + 1].unsqueeze(0)  # [1, n_rel, 2w+1, D]
    rel_v = emb_rel_v[:, window - w : window + w + 1].unsqueeze(0)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # the kernels want unit-stride heads
    rel_band = q @ rel_k.transpose(-2, -1)  # [B, H, T, 2w+1]: logit of key i+o at band column o+w
    bias = rel_to_abs(F.pad(rel_band, (t - 1 - w, t - 1 - w)))  # [B, H, T, T]
    bias = bias.masked_fill(attn_mask == 0, MASKED_SCORE)
    out, lse = _kernel(q, k, v, bias)
    # Band scores again: q_i . k_(i+o) + relative logit; keys past the ends or masked get -inf.
    scores = (q.unsqueeze(-2) @ _band(k, w)).squeeze(-2) + rel_band  # [B, H, T, 2w+1]
    positions = torch.arange(t, device=q.device)
    cols = positions[:, None] + torch.arange(2 * w + 1, device=q.device)[None, :]  # padded key index
    valid = F.pad(attn_mask, (w, w)).gather(-1, cols.expand(*attn_mask.shape[:2], t, 2 * w + 1))
    scores = scores.float().masked_fill(valid == 0, float("-inf"))
    p_band = torch.exp(scores - lse.float().unsqueeze(-1)).to(q.dtype)  # [B, H, T, 2w+1]
    return out + p_band @ rel_v


def sdpa_unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the fused path cannot run on (device, dtype), or None: a small probe against the native one."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 9, 8, generator=g).to(device, dtype) for _ in range(3))
    rel_k, rel_v = (torch.randn(1, 5, 8, generator=g).to(device, dtype) for _ in range(2))
    mask = torch.ones(1, 1, 9, 9, device=device, dtype=dtype)
    try:
        with torch.inference_mode():
            fused = relative_attention_sdpa(q, k, v, rel_k, rel_v, mask).float()
            native = relative_attention_native(q, k, v, rel_k, rel_v, mask).float()
    except (RuntimeError, NotImplementedError, AttributeError) as exc:  # kernel missing for this device/dtype
        return f"the fused SDPA kernel cannot run on {device.type} in {dtype}: {type(exc).__name__}: {exc}"
    err = float((fused - native).norm() / native.norm())
    if (
        not err <= 0.1
    ):  # bf16 rounding alone is ~1e-2; a kernel computing something else (e.g. other lse units) is O(1)
        return (
            f"the fused SDPA kernel disagrees with the native attention on {device.type} (rel. L2 {err:.1e})"
        )
    return None
