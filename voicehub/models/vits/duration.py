"""Duration predictors: the stochastic one (a reversed normalising flow over log-durations)
and the plain convolutional one some VITS voices use instead."""

from __future__ import annotations

import math

import torch
from torch import nn

from voicehub.models.vits.layers import ChannelLayerNorm, DDSConv, inverse_rq_spline

SPLINE_TAIL_BOUND = 5.0  # fixed in upstream VITS's ConvFlow, not stored in any checkpoint


class ElementwiseAffine(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.m = nn.Parameter(torch.zeros(channels, 1))
        self.logs = nn.Parameter(torch.zeros(channels, 1))

    def reverse(self, z: torch.Tensor, mask: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        return (z - self.m) * torch.exp(-self.logs) * mask


class ConvFlow(nn.Module):
    """Neural-spline coupling: the second channel is warped by a spline predicted from the first."""

    def __init__(
        self, channels: int, filter_channels: int, kernel_size: int, n_layers: int, n_bins: int
    ) -> None:
        super().__init__()
        self.half = channels // 2
        self.n_bins = n_bins
        self.scale = math.sqrt(filter_channels)
        self.pre = nn.Conv1d(self.half, filter_channels, 1)
        self.convs = DDSConv(filter_channels, kernel_size, n_layers)
        self.proj = nn.Conv1d(filter_channels, self.half * (3 * n_bins - 1), 1)

    def reverse(self, z: torch.Tensor, mask: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        # z: [B, 2, T], cond: [B, F, T]
        z0, z1 = z[:, : self.half], z[:, self.half :]
        h = self.proj(self.convs(self.pre(z0), mask, cond)) * mask
        b, c, t = z0.shape
        h = h.reshape(b, c, -1, t).permute(0, 1, 3, 2).float()  # [B, c, T, 3K-1]; the spline runs in fp32
        k = self.n_bins
        z1 = inverse_rq_spline(
            z1.float(),
            h[..., :k] / self.scale,
            h[..., k : 2 * k] / self.scale,
            h[..., 2 * k :],
            SPLINE_TAIL_BOUND,
        ).to(z.dtype)
        return torch.cat([z0, z1], 1) * mask


class Flip(nn.Module):
    """Reverses the channel order; no parameters."""

    def reverse(self, z: torch.Tensor, mask: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        return torch.flip(z, [1])


class UnusedFlow(nn.Module):
    """Stands at `flows.1`: upstream drops that flow when sampling, so inference never needs its weights."""


class StochasticDurationPredictor(nn.Module):
    """Samples log-durations: noise [B, 2, T] pushed backwards through the flows, conditioned on text."""

    def __init__(
        self,
        in_channels: int,
        filter_channels: int,
        kernel_size: int,
        n_flows: int,
        n_bins: int,
        gin_channels: int,
    ) -> None:
        super().__init__()
        self.pre = nn.Conv1d(in_channels, filter_channels, 1)
        self.convs = DDSConv(filter_channels, kernel_size, n_layers=3)
        self.proj = nn.Conv1d(filter_channels, filter_channels, 1)
        if gin_channels:
            self.cond = nn.Conv1d(gin_channels, filter_channels, 1)
        self.flows = nn.ModuleList([ElementwiseAffine(2)])
        for i in range(n_flows):
            flow = ConvFlow(2, filter_channels, kernel_size, 3, n_bins) if i else UnusedFlow()
            self.flows.extend([flow, Flip()])

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor,
        g: torch.Tensor | None,
        noise_w: float,
        generator: torch.Generator | None,
    ) -> torch.Tensor:
        # x: [B, H, T], mask: [B, 1, T] -> logw: [B, 1, T]
        h = self.pre(x)
        if g is not None:
            h = h + self.cond(g)
        h = self.proj(self.convs(h, mask)) * mask
        b, _, t = x.shape
        z = torch.randn(b, 2, t, generator=generator, device=x.device, dtype=x.dtype) * noise_w
        for flow in reversed(self.flows):
            if not isinstance(flow, UnusedFlow):
                z = flow.reverse(z, mask, h)
        return z[:, :1]


class DurationPredictor(nn.Module):
    """Deterministic log-durations from two conv + LayerNorm layers (VITS with use_sdp=False)."""

    def __init__(self, in_channels: int, filter_channels: int, kernel_size: int, gin_channels: int) -> None:
        super().__init__()
        pad = kernel_size // 2
        self.conv_1 = nn.Conv1d(in_channels, filter_channels, kernel_size, padding=pad)
        self.norm_1 = ChannelLayerNorm(filter_channels)
        self.conv_2 = nn.Conv1d(filter_channels, filter_channels, kernel_size, padding=pad)
        self.norm_2 = ChannelLayerNorm(filter_channels)
        self.proj = nn.Conv1d(filter_channels, 1, 1)
        if gin_channels:
            self.cond = nn.Conv1d(gin_channels, in_channels, 1)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor,
        g: torch.Tensor | None,
        noise_w: float,
        generator: torch.Generator | None,
    ) -> torch.Tensor:
        # x: [B, H, T] -> logw: [B, 1, T]; noise_w and generator are unused (no noise here)
        if g is not None:
            x = x + self.cond(g)
        x = self.norm_1(torch.relu(self.conv_1(x * mask)))
        x = self.norm_2(torch.relu(self.conv_2(x * mask)))
        return self.proj(x * mask) * mask
