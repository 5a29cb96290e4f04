"""Single-query attention over a static KV cache, reading each sequence's true length.

Op signature (every backend): `f(q, k, v, n_valid, scale) -> out`, with q: [B, H, Dh]; k, v:
[B, H, S, Dh] (any strides with a unit last stride, e.g. one layer of a preallocated cache, S being
the current bucket); n_valid: [B] integer, the slots each row attends to (slots [0, n_valid));
scale: float or None (1/sqrt(Dh)). Returns out: [B, H, Dh], contiguous, in q's dtype, so that
`out.view(B, 1, H * Dh)` is the heads-concatenated attention output. n_valid is clamped to S; a
row with n_valid = 0 attends to nothing and gets zeros.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def check_args(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_valid: torch.Tensor) -> None:
    if q.dim() != 3 or k.dim() != 4 or k.shape != v.shape:
        raise ValueError(
            f"decode_attention takes q [B, H, Dh] and k, v [B, H, S, Dh]; got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if k.shape[:2] != q.shape[:2] or k.shape[3] != q.shape[2]:
        raise ValueError(f"decode_attention: q {tuple(q.shape)} does not match k, v {tuple(k.shape)}")
    if n_valid.shape != (q.shape[0],) or n_valid.is_floating_point():
        raise ValueError(f"decode_attention: n_valid must be an integer tensor [B={q.shape[0]}]")


def decode_attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_valid: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """Reference and `torch` backend: masked SDPA over all S slots. [B, H, Dh] -> [B, H, Dh]."""
    check_args(q, k, v, n_valid)
    slots = torch.arange(k.shape[2], device=k.device)
    attend = slots.unsqueeze(0) < n_valid.unsqueeze(1)  # [B, S]
    out = F.scaled_dot_product_attention(
        q.unsqueeze(2), k, v, attn_mask=attend[:, None, None, :], scale=scale
    )
    # a row that attends to nothing gets zeros (SDPA's value for it varies by backend)
    return torch.where((n_valid > 0)[:, None, None], out[:, :, 0], 0.0).contiguous()
