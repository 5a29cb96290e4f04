"""The anti-aliased Snake activation op: 2x upsample, Snake/SnakeBeta, low-pass + 2x downsample.

Op signature (every backend): `f(x, up_filter, down_filter, alpha, beta, logscale, valid=None) -> y`,
with x, y: [B, C, T]; up_filter, down_filter: [1, 1, 12] even-length FIR filters; alpha, beta: [C]
(log-scale when `logscale`); plain Snake passes beta = alpha. Borders are replicate-padded at both
rates, as in alias-free-torch (the upsampler pads the input, the downsampler the activated signal).
valid: None, or an integer tensor [B] on x's device: row b is the op of its first valid[b] samples alone
(the right border replicated at that length, as if the row ended there), and zeros past them. A masked
BigVGAN (bigvgan/model.py) runs right-padded windows with it; nothing is read back to the host, so a
CUDA graph can hold it with the lengths in a static buffer. Lengths are clamped to [0, T].

`anti_alias_snake_reference` states the op directly (transposed conv at 2x, crop, activation, strided
conv). `anti_alias_snake_polyphase` is the `torch` backend: the same function with both filters split
into their 6-tap even/odd phases, so no convolution runs at the 2x rate and no zero is multiplied.
It is exact but not faster: grouped convs with two channels per group take slow cuDNN and CPU paths
(H200 fp16, one vocoder forward's activations at 598 mel frames: 39 ms vs the reference's 31 ms;
the Triton kernel: 6 ms). Prefer `triton` on CUDA; the reference is the fastest torch form measured.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

RATIO = 2  # up/down-sampling ratio around the activation
TAPS = 12  # taps of both filters; the polyphase split and the Triton kernel assume it
SNAKE_EPS = 1e-9  # keeps 1/beta finite, as upstream
HALF = TAPS // RATIO  # taps per phase
HALO = 3  # input samples either side that one output's phases depend on (see `_up_weights`)


def check_args(
    x: torch.Tensor, up_filter: torch.Tensor, down_filter: torch.Tensor, alpha: torch.Tensor
) -> None:
    if x.dim() != 3:
        raise ValueError(f"anti_alias_snake takes x of shape [B, C, T], got {tuple(x.shape)}")
    for name, f in (("up_filter", up_filter), ("down_filter", down_filter)):
        if f.numel() != TAPS:
            raise ValueError(f"anti_alias_snake: {name} must have {TAPS} taps, got shape {tuple(f.shape)}")
    if alpha.numel() != x.shape[1]:
        raise ValueError(f"anti_alias_snake: alpha has {alpha.numel()} values for {x.shape[1]} channels")


def snake_factors(
    alpha: torch.Tensor, beta: torch.Tensor, logscale: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(frequency a, amplitude 1 / (b + eps)) per channel, each [C], in the parameters' dtype."""
    a, b = (alpha.exp(), beta.exp()) if logscale else (alpha, beta)
    return a, 1.0 / (b + SNAKE_EPS)


def check_valid(valid: torch.Tensor | None, x: torch.Tensor) -> None:
    if valid is None:
        return
    if valid.shape != (x.shape[0],) or valid.dtype.is_floating_point or valid.device != x.device:
        raise ValueError(
            f"anti_alias_snake: valid must be an integer tensor [{x.shape[0]}] on {x.device}, got "
            f"{valid.dtype} {tuple(valid.shape)} on {valid.device}"
        )


def _replicate_past(h: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """h [B, C, T] with each row's samples past index last[b] ([B, 1, 1]) replaced by sample last[b]."""
    idx = torch.minimum(torch.arange(h.shape[2], device=h.device).view(1, 1, -1), last)
    return h.gather(2, idx.expand(h.shape))


def anti_alias_snake_reference(
    x: torch.Tensor,
    up_filter: torch.Tensor,
    down_filter: torch.Tensor,
    alpha: torch.Tensor,
    beta: torch.Tensor,
    logscale: bool,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reference: x [B, C, T] -> [B, C, T], computed in x's dtype at the 2x rate.

    With `valid`, each row's input past its length and its activated 2x signal past twice that are
    replaced by their last valid sample before each filter: the replicate padding of a row that ends
    there (the filters reach 3 input / 6 upsampled samples past an output), so its first valid[b] outputs
    equal the op of those samples alone; the rest are zeros."""
    check_args(x, up_filter, down_filter, alpha)
    check_valid(valid, x)
    channels, length = x.shape[1], x.shape[2]
    if valid is not None:
        n = valid.clamp(0, length).view(-1, 1, 1)
        x = _replicate_past(x, (n - 1).clamp(min=0))
    pad = TAPS // RATIO - 1
    crop = pad * RATIO + (TAPS - RATIO) // 2  # the same on both sides for an even filter
    h = F.pad(x, (pad, pad), mode="replicate")
    up = up_filter.reshape(1, 1, TAPS).expand(channels, -1, -1)
    h = RATIO * F.conv_transpose1d(h, up, stride=RATIO, groups=channels)[..., crop:-crop]  # [B, C, 2T]
    a, inv_b = snake_factors(alpha, beta, logscale)
    h = h + inv_b.view(1, -1, 1) * torch.sin(h * a.view(1, -1, 1)).pow(2)
    if valid is not None:
        h = _replicate_past(h, (RATIO * n - 1).clamp(min=0))
    h = F.pad(h, (TAPS // 2 - 1, TAPS // 2), mode="replicate")
    down = down_filter.reshape(1, 1, TAPS).expand(channels, -1, -1)
    y = F.conv1d(h, down, stride=RATIO, groups=channels)
    if valid is not None:
        y = y.masked_fill(torch.arange(length, device=x.device).view(1, 1, -1) >= n, 0.0)
    return y


def _up_weights(up_filter: torch.Tensor) -> torch.Tensor:
    """[2, 1, 7] correlation weights over x[j-3 .. j+3] giving the upsampled samples 2j and 2j+1.

    Sample 2j is 2 * sum_q f[2q+1] x[j+2-q] and sample 2j+1 is 2 * sum_q f[2q] x[j+3-q] (q = 0..5):
    the transposed conv with stride 2 and its crop of 15, written per output phase."""
    f = up_filter.reshape(TAPS)
    w = f.new_zeros(2, 2 * HALO + 1)
    w[0, :HALF] = RATIO * f[1::2].flip(0)  # tap k multiplies x[j-3+k]
    w[1, 1:] = RATIO * f[0::2].flip(0)
    return w.unsqueeze(1)


def _down_weights(down_filter: torch.Tensor) -> torch.Tensor:
    """[1, 2, 7]: y[t] = sum_k w[0, k] even[t-3+k] + w[1, k] odd[t-3+k], the strided conv per phase.

    y[t] = sum_p g[2p+1] s[2(t+p-2)] + g[2p] s[2(t+p-3)+1], p = 0..5 (replicate-padded s)."""
    g = down_filter.reshape(TAPS)
    w = g.new_zeros(2, 2 * HALO + 1)
    w[0, 1:] = g[1::2]
    w[1, :HALF] = g[0::2]
    return w.unsqueeze(0)


def anti_alias_snake_polyphase(
    x: torch.Tensor,
    up_filter: torch.Tensor,
    down_filter: torch.Tensor,
    alpha: torch.Tensor,
    beta: torch.Tensor,
    logscale: bool,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """The `torch` backend: x [B, C, T] -> [B, C, T], equal to the reference (polyphase form). Masked
    rows (`valid`) take the reference's own masked form (the two replications between its filters)."""
    if valid is not None:
        return anti_alias_snake_reference(x, up_filter, down_filter, alpha, beta, logscale, valid)
    check_args(x, up_filter, down_filter, alpha)
    batch, channels, length = x.shape
    h = F.pad(x, (HALO, HALO), mode="replicate")
    up = _up_weights(up_filter).to(x.dtype).repeat(channels, 1, 1)  # [2C, 1, 7]
    h = F.conv1d(h, up, groups=channels).view(batch, channels, 2, length)  # [B, C, phase, T]
    a, inv_b = snake_factors(alpha, beta, logscale)
    h = torch.addcmul(h, inv_b.view(1, -1, 1, 1), torch.sin(h * a.view(1, -1, 1, 1)).square())
    # The activated signal is replicate-padded at the 2x rate: its first sample is the even
    # phase at 0, its last the odd phase at T-1; both phases take those values past the ends.
    left = h[:, :, :1, :1].expand(batch, channels, 2, HALO)
    right = h[:, :, 1:, -1:].expand(batch, channels, 2, HALO)
    h = torch.cat((left, h, right), dim=3).view(batch, 2 * channels, length + 2 * HALO)
    down = _down_weights(down_filter).to(x.dtype).repeat(channels, 1, 1)  # [C, 2, 7]
    return F.conv1d(h, down, groups=channels)
