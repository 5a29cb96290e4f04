"""BigVGAN v2 generator (NVIDIA), inference only, with the official file's tensor names.

Convolutions are plain at run time; the file's weight-norm pairs are folded at load.

Masked rows: `forward(mel, valid)` runs right-padded mels, row b being the generator of its first
valid[b] frames alone (up to float rounding; its samples past valid[b] * hop are not). Each convolution
zero-pads its borders and each anti-aliased activation replicates them, so the padding is made what a
row ending there would see: every convolution's input is zero past the row's length at its rate (the
activations write zeros there, `zero_past` does it before conv_pre and each upsampler), and the
activations replicate at the row's length (the op's `valid`). The lengths stay on the device, so a CUDA
graph of one padded shape serves every length up to it (vocoder_graphs.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from voicehub.errors import CheckpointError
from voicehub.models.gpt_sovits.bigvgan.activation import (
    ActivationKernel,
    AntiAliasActivation,
    anti_alias_snake_torch,
)
from voicehub.models.gpt_sovits.sovits.strict import WeightNormConv1d, WeightNormConvTranspose1d

ACTIVATIONS = ("snake", "snakebeta")
RESBLOCKS = ("1", "2")


@dataclass(frozen=True)
class BigVGANConfig:
    """The generator fields of BigVGAN's config.json (training fields are ignored)."""

    num_mels: int
    upsample_rates: tuple[int, ...]
    upsample_kernel_sizes: tuple[int, ...]
    upsample_initial_channel: int
    resblock: str
    resblock_kernel_sizes: tuple[int, ...]
    resblock_dilation_sizes: tuple[tuple[int, ...], ...]
    activation: str
    snake_logscale: bool
    sampling_rate: int
    hop_size: int
    use_tanh_at_final: bool = True
    use_bias_at_final: bool = True

    @classmethod
    def from_json(cls, cfg: Mapping[str, Any], source: str) -> BigVGANConfig:
        try:
            conf = cls(
                num_mels=int(cfg["num_mels"]),
                upsample_rates=tuple(int(r) for r in cfg["upsample_rates"]),
                upsample_kernel_sizes=tuple(int(k) for k in cfg["upsample_kernel_sizes"]),
                upsample_initial_channel=int(cfg["upsample_initial_channel"]),
                resblock=str(cfg["resblock"]),
                resblock_kernel_sizes=tuple(int(k) for k in cfg["resblock_kernel_sizes"]),
                resblock_dilation_sizes=tuple(
                    tuple(int(d) for d in ds) for ds in cfg["resblock_dilation_sizes"]
                ),
                activation=str(cfg["activation"]),
                snake_logscale=bool(cfg["snake_logscale"]),
                sampling_rate=int(cfg["sampling_rate"]),
                hop_size=int(cfg["hop_size"]),
                use_tanh_at_final=bool(cfg.get("use_tanh_at_final", True)),
                use_bias_at_final=bool(cfg.get("use_bias_at_final", True)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{source}: BigVGAN config is missing or has a bad field: {exc}") from exc
        conf.validate(source)
        return conf

    def validate(self, source: str) -> None:
        if self.activation not in ACTIVATIONS:
            raise CheckpointError(
                f"{source}: activation {self.activation!r} unknown; valid: {', '.join(ACTIVATIONS)}"
            )
        if self.resblock not in RESBLOCKS:
            raise CheckpointError(
                f"{source}: resblock {self.resblock!r} unknown; valid: {', '.join(RESBLOCKS)}"
            )
        if len(self.upsample_rates) != len(self.upsample_kernel_sizes):
            raise CheckpointError(f"{source}: upsample_rates and upsample_kernel_sizes differ in length")
        if len(self.resblock_kernel_sizes) != len(self.resblock_dilation_sizes):
            raise CheckpointError(
                f"{source}: resblock_kernel_sizes and resblock_dilation_sizes differ in length"
            )
        upsampling = 1
        for r in self.upsample_rates:
            upsampling *= r
        if upsampling != self.hop_size:
            raise CheckpointError(
                f"{source}: upsample_rates multiply to {upsampling}, but hop_size is {self.hop_size}"
            )


def _padding(kernel: int, dilation: int) -> int:
    return (kernel * dilation - dilation) // 2


class AMPBlock(nn.Module):
    """Residual block of anti-aliased activations and dilated convs (AMPBlock1, or AMPBlock2)."""

    def __init__(
        self, conf: BigVGANConfig, channels: int, kernel: int, dilations: tuple[int, ...], act_kernel
    ):
        super().__init__()
        self.is_type1 = conf.resblock == "1"
        convs = [
            WeightNormConv1d(channels, channels, kernel, dilation=d, padding=_padding(kernel, d))
            for d in dilations
        ]
        if self.is_type1:
            self.convs1 = nn.ModuleList(convs)
            self.convs2 = nn.ModuleList(
                WeightNormConv1d(channels, channels, kernel, padding=_padding(kernel, 1)) for _ in dilations
            )
        else:
            self.convs = nn.ModuleList(convs)
        n_acts = len(dilations) * (2 if self.is_type1 else 1)
        with_beta = conf.activation == "snakebeta"
        self.activations = nn.ModuleList(
            AntiAliasActivation(channels, with_beta, conf.snake_logscale, act_kernel) for _ in range(n_acts)
        )

    def forward(self, x: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        # x: [B, C, T]; valid: None or per-row lengths [B] at this rate (every conv here reads an
        # activation's output, zero past them)
        if self.is_type1:
            acts = self.activations
            for c1, c2, a1, a2 in zip(self.convs1, self.convs2, acts[::2], acts[1::2]):
                x = x + c2(a2(c1(a1(x, valid)), valid))
        else:
            for c, a in zip(self.convs, self.activations):
                x = x + c(a(x, valid))
        return x


class BigVGAN(nn.Module):
    """Log-mel [B, num_mels, T] -> waveform [B, 1, T * hop_size] in [-1, 1]."""

    def __init__(self, conf: BigVGANConfig, act_kernel: ActivationKernel = anti_alias_snake_torch):
        super().__init__()
        self.conf = conf
        ch0 = conf.upsample_initial_channel
        self.conv_pre = WeightNormConv1d(conf.num_mels, ch0, 7, 1, padding=3)
        self.ups = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        for i, (rate, k) in enumerate(zip(conf.upsample_rates, conf.upsample_kernel_sizes)):
            c_in, c_out = ch0 // 2**i, ch0 // 2 ** (i + 1)
            # ups.i.0: upstream nests each upsampler in a one-element ModuleList.
            self.ups.append(
                nn.ModuleList([WeightNormConvTranspose1d(c_in, c_out, k, rate, padding=(k - rate) // 2)])
            )
            for k_res, dil in zip(conf.resblock_kernel_sizes, conf.resblock_dilation_sizes):
                self.resblocks.append(AMPBlock(conf, c_out, k_res, dil, act_kernel))
        c_last = ch0 // 2 ** len(conf.upsample_rates)
        with_beta = conf.activation == "snakebeta"
        self.activation_post = AntiAliasActivation(c_last, with_beta, conf.snake_logscale, act_kernel)
        self.conv_post = WeightNormConv1d(c_last, 1, 7, 1, padding=3, bias=conf.use_bias_at_final)

    def set_activation_kernel(self, kernel: ActivationKernel) -> ActivationKernel:
        """Route every anti-aliased activation through `kernel`; returns the previous one."""
        previous = self.activation_post.kernel
        for mod in self.modules():
            if isinstance(mod, AntiAliasActivation):
                mod.kernel = kernel
        return previous

    def forward(self, mel: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        # mel: [B, num_mels, T] -> [B, 1, T * hop]; valid: None or per-row frames [B] (module docstring)
        n = None if valid is None else valid * self.conf.hop_size
        x = self.conv_post(self.activation_post(self.body(mel, valid), n))
        return torch.tanh(x) if self.conf.use_tanh_at_final else x.clamp(-1.0, 1.0)

    def body(self, mel: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Everything before the final activation and conv: [B, num_mels, T] -> [B, C_last, T * hop]."""
        x = self.conv_pre(zero_past(mel, valid))
        n_k = len(self.conf.resblock_kernel_sizes)
        for i, (up, rate) in enumerate(zip(self.ups, self.conf.upsample_rates)):
            x = up[0](zero_past(x, valid))
            valid = None if valid is None else valid * rate
            xs = self.resblocks[i * n_k](x, valid)
            for j in range(1, n_k):
                xs = xs + self.resblocks[i * n_k + j](x, valid)
            x = xs / n_k
        return x


def zero_past(x: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """x [B, C, T] with each row's samples from valid[b] on set to zero (x itself when valid is None)."""
    if valid is None:
        return x
    return x.masked_fill(torch.arange(x.shape[2], device=x.device) >= valid.view(-1, 1, 1), 0.0)


@torch.no_grad()
def vocode(vocoder: BigVGAN, mel: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Log-mel [B, num_mels, T] (denormalised, as `decode_mel` returns) -> audio [B, T * hop_size].

    Samples in [-1, 1] at `vocoder.conf.sampling_rate`; the mel is cast to the vocoder's dtype.
    valid: None, or per-row frames [B] on the vocoder's device (masked rows, module docstring).
    """
    weight = vocoder.conv_pre.weight
    mel = mel.to(device=weight.device, dtype=weight.dtype)
    return (vocoder(mel) if valid is None else vocoder(mel, valid))[:, 0]
