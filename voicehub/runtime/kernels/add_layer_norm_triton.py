"""Residual add + LayerNorm in one Triton pass: one program per row, the row held in registers."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from voicehub.runtime.kernels.add_layer_norm import check_args
from voicehub.runtime.kernels.outputs import check_out


@triton.jit
def _add_layer_norm_kernel(x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, dim, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    x = tl.load(x_ptr + row * dim + cols, mask=mask, other=0.0)
    r = tl.load(r_ptr + row * dim + cols, mask=mask, other=0.0)
    # round the sum to the input dtype first: the unfused module normalises the rounded sum
    s = (x + r).to(x_ptr.dtype.element_ty).to(tl.float32)
    mean = tl.sum(s, axis=0) / dim
    centred = tl.where(mask, s - mean, 0.0)
    inv_std = tl.rsqrt(tl.sum(centred * centred, axis=0) / dim + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = centred * inv_std * w + b
    tl.store(y_ptr + row * dim + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def add_layer_norm_triton(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The `triton` backend: [..., D] -> [..., D] in x's dtype, float32 statistics.

    out: an optional contiguous tensor shaped like x, of x's dtype, to write into."""
    check_args(x, residual, weight, bias)
    dim = x.shape[-1]
    x2, r2 = x.reshape(-1, dim).contiguous(), residual.reshape(-1, dim).contiguous()
    y = torch.empty_like(x2) if out is None else check_out(out, x.shape, x.dtype).view(x2.shape)
    if x2.numel() == 0:
        return y.view(x.shape)
    block = triton.next_power_of_2(dim)
    num_warps = min(8, max(1, block // 256))
    _add_layer_norm_kernel[(x2.shape[0],)](
        x2, r2, weight.contiguous(), bias.contiguous(), y, dim, eps, BLOCK=block, num_warps=num_warps
    )
    return y.view(x.shape)
