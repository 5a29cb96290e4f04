"""chinese-hubert-base as a plain torch module, on the tensor names of transformers' `HubertModel`.

Why not transformers' class: importing its model modules costs ~7.8 s of process start on the GPU machine
(~1,600 modules: torch.distributed, torch._dynamo, sympy, scipy), and while it runs beside the weight
loads it holds the interpreter lock in short slices that make every weight copy wait (measured:
`benchmarks/results/e2e_startup_h200.json`, the load took 20.7 s with that import beside it, 8.1 s
without). The architecture is small; `tests/test_ssl.py` checks this module against transformers' own
`HubertModel.from_pretrained` on the same folder.

What it covers is what chinese-hubert-base's config.json says (and what GPT-SoVITS runs): a grouped-norm
conv feature extractor, the feature projection with its layer norm, the weight-normed positional conv
(kept as `weight_g` / `weight_v`, dim 2, as the published file names them) and post-norm transformer
layers, inference only (no masking, no dropout). Other config values raise `CheckpointError`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from voicehub.models.gpt_sovits import encoder_parts

# config.json value -> what this module requires of it (key, allowed values)
SUPPORTED: dict[str, tuple[Any, ...]] = {
    "feat_extract_norm": ("group",),
    "feat_extract_activation": ("gelu",),
    "hidden_act": ("gelu",),
    "do_stable_layer_norm": (False,),
    "conv_pos_batch_norm": (False,),
}


def check_config(config: Mapping[str, Any], source: str) -> None:
    """Raise CheckpointError naming each config.json value this module does not implement."""
    encoder_parts.check_config(config, SUPPORTED, source, "HuBERT")


class ConvLayer(nn.Module):
    """One feature-extractor conv (no bias in chinese-hubert-base); the first also has a GroupNorm with
    one group per channel (transformers' `HubertGroupNormConvLayer`, named `layer_norm`)."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, bias: bool, norm: bool):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, stride=stride, bias=bias)
        self.layer_norm = nn.GroupNorm(c_out, c_out, affine=True) if norm else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        return F.gelu(x)


class FeatureExtractor(nn.Module):
    def __init__(self, config: Mapping[str, Any]):
        super().__init__()
        dims = [1, *config["conv_dim"]]
        self.conv_layers = nn.ModuleList(
            ConvLayer(dims[i], dims[i + 1], k, s, config["conv_bias"], norm=i == 0)
            for i, (k, s) in enumerate(zip(config["conv_kernel"], config["conv_stride"]))
        )

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        x = wav[:, None]  # [B, 1, n]
        for layer in self.conv_layers:
            x = layer(x)
        return x  # [B, C, T]


class FeatureProjection(nn.Module):
    def __init__(self, config: Mapping[str, Any]):
        super().__init__()
        width = config["conv_dim"][-1]
        has_norm = config.get("feat_proj_layer_norm", True)
        self.layer_norm = nn.LayerNorm(width, eps=config["layer_norm_eps"]) if has_norm else None
        self.projection = nn.Linear(width, config["hidden_size"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        return self.projection(x)


class PositionalConv(nn.Module):
    """Grouped conv over time with weight norm over dim 2 (one gain per kernel tap), then GELU; an even
    kernel drops the last output frame so the length is kept."""

    def __init__(self, config: Mapping[str, Any]):
        super().__init__()
        width, kernel = config["hidden_size"], config["num_conv_pos_embeddings"]
        self.groups = config["num_conv_pos_embedding_groups"]
        self.kernel = kernel
        self.weight_g = nn.Parameter(torch.empty(1, 1, kernel))
        self.weight_v = nn.Parameter(torch.empty(width, width // self.groups, kernel))
        self.bias = nn.Parameter(torch.empty(width))

    def weight(self) -> torch.Tensor:
        v = self.weight_v
        return self.weight_g * v / v.norm(dim=(0, 1), keepdim=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.conv1d(x, self.weight(), self.bias, padding=self.kernel // 2, groups=self.groups)
        if self.kernel % 2 == 0:
            y = y[..., :-1]
        return F.gelu(y)


class PositionalEmbedding(nn.Module):
    def __init__(self, config: Mapping[str, Any]):
        super().__init__()
        self.conv = PositionalConv(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, C]
        return self.conv(x.transpose(1, 2)).transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(width, width)
        self.k_proj = nn.Linear(width, width)
        self.v_proj = nn.Linear(width, width)
        self.out_proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(encoder_parts.attend(x, self.q_proj, self.k_proj, self.v_proj, self.heads))


class FeedForward(nn.Module):
    def __init__(self, width: int, inner: int):
        super().__init__()
        self.intermediate_dense = nn.Linear(width, inner)
        self.output_dense = nn.Linear(inner, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output_dense(F.gelu(self.intermediate_dense(x)))


class EncoderLayer(nn.Module):
    """Post-norm: attention, residual, norm; feed-forward, residual, norm."""

    def __init__(self, config: Mapping[str, Any]):
        super().__init__()
        width, eps = config["hidden_size"], config["layer_norm_eps"]
        self.attention = Attention(width, config["num_attention_heads"])
        self.layer_norm = nn.LayerNorm(width, eps=eps)
        self.feed_forward = FeedForward(width, config["intermediate_size"])
        self.final_layer_norm = nn.LayerNorm(width, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer_norm(x + self.attention(x))
        return self.final_layer_norm(x + self.feed_forward(x))


class Encoder(nn.Module):
    def __init__(self, config: Mapping[str, Any]):
        super().__init__()
        self.pos_conv_embed = PositionalEmbedding(config)
        self.layer_norm = nn.LayerNorm(config["hidden_size"], eps=config["layer_norm_eps"])
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config["num_hidden_layers"]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer_norm(x + self.pos_conv_embed(x))
        for layer in self.layers:
            x = layer(x)
        return x


class HubertModel(nn.Module):
    """16 kHz audio [B, n] -> last hidden state [B, T, hidden] (transformers' `last_hidden_state`)."""

    def __init__(self, config: Mapping[str, Any]):
        super().__init__()
        self.config = dict(config)
        self.feature_extractor = FeatureExtractor(config)
        self.feature_projection = FeatureProjection(config)
        self.encoder = Encoder(config)
        # Fills masked frames in training only (SpecAugment); transformers creates it whenever masking is on.
        if config.get("mask_time_prob", 0) > 0 or config.get("mask_feature_prob", 0) > 0:
            self.masked_spec_embed = nn.Parameter(torch.empty(config["hidden_size"]))

    @property
    def hidden_size(self) -> int:
        return int(self.config["hidden_size"])

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        features = self.feature_extractor(wav).transpose(1, 2)
        return self.encoder(self.feature_projection(features))


@torch.no_grad()
def init_random(model: HubertModel, std: float) -> None:
    """Random test weights in the spirit of transformers' initialisation (normal(0, std) linears, unit
    norms, kaiming convs, the positional conv's gain set to its direction's norm, so its weight is the
    drawn direction), so test features are neither zero nor saturated."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.weight.normal_(0.0, std)
            module.bias.zero_()
        elif isinstance(module, (nn.LayerNorm, nn.GroupNorm)):
            module.weight.fill_(1.0)
            module.bias.zero_()
        elif isinstance(module, nn.Conv1d):
            nn.init.kaiming_normal_(module.weight)
        elif isinstance(module, PositionalConv):
            fan_in = module.weight_v.shape[1] * module.kernel
            module.weight_v.normal_(0.0, math.sqrt(4.0 / fan_in))
            module.weight_g.copy_(module.weight_v.norm(dim=(0, 1), keepdim=True))
            module.bias.zero_()
    if hasattr(model, "masked_spec_embed"):
        model.masked_spec_embed.uniform_()
