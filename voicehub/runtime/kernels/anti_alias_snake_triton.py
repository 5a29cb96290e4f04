"""The anti-aliased Snake op in one Triton pass (see anti_alias_snake.py for the op and its math).

Each program owns one (batch, channel) row and a tile of BLOCK - 2 * TILE_HALO output samples. It
loads the tile's input with a halo, computes both polyphase phases of the upsampled signal in
registers (6 taps each), applies the activation (2 sines per input sample: the minimum), then
gathers the 12 down-filter taps from those registers and writes the downsampled tile. Nothing at
the 2x rate touches memory. Arithmetic is float32 whatever the input dtype. Masked rows (`valid`)
read their length from device memory and clamp every border at it instead of at T (a graph replays
them with new lengths), writing zeros past it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from voicehub.runtime.kernels.anti_alias_snake import SNAKE_EPS, check_args, check_valid
from voicehub.runtime.kernels.outputs import check_out

TILE_HALO = 4  # phase samples kept either side of a tile: the down filter reaches 3 left, 3 right
MAX_BLOCK = 1024  # phase samples per program


@triton.jit
def _up_phase(x_ptr, j, length, f_ptr, FIRST: tl.constexpr, SHIFT: tl.constexpr):
    # sum_q f[FIRST + 2q] x[clamp(j + SHIFT - q)], q = 0..5: one phase of the 2x upsample
    acc = tl.zeros(j.shape, tl.float32)
    for q in tl.static_range(6):
        idx = tl.minimum(tl.maximum(j + (SHIFT - q), 0), length - 1)
        acc += tl.load(f_ptr + FIRST + 2 * q).to(tl.float32) * tl.load(x_ptr + idx).to(tl.float32)
    return 2.0 * acc


@triton.jit
def _anti_alias_snake_kernel(
    x_ptr,
    y_ptr,
    up_ptr,
    down_ptr,
    alpha_ptr,
    beta_ptr,
    n_channels,
    length,
    n_tiles,
    valid_ptr,
    HAS_VALID: tl.constexpr,
    LOGSCALE: tl.constexpr,
    EPS: tl.constexpr,
    HALO: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    row = pid // n_tiles
    tile = pid % n_tiles
    n_out: tl.constexpr = BLOCK - 2 * HALO
    t0 = tile * n_out
    x_row = x_ptr + row.to(tl.int64) * length
    y_row = y_ptr + row.to(tl.int64) * length
    channel = row % n_channels
    n = length  # the row's valid samples: borders are replicated from sample n - 1
    if HAS_VALID:
        n = tl.minimum(tl.maximum(tl.load(valid_ptr + row // n_channels).to(tl.int32), 0), length)
    a = tl.load(alpha_ptr + channel).to(tl.float32)
    b = tl.load(beta_ptr + channel).to(tl.float32)
    if LOGSCALE:
        a = tl.exp(a)
        b = tl.exp(b)
    inv_b = 1.0 / (b + EPS)

    lane = tl.arange(0, BLOCK)
    j = t0 - HALO + lane  # input-rate position of each phase pair
    n_read = tl.maximum(n, 1)  # an empty row reads its sample 0 (and writes zeros)
    jc = tl.minimum(tl.maximum(j, 0), n_read - 1)
    even = _up_phase(x_row, jc, n_read, up_ptr, 1, 2)  # upsampled sample 2j
    odd = _up_phase(x_row, jc, n_read, up_ptr, 0, 3)  # upsampled sample 2j + 1
    s_even = even + inv_b * tl.sin(a * even) * tl.sin(a * even)
    s_odd = odd + inv_b * tl.sin(a * odd) * tl.sin(a * odd)
    # Replicate padding of the activated 2x signal: before the start both phases equal sample 0
    # (the even phase at j = 0), past the end both equal sample 2n-1 (the odd phase at n-1).
    s_even, s_odd = tl.where(j >= n_read, s_odd, s_even), tl.where(j < 0, s_even, s_odd)

    # y[t] = sum_p g[2p+1] s_even[t+p-2] + g[2p] s_odd[t+p-3]; output lane o is t = t0 + o
    acc = tl.zeros((BLOCK,), tl.float32)
    for p in tl.static_range(6):
        i_even = tl.minimum(lane + (HALO - 2 + p), BLOCK - 1)
        i_odd = tl.minimum(lane + (HALO - 3 + p), BLOCK - 1)
        acc += tl.load(down_ptr + 2 * p + 1).to(tl.float32) * tl.gather(s_even, i_even, 0)
        acc += tl.load(down_ptr + 2 * p).to(tl.float32) * tl.gather(s_odd, i_odd, 0)
    t = t0 + lane
    acc = tl.where(t < n, acc, 0.0)
    tl.store(y_row + t, acc.to(y_ptr.dtype.element_ty), mask=(lane < n_out) & (t < length))


def _block_for(length: int) -> int:
    return min(MAX_BLOCK, max(16, triton.next_power_of_2(length + 2 * TILE_HALO)))


def anti_alias_snake_triton(
    x: torch.Tensor,
    up_filter: torch.Tensor,
    down_filter: torch.Tensor,
    alpha: torch.Tensor,
    beta: torch.Tensor,
    logscale: bool,
    valid: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The `triton` backend: x [B, C, T] -> [B, C, T] in x's dtype (float32 arithmetic inside).

    valid: per-row lengths [B] (anti_alias_snake.py), read on the device.
    out: an optional contiguous [B, C, T] tensor of x's dtype to write into (a static buffer)."""
    check_args(x, up_filter, down_filter, alpha)
    check_valid(valid, x)
    batch, channels, length = x.shape
    x = x.contiguous()
    y = torch.empty_like(x) if out is None else check_out(out, x.shape, x.dtype)
    if x.numel() == 0:
        return y
    block = _block_for(length)
    n_tiles = triton.cdiv(length, block - 2 * TILE_HALO)
    grid = (batch * channels * n_tiles,)
    _anti_alias_snake_kernel[grid](
        x, y, up_filter.contiguous(), down_filter.contiguous(), alpha.contiguous(), beta.contiguous(),
        channels, length, n_tiles, x if valid is None else valid.contiguous(), HAS_VALID=valid is not None,
        LOGSCALE=bool(logscale), EPS=SNAKE_EPS, HALO=TILE_HALO, BLOCK=block,
        num_warps=4 if block >= 512 else 2,
    )  # fmt: skip
    return y
