"""The elementwise ops of a DiT block (F5-TTS / GPT-SoVITS v3 CFM) that a fused kernel can replace.

Each function here is an op's definition in PyTorch and the code the DiT runs natively: the op's
reference is, kernel for kernel, what the model did before the op had a name. Signatures (every
backend), with x, y: [B, N, D] and shift, scale, gate: [B, 1, D] (adaLN chunks, any batch stride):
- DIT_MODULATED_NORM `f(x, shift, scale, eps) -> LayerNorm(x) * (1 + scale) + shift` (no affine);
- DIT_RESIDUAL_NORM `f(x, y, gate, mask, shift, scale, eps) -> (r, norm)`: the attention output y,
  zero on padded frames (mask [B, N] False; None: every frame valid), gated into the residual
  r = x + gate * y, and r's modulated LayerNorm;
- DIT_GATED_RESIDUAL `f(x, y, gate) -> x + gate * y`;
- DIT_ROPE `f(q, k, cos, sin) -> (q', k')`: the first cos.shape[-1] channels of q and k [B, N, C]
  rotated in interleaved pairs (x_transformers' layout on [B, N, heads*dim_head], i.e. only the
  first head), in float32, the rest unchanged. An implementation may write into q and k and
  return them: callers pass tensors they own;
- DIT_ATTENTION_BIAS `f(mask, dtype) -> bias [B, 1, 1, N]`: 0 on valid keys, -inf on padded ones,
  the additive mask SDPA makes of a boolean one; computed once per forward instead of per block;
- DIT_DEPTHWISE_CONV `f(x, weight, bias, padding) -> y`: the text embedding's depthwise convolution,
  x [B, D, N] (any strides), weight [D, 1, K], bias [D] or None, zero padding of `padding` frames each
  side, stride 1; y [B, D, N + 2 * padding - K + 1].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _check_mod(name: str, x: torch.Tensor, *mods: torch.Tensor) -> None:
    want = (x.shape[0], 1, x.shape[-1])
    for m in mods:
        if tuple(m.shape) != want:
            raise ValueError(
                f"{name}: modulation {tuple(m.shape)} must be [B, 1, D] = {list(want)} for x {tuple(x.shape)}"
            )


def check_residual_args(
    name: str, x: torch.Tensor, y: torch.Tensor, *mods: torch.Tensor, mask: torch.Tensor | None = None
) -> None:
    """The residual ops' argument checks, one place for both backends: x and y one [B, N, D] shape,
    each modulation [B, 1, D], the optional mask [B, N] bool."""
    if x.shape != y.shape:
        raise ValueError(f"{name}: x {tuple(x.shape)} and y {tuple(y.shape)} differ")
    _check_mod(name, x, *mods)
    if mask is not None and (mask.dtype != torch.bool or tuple(mask.shape) != tuple(x.shape[:2])):
        raise ValueError(f"{name}: mask must be [B, N] bool, got {mask.dtype} {tuple(mask.shape)}")


def modulated_norm_reference(
    x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float
) -> torch.Tensor:
    """[B, N, D] -> [B, N, D]: F.layer_norm(x) * (1 + scale) + shift (the adaLN-Zero modulation)."""
    _check_mod("dit_modulated_norm", x, shift, scale)
    return F.layer_norm(x, (x.shape[-1],), eps=eps) * (1 + scale) + shift


def residual_norm_reference(
    x: torch.Tensor,
    y: torch.Tensor,
    gate: torch.Tensor,
    mask: torch.Tensor | None,
    shift: torch.Tensor,
    scale: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, y [B, N, D] -> (x + gate * y (y zeroed where mask [B, N] is False), its modulated norm)."""
    check_residual_args("dit_residual_norm", x, y, gate, shift, scale, mask=mask)
    y = y if mask is None else y.masked_fill(~mask[..., None], 0.0)
    r = x + gate * y
    return r, modulated_norm_reference(r, shift, scale, eps)


def gated_residual_reference(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x, y [B, N, D], gate [B, 1, D] -> x + gate * y."""
    check_residual_args("dit_gated_residual", x, y, gate)
    return x + gate * y


def rope_first_head(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first cos.shape[-1] channels of x [B, N, C] in interleaved pairs; rest unchanged."""
    rot = cos.shape[-1]
    head, rest = x[..., :rot].float(), x[..., rot:]
    pairs = head.unflatten(-1, (-1, 2))
    rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    return torch.cat(((head * cos + rotated * sin).to(x.dtype), rest), dim=-1)


def check_rope_args(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    n, rot = q.shape[1], cos.shape[-1]
    if q.shape != k.shape or q.dim() != 3:
        raise ValueError(f"dit_rope: q {tuple(q.shape)} and k {tuple(k.shape)} must be one [B, N, C] shape")
    if cos.shape != sin.shape or tuple(cos.shape) != (n, rot) or rot % 2 or rot > q.shape[-1]:
        raise ValueError(
            f"dit_rope: cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must be [N, R] with N = {n} "
            f"and R even, at most C = {q.shape[-1]}"
        )


def rope_reference(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [B, N, C], cos, sin [N, R] float32 -> q, k with their first R channels rotated (new tensors)."""
    check_rope_args(q, k, cos, sin)
    return rope_first_head(q, cos, sin), rope_first_head(k, cos, sin)


def attention_bias_reference(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """mask [B, N] bool (True: valid key) -> [B, 1, 1, N] of dtype: 0 where valid, -inf elsewhere.

    SDPA turns a boolean mask into this additive one itself, per call and at the mask's (expanded)
    size; made once, it serves every block of a forward and is broadcast over heads and queries."""
    if mask.dtype != torch.bool or mask.dim() != 2:
        raise ValueError(
            f"dit_attention_bias: mask must be [B, N] bool, got {mask.dtype} {tuple(mask.shape)}"
        )
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(mask, zero, float("-inf"))[:, None, None, :]


def depthwise_conv_reference(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, padding: int
) -> torch.Tensor:
    """DIT_DEPTHWISE_CONV: what the block's nn.Conv1d(D, D, K, padding=padding, groups=D) computes."""
    return F.conv1d(x, weight, bias, padding=padding, groups=x.shape[-2])
