"""The HiFi-GAN-style decoder: latent frames [B, C, T] -> waveform [B, 1, T * hop]."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

LRELU_SLOPE = 0.1
FINAL_LRELU_SLOPE = 0.01  # upstream calls F.leaky_relu with its default slope before conv_post


def _same_pad(kernel_size: int, dilation: int) -> int:
    return (kernel_size * dilation - dilation) // 2


class ResBlock1(nn.Module):
    """Three (dilated conv, plain conv) pairs with residual connections."""

    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, dilation=d, padding=_same_pad(kernel_size, d))
            for d in dilations
        )
        self.convs2 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, padding=_same_pad(kernel_size, 1)) for _ in dilations
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, C, T]
        for c1, c2 in zip(self.convs1, self.convs2):
            x = x + c2(F.leaky_relu(c1(F.leaky_relu(x, LRELU_SLOPE)), LRELU_SLOPE))
        return x


class ResBlock2(nn.Module):
    """Dilated convs with residual connections, one per dilation."""

    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, dilation=d, padding=_same_pad(kernel_size, d))
            for d in dilations
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, C, T]
        for conv in self.convs:
            x = x + conv(F.leaky_relu(x, LRELU_SLOPE))
        return x


class Generator(nn.Module):
    """Upsamples latent frames by prod(upsample_rates); each stage averages its residual blocks."""

    def __init__(
        self,
        in_channels: int,
        resblock: str,
        kernel_sizes: tuple[int, ...],
        dilations: tuple[tuple[int, ...], ...],
        upsample_rates: tuple[int, ...],
        initial_channel: int,
        upsample_kernel_sizes: tuple[int, ...],
        gin_channels: int = 0,
    ) -> None:
        super().__init__()
        self.n_kernels = len(kernel_sizes)
        self.conv_pre = nn.Conv1d(in_channels, initial_channel, 7, padding=3)
        if gin_channels:
            self.cond = nn.Conv1d(gin_channels, initial_channel, 1)
        block = ResBlock1 if resblock == "1" else ResBlock2
        self.ups = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        ch = initial_channel
        for i, (rate, kernel) in enumerate(zip(upsample_rates, upsample_kernel_sizes)):
            ch = initial_channel // 2 ** (i + 1)
            self.ups.append(nn.ConvTranspose1d(ch * 2, ch, kernel, rate, padding=(kernel - rate) // 2))
            self.resblocks.extend(block(ch, k, d) for k, d in zip(kernel_sizes, dilations))
        self.conv_post = nn.Conv1d(ch, 1, 7, padding=3, bias=False)

    def forward(self, z: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        # z: [B, C, T] -> audio: [B, 1, T * hop], in [-1, 1]
        x = self.conv_pre(z)
        if g is not None:
            x = x + self.cond(g)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, LRELU_SLOPE))
            blocks = self.resblocks[i * self.n_kernels : (i + 1) * self.n_kernels]
            x = sum(block(x) for block in blocks) / self.n_kernels
        return torch.tanh(self.conv_post(F.leaky_relu(x, FINAL_LRELU_SLOPE)))
