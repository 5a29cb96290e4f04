"""Building blocks shared by the VITS modules: channel LayerNorm, WaveNet stack, DDS convolution,
the inverse rational-quadratic spline, and the residual coupling flows.

Parameter names follow Piper's VITS so its state dicts load unchanged (`gamma`/`beta`,
`in_layers`, `res_skip_layers`, `convs_sep`, `convs_1x1`, ...).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class ChannelLayerNorm(nn.Module):
    """LayerNorm over the channel axis of a [B, C, T] tensor."""

    def __init__(self, channels: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, C, T]
        x = F.layer_norm(x.transpose(1, -1), self.gamma.shape, self.gamma, self.beta, self.eps)
        return x.transpose(1, -1)


class WaveNet(nn.Module):
    """Non-causal gated WaveNet (tanh * sigmoid), as in VITS's flows and posterior encoder."""

    def __init__(
        self, hidden: int, kernel_size: int, dilation_rate: int, n_layers: int, gin_channels: int = 0
    ) -> None:
        super().__init__()
        self.hidden = hidden
        self.in_layers = nn.ModuleList()
        self.res_skip_layers = nn.ModuleList()
        if gin_channels:
            self.cond_layer = nn.Conv1d(gin_channels, 2 * hidden * n_layers, 1)
        for i in range(n_layers):
            dilation = dilation_rate**i
            pad = (kernel_size * dilation - dilation) // 2
            self.in_layers.append(nn.Conv1d(hidden, 2 * hidden, kernel_size, dilation=dilation, padding=pad))
            # The last layer feeds only the skip sum, so it is half as wide.
            out = 2 * hidden if i < n_layers - 1 else hidden
            self.res_skip_layers.append(nn.Conv1d(hidden, out, 1))

    def forward(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        # x: [B, H, T], mask: [B, 1, T], g: [B, G, 1] or None
        out = torch.zeros_like(x)
        g_all = self.cond_layer(g) if g is not None else None
        last = len(self.in_layers) - 1
        for i, (conv, res_skip) in enumerate(zip(self.in_layers, self.res_skip_layers)):
            h = conv(x)
            if g_all is not None:
                h = h + g_all[:, i * 2 * self.hidden : (i + 1) * 2 * self.hidden]
            acts = torch.tanh(h[:, : self.hidden]) * torch.sigmoid(h[:, self.hidden :])
            rs = res_skip(acts)
            if i < last:
                x = (x + rs[:, : self.hidden]) * mask
                out = out + rs[:, self.hidden :]
            else:
                out = out + rs
        return out * mask


class DDSConv(nn.Module):
    """Dilated depth-separable convolutions with residual connections (duration predictor)."""

    def __init__(self, channels: int, kernel_size: int, n_layers: int) -> None:
        super().__init__()
        self.convs_sep = nn.ModuleList()
        self.convs_1x1 = nn.ModuleList()
        self.norms_1 = nn.ModuleList()
        self.norms_2 = nn.ModuleList()
        for i in range(n_layers):
            dilation = kernel_size**i
            pad = (kernel_size * dilation - dilation) // 2
            self.convs_sep.append(
                nn.Conv1d(channels, channels, kernel_size, groups=channels, dilation=dilation, padding=pad)
            )
            self.convs_1x1.append(nn.Conv1d(channels, channels, 1))
            self.norms_1.append(ChannelLayerNorm(channels))
            self.norms_2.append(ChannelLayerNorm(channels))

    def forward(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        # x: [B, C, T], mask: [B, 1, T]
        if g is not None:
            x = x + g
        for sep, pw, n1, n2 in zip(self.convs_sep, self.convs_1x1, self.norms_1, self.norms_2):
            y = F.gelu(n1(sep(x * mask)))
            y = F.gelu(n2(pw(y)))
            x = x + y
        return x * mask


def inverse_rq_spline(
    y: torch.Tensor,
    widths: torch.Tensor,
    heights: torch.Tensor,
    derivs: torch.Tensor,
    tail_bound: float,
    min_bin: float = 1e-3,
    min_deriv: float = 1e-3,
) -> torch.Tensor:
    """Invert a rational-quadratic spline with linear tails (Durkan et al. 2019), elementwise.

    y: [...]; widths, heights: [..., K] unnormalised; derivs: [..., K - 1] interior knots.
    Values outside [-tail_bound, tail_bound] pass through unchanged (identity tails).
    """
    n_bins = widths.shape[-1]
    inside = (y >= -tail_bound) & (y <= tail_bound)
    # Tail knots get derivative 1 exactly: softplus(log(e^(1 - min) - 1)) + min == 1.
    tail = math.log(math.exp(1 - min_deriv) - 1)
    derivs = F.pad(derivs, (1, 1), value=tail)
    derivs = min_deriv + F.softplus(derivs)

    def knots(unnorm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        size = min_bin + (1 - min_bin * n_bins) * torch.softmax(unnorm, dim=-1)
        cum = F.pad(torch.cumsum(size, dim=-1), (1, 0))
        cum = 2 * tail_bound * cum - tail_bound
        cum[..., 0], cum[..., -1] = -tail_bound, tail_bound  # exact ends despite rounding
        return cum, cum[..., 1:] - cum[..., :-1]

    cum_w, w = knots(widths)
    cum_h, h = knots(heights)
    # Which bin each y falls in; the last edge is nudged up so y == tail_bound lands in the last bin.
    edges = torch.cat([cum_h[..., :-1], cum_h[..., -1:] + 1e-6], -1)
    idx = (torch.sum(y.unsqueeze(-1) >= edges, dim=-1) - 1).clamp(0, n_bins - 1).unsqueeze(-1)

    def pick(t: torch.Tensor) -> torch.Tensor:
        return t.gather(-1, idx).squeeze(-1)

    x_k, w_k, y_k, h_k = pick(cum_w), pick(w), pick(cum_h), pick(h)
    d_k, d_k1 = pick(derivs[..., :-1]), pick(derivs[..., 1:])
    s_k = h_k / w_k
    dy = y - y_k
    curv = d_k + d_k1 - 2 * s_k
    a = dy * curv + h_k * (s_k - d_k)
    b = h_k * d_k - dy * curv
    c = -s_k * dy
    disc = (b.pow(2) - 4 * a * c).clamp_min(0)
    theta = (2 * c) / (-b - torch.sqrt(disc))
    x = theta * w_k + x_k
    return torch.where(inside, x, y)


class ResidualCouplingLayer(nn.Module):
    """Mean-only affine coupling: the second half of the channels is shifted by a WaveNet of the first."""

    def __init__(
        self,
        channels: int,
        hidden: int,
        kernel_size: int,
        dilation_rate: int,
        n_layers: int,
        gin_channels: int,
    ) -> None:
        super().__init__()
        self.half = channels // 2
        self.pre = nn.Conv1d(self.half, hidden, 1)
        self.enc = WaveNet(hidden, kernel_size, dilation_rate, n_layers, gin_channels)
        self.post = nn.Conv1d(hidden, self.half, 1)

    def reverse(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor | None) -> torch.Tensor:
        # x: [B, C, T]
        x0, x1 = x[:, : self.half], x[:, self.half :]
        h = self.enc(self.pre(x0) * mask, mask, g)
        x1 = (x1 - self.post(h) * mask) * mask
        return torch.cat([x0, x1], 1)


class ResidualCouplingBlock(nn.Module):
    """The prior flow; at inference it runs backwards, each coupling preceded by a channel flip.

    Upstream interleaves parameter-free Flip modules at the odd indices, so couplings sit at
    `flows.0, flows.2, ...`; identity placeholders keep those state-dict indices.
    """

    def __init__(
        self,
        channels: int,
        hidden: int,
        kernel_size: int,
        dilation_rate: int,
        n_layers: int,
        n_flows: int,
        gin_channels: int,
    ) -> None:
        super().__init__()
        self.flows = nn.ModuleList()
        for _ in range(n_flows):
            self.flows.append(
                ResidualCouplingLayer(channels, hidden, kernel_size, dilation_rate, n_layers, gin_channels)
            )
            self.flows.append(nn.Identity())  # a channel flip: no parameters

    def reverse(self, z: torch.Tensor, mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        # z: [B, C, T] -> [B, C, T]
        for flow in reversed(self.flows):
            z = torch.flip(z, [1]) if isinstance(flow, nn.Identity) else flow.reverse(z, mask, g)
        return z
