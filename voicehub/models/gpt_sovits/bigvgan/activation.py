"""BigVGAN's anti-aliased periodic activation: 2x upsample, Snake/SnakeBeta, 2x downsample.

The computation is one named op, `ANTI_ALIAS_SNAKE`, a free function of tensors. Each
`AntiAliasActivation` module calls whatever function its `kernel` attribute holds, set at
construction to the op's torch reference (voicehub.runtime.kernels); a fused kernel replaces it with
`BigVGAN.set_activation_kernel` (same signature, same result within tolerance).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from voicehub.models.gpt_sovits.weights import computed_buffer
from voicehub.runtime.kernels.anti_alias_snake import anti_alias_snake_reference

# The op's name in the kernel registry (re-exported here so callers of the model need not know it).
from voicehub.runtime.kernels.registry import ANTI_ALIAS_SNAKE  # noqa: F401  (re-exported)

RATIO = 2  # up/down-sampling ratio around the activation
FILTER_TAPS = 12  # kaiser-windowed sinc taps of both filters


def kaiser_sinc_filter(cutoff: float, half_width: float, taps: int) -> torch.Tensor:
    """Low-pass FIR [1, 1, taps] (even taps), normalised to unit DC gain (alias-free-torch design)."""
    half = taps // 2
    delta_f = 4 * half_width
    attenuation = 2.285 * (half - 1) * math.pi * delta_f + 7.95
    if attenuation > 50.0:
        beta = 0.1102 * (attenuation - 8.7)
    elif attenuation >= 21.0:
        beta = 0.5842 * (attenuation - 21) ** 0.4 + 0.07886 * (attenuation - 21.0)
    else:
        beta = 0.0
    window = torch.kaiser_window(taps, beta=beta, periodic=False)
    time = torch.arange(-half, half) + 0.5
    filt = 2 * cutoff * window * torch.sinc(2 * cutoff * time)
    return (filt / filt.sum()).view(1, 1, taps)


# f(x, up_filter, down_filter, alpha, beta, logscale[, valid]) -> y (runtime/kernels/anti_alias_snake.py)
ActivationKernel = Callable[..., torch.Tensor]


# The model's own activation is the op's reference definition in the runtime (one definition:
# the registry's backends are held to it); fused kernels replace it through set_activation_kernel.
anti_alias_snake_torch = anti_alias_snake_reference


class Snake(nn.Module):
    """Parameters of Snake (`alpha`) or SnakeBeta (`alpha`, `beta`)."""

    def __init__(self, channels: int, with_beta: bool, logscale: bool):
        super().__init__()
        init = 0.0 if logscale else 1.0  # both mean a factor of 1
        self.alpha = nn.Parameter(torch.full((channels,), init))
        self.beta = nn.Parameter(torch.full((channels,), init)) if with_beta else None


class _Filter(nn.Module):
    def __init__(self, cutoff: float, half_width: float):
        super().__init__()
        taps = FILTER_TAPS  # in the files too: the meta build makes it empty, the load assigns it
        filt = computed_buffer((1, 1, taps), lambda: kaiser_sinc_filter(cutoff, half_width, taps))
        self.register_buffer("filter", filt)


class _DownSample(nn.Module):
    def __init__(self):
        super().__init__()
        self.lowpass = _Filter(0.5 / RATIO, 0.6 / RATIO)


class AntiAliasActivation(nn.Module):
    """Holds `act.alpha`/`act.beta`, `upsample.filter`, `downsample.lowpass.filter` (upstream names)."""

    def __init__(
        self,
        channels: int,
        with_beta: bool,
        logscale: bool,
        kernel: ActivationKernel = anti_alias_snake_torch,
    ):
        super().__init__()
        self.act = Snake(channels, with_beta, logscale)
        self.upsample = _Filter(0.5 / RATIO, 0.6 / RATIO)
        self.downsample = _DownSample()
        self.logscale = logscale
        self.kernel = kernel

    def forward(self, x: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        # x: [B, C, T] -> [B, C, T]; valid: None or per-row lengths [B] (the op's masked rows)
        beta = self.act.beta if self.act.beta is not None else self.act.alpha
        args = (x, self.upsample.filter, self.downsample.lowpass.filter, self.act.alpha, beta, self.logscale)
        return self.kernel(*args) if valid is None else self.kernel(*args, valid)
