"""The DiT block's elementwise ops (dit_block.py defines them) as one Triton kernel each.

Inside a CUDA graph a DiT step is bound by its count of small kernels, not by bytes or FLOPs: each
op here replaces 2-12 torch kernels by one. Norm kernels take one row per program with the row in
registers (D <= 8192) and float32 statistics; sums the unfused code rounds to the tensor dtype
(gate * y, x + gate * y) are rounded the same way here, so the residual stream is the torch one's
bit for bit and only the normalised output differs by float rounding.

Under torch.compile each op is one opaque custom op (`voicehub::dit_*`, new output tensors): torch 2.11's
dynamo, tracing the kernel launches themselves, broke the graph at each and then failed on a symbolic
launch width (and, before, on the rotary kernel's in-place writes to two views of one buffer);
benchmarks/results/inductor_compile_h100_s20.json and inductor_compile_h100_s21.json.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from voicehub.runtime.kernels.dit_block import _check_mod, check_residual_args, check_rope_args
from voicehub.runtime.kernels.outputs import check_out

MAX_DIM = 8192  # a row lives in one program's registers
ROPE_ROWS = 16  # frames per program of the rotary kernel
# Frame counts vary per request (the per-sentence path's CFM runs at any length): unspecialised, so a
# length of another divisibility does not build new kernels in a request (~0.8 s a length on the H200).
_ANY_LENGTH = dict(do_not_specialize=["n_frames"])


@triton.jit(**_ANY_LENGTH)
def _modulated_norm_kernel(
    x_ptr, y_ptr, gate_ptr, mask_ptr, shift_ptr, scale_ptr, res_ptr, out_ptr,
    n_frames, dim, gate_stride, shift_stride, scale_stride, eps,
    HAS_RESIDUAL: tl.constexpr, HAS_MASK: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    b = row // n_frames
    cols = tl.arange(0, BLOCK)
    m = cols < dim
    x = tl.load(x_ptr + row * dim + cols, mask=m, other=0.0)
    if HAS_RESIDUAL:
        y = tl.load(y_ptr + row * dim + cols, mask=m, other=0.0).to(tl.float32)
        if HAS_MASK:
            y = tl.where(tl.load(mask_ptr + row) != 0, y, 0.0)  # a padded frame's attention output is 0
        g = tl.load(gate_ptr + b * gate_stride + cols, mask=m, other=0.0).to(tl.float32)
        gy = (g * y).to(x_ptr.dtype.element_ty)  # rounded as torch's `gate * y` is
        x = (x.to(tl.float32) + gy.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(res_ptr + row * dim + cols, x, mask=m)
    xf = x.to(tl.float32)
    mean = tl.sum(xf, axis=0) / dim
    centred = tl.where(m, xf - mean, 0.0)
    inv_std = tl.rsqrt(tl.sum(centred * centred, axis=0) / dim + eps)
    shift = tl.load(shift_ptr + b * shift_stride + cols, mask=m, other=0.0).to(tl.float32)
    scale = tl.load(scale_ptr + b * scale_stride + cols, mask=m, other=0.0).to(tl.float32)
    y_out = centred * inv_std * (1.0 + scale) + shift
    tl.store(out_ptr + row * dim + cols, y_out.to(out_ptr.dtype.element_ty), mask=m)


@triton.jit(**_ANY_LENGTH)
def _gated_residual_kernel(x_ptr, y_ptr, gate_ptr, out_ptr, n_frames, dim, gate_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    b = row // n_frames
    cols = tl.arange(0, BLOCK)
    m = cols < dim
    x = tl.load(x_ptr + row * dim + cols, mask=m, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + row * dim + cols, mask=m, other=0.0).to(tl.float32)
    g = tl.load(gate_ptr + b * gate_stride + cols, mask=m, other=0.0).to(tl.float32)
    gy = (g * y).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * dim + cols, (x + gy.to(tl.float32)).to(out_ptr.dtype.element_ty), mask=m)


@triton.jit(do_not_specialize=["n_rows", "n_frames"])
def _rope_kernel(
    q_ptr, k_ptr, qo_ptr, ko_ptr, cos_ptr, sin_ptr, n_rows, n_frames, rot,
    q_batch_stride, q_frame_stride, k_batch_stride, k_frame_stride,
    qo_batch_stride, qo_frame_stride, ko_batch_stride, ko_frame_stride,
    ROWS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    # rotated q, k to qo, ko (q, k themselves in place, or new tensors under torch.compile)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    m = (rows < n_rows)[:, None] & (cols < rot)[None, :]
    b, f = (rows // n_frames).to(tl.int64), (rows % n_frames).to(tl.int64)
    trig = f[:, None] * rot + cols[None, :]
    cos = tl.load(cos_ptr + trig, mask=m, other=0.0)
    sin = tl.load(sin_ptr + trig, mask=m, other=0.0)
    partner = cols ^ 1  # the other channel of an interleaved pair
    sign = tl.where(cols % 2 == 0, -1.0, 1.0)[None, :]  # rotated = (-x[2i+1], x[2i])
    q_row = q_ptr + (b * q_batch_stride + f * q_frame_stride)[:, None]
    q = tl.load(q_row + cols[None, :], mask=m, other=0.0).to(tl.float32)
    qp = tl.load(q_row + partner[None, :], mask=m, other=0.0).to(tl.float32)
    k_row = k_ptr + (b * k_batch_stride + f * k_frame_stride)[:, None]
    k = tl.load(k_row + cols[None, :], mask=m, other=0.0).to(tl.float32)
    kp = tl.load(k_row + partner[None, :], mask=m, other=0.0).to(tl.float32)
    qo_row = qo_ptr + (b * qo_batch_stride + f * qo_frame_stride)[:, None]
    ko_row = ko_ptr + (b * ko_batch_stride + f * ko_frame_stride)[:, None]
    tl.store(qo_row + cols[None, :], (q * cos + sign * qp * sin).to(q_ptr.dtype.element_ty), mask=m)
    tl.store(ko_row + cols[None, :], (k * cos + sign * kp * sin).to(k_ptr.dtype.element_ty), mask=m)


def _launch_config(dim: int) -> tuple[int, int]:
    if dim > MAX_DIM:
        raise ValueError(f"DiT Triton norms hold a row of <= {MAX_DIM} channels in registers, got {dim}")
    block = triton.next_power_of_2(dim)
    return block, min(8, max(1, block // 256))


def _mod_stride(t: torch.Tensor) -> int:
    # [B, 1, D] views of the adaLN linear's output: rows strided, channels contiguous
    if t.stride(-1) != 1:
        raise ValueError(
            f"DiT Triton kernels need modulation tensors contiguous in D, got strides {t.stride()}"
        )
    return t.stride(0)


def _no_out_under_compile(op: str, out: object) -> None:
    if out is not None:  # the custom op returns new tensors; a compiled caller takes its result
        raise ValueError(f"{op}: out= is not supported under torch.compile; use the returned tensor")


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous()  # a no-op for the DiT's activations


def modulated_norm_triton(
    x: torch.Tensor,
    shift: torch.Tensor,
    scale: torch.Tensor,
    eps: float,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The `triton` backend of DIT_MODULATED_NORM: [B, N, D] -> [B, N, D] in x's dtype."""
    if torch.compiler.is_compiling():
        _no_out_under_compile("dit_modulated_norm", out)
        return _modulated_norm_op(x, shift, scale, eps)
    _check_mod("dit_modulated_norm", x, shift, scale)
    x = _rows(x)
    y = torch.empty_like(x) if out is None else check_out(out, x.shape, x.dtype)
    if x.numel():
        block, warps = _launch_config(x.shape[-1])
        _modulated_norm_kernel[(x.shape[0] * x.shape[1],)](
            x, x, shift, x, shift, scale, x, y, x.shape[1], x.shape[-1], 0, _mod_stride(shift),
            _mod_stride(scale), eps, HAS_RESIDUAL=False, HAS_MASK=False, BLOCK=block, num_warps=warps,
        )  # fmt: skip
    return y


def residual_norm_triton(
    x: torch.Tensor,
    y: torch.Tensor,
    gate: torch.Tensor,
    mask: torch.Tensor | None,
    shift: torch.Tensor,
    scale: torch.Tensor,
    eps: float,
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The `triton` backend of DIT_RESIDUAL_NORM: -> (x + gate * y, its modulated norm), x's dtype.

    out: optional (residual, norm) contiguous tensors shaped like x to write into."""
    if torch.compiler.is_compiling():
        _no_out_under_compile("dit_residual_norm", out)
        return _residual_norm_op(x, y, gate, mask, shift, scale, eps)
    check_residual_args("dit_residual_norm", x, y, gate, shift, scale, mask=mask)
    x, y = _rows(x), _rows(y)
    if out is None:
        res, norm = torch.empty_like(x), torch.empty_like(x)
    else:
        res, norm = (check_out(o, x.shape, x.dtype) for o in out)
    valid = x if mask is None else mask.contiguous().view(torch.uint8)
    if x.numel():
        block, warps = _launch_config(x.shape[-1])
        _modulated_norm_kernel[(x.shape[0] * x.shape[1],)](
            x, y, gate, valid, shift, scale, res, norm, x.shape[1], x.shape[-1], _mod_stride(gate),
            _mod_stride(shift), _mod_stride(scale), eps,
            HAS_RESIDUAL=True, HAS_MASK=mask is not None, BLOCK=block, num_warps=warps,
        )  # fmt: skip
    return res, norm


def gated_residual_triton(
    x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The `triton` backend of DIT_GATED_RESIDUAL: x + gate * y, [B, N, D] in x's dtype."""
    if torch.compiler.is_compiling():
        _no_out_under_compile("dit_gated_residual", out)
        return _gated_residual_op(x, y, gate)
    check_residual_args("dit_gated_residual", x, y, gate)
    x, y = _rows(x), _rows(y)
    res = torch.empty_like(x) if out is None else check_out(out, x.shape, x.dtype)
    if x.numel():
        block, warps = _launch_config(x.shape[-1])
        _gated_residual_kernel[(x.shape[0] * x.shape[1],)](
            x, y, gate, res, x.shape[1], x.shape[-1], _mod_stride(gate), BLOCK=block, num_warps=warps
        )
    return res


def rope_triton(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The `triton` backend of DIT_ROPE: rotates q's and k's first R channels in place; returns q, k
    (under torch.compile: new tensors, q and k untouched).

    q, k: [B, N, C], channels contiguous (strided frames are fine: views of a packed QKV output);
    cos, sin: [N, R] float32."""
    check_rope_args(q, k, cos, sin)
    if q.stride(-1) != 1 or k.stride(-1) != 1:
        raise ValueError(
            f"dit_rope: q and k need contiguous channels, got strides {q.stride()}, {k.stride()}"
        )
    if torch.compiler.is_compiling():
        return _rope_op(q, k, cos, sin)
    _rope_launch(q, k, q, k, cos, sin)
    return q, k


def _rope_launch(
    q: torch.Tensor, k: torch.Tensor, qo: torch.Tensor, ko: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> None:
    # q, k rotated into qo, ko (the same tensors: in place); channels past R are not written
    b, n, _ = q.shape
    rot = cos.shape[-1]
    if q.numel():
        cos, sin = cos.float().contiguous(), sin.float().contiguous()
        _rope_kernel[(triton.cdiv(b * n, ROPE_ROWS),)](
            q, k, qo, ko, cos, sin, b * n, n, rot, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            qo.stride(0), qo.stride(1), ko.stride(0), ko.stride(1),
            ROWS=ROPE_ROWS, BLOCK=triton.next_power_of_2(rot), num_warps=2,
        )  # fmt: skip


# The ops as torch.compile sees them: opaque, outputs new contiguous tensors shaped like x (or q, k).
@torch.library.custom_op("voicehub::dit_modulated_norm", mutates_args=())
def _modulated_norm_op(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    return modulated_norm_triton(x, shift, scale, eps)


@torch.library.custom_op("voicehub::dit_residual_norm", mutates_args=())
def _residual_norm_op(
    x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, mask: torch.Tensor | None, shift: torch.Tensor,
    scale: torch.Tensor, eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    return residual_norm_triton(x, y, gate, mask, shift, scale, eps)


@torch.library.custom_op("voicehub::dit_gated_residual", mutates_args=())
def _gated_residual_op(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return gated_residual_triton(x, y, gate)


@torch.library.custom_op("voicehub::dit_rope", mutates_args=())
def _rope_op(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    qo, ko = q.clone(memory_format=torch.contiguous_format), k.clone(memory_format=torch.contiguous_format)
    _rope_launch(q, k, qo, ko, cos, sin)
    return qo, ko


def _like(t: torch.Tensor) -> torch.Tensor:
    return t.new_empty(t.shape)


_modulated_norm_op.register_fake(lambda x, shift, scale, eps: _like(x))
_residual_norm_op.register_fake(lambda x, y, gate, mask, shift, scale, eps: (_like(x), _like(x)))
_gated_residual_op.register_fake(lambda x, y, gate: _like(x))
_rope_op.register_fake(lambda q, k, cos, sin: (_like(q), _like(k)))
