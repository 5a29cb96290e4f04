"""The residual add + LayerNorm op of a post-norm transformer: y = LayerNorm(x + residual).

Op signature (every backend): `f(x, residual, weight, bias, eps) -> y`, with x, residual, y:
[..., D] and weight, bias: [D]. The sum is rounded to x's dtype before normalising, as the
unfused `norm(x + residual)` does, so a fused kernel sees the same input as the eager module.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def check_args(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> None:
    if x.shape != residual.shape:
        raise ValueError(f"add_layer_norm: x {tuple(x.shape)} and residual {tuple(residual.shape)} differ")
    if weight.shape != x.shape[-1:] or bias.shape != x.shape[-1:]:
        raise ValueError(
            f"add_layer_norm: weight {tuple(weight.shape)} and bias {tuple(bias.shape)} must be "
            f"[{x.shape[-1]}], the last dimension of x"
        )


def add_layer_norm_reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    """Reference and `torch` backend: [..., D] -> [..., D] = F.layer_norm(x + residual)."""
    check_args(x, residual, weight, bias)
    return F.layer_norm(x + residual, x.shape[-1:], weight, bias, eps)
