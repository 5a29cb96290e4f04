"""The VITS text encoder: phoneme embedding, a transformer with relative-position attention
(Shaw et al. 2018, windowed), and a projection to the prior's mean and log-scale."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from voicehub.models.vits.layers import ChannelLayerNorm

MASKED_SCORE = -1e4  # what upstream fills masked scores with (not -inf: keeps fp16 finite)


class RelativeAttention(nn.Module):
    """Multi-head self-attention with learned relative-position keys and values.

    The attention itself is the function `self.attend` holds (`relative_attention_native`, the
    reference, unless an optimization swapped in another through `VitsSynthesizer.set_attention`).
    """

    def __init__(self, channels: int, n_heads: int, window_size: int, heads_share: bool = True) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = channels // n_heads
        self.window_size = window_size
        self.conv_q = nn.Conv1d(channels, channels, 1)
        self.conv_k = nn.Conv1d(channels, channels, 1)
        self.conv_v = nn.Conv1d(channels, channels, 1)
        self.conv_o = nn.Conv1d(channels, channels, 1)
        n_rel = 1 if heads_share else n_heads
        self.emb_rel_k = nn.Parameter(torch.zeros(n_rel, 2 * window_size + 1, self.head_dim))
        self.emb_rel_v = nn.Parameter(torch.zeros(n_rel, 2 * window_size + 1, self.head_dim))
        self.attend: RelativeAttentionFn = relative_attention_native

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        # x: [B, C, T], attn_mask: [B, 1, T, T]
        b, c, t = x.shape

        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, self.n_heads, self.head_dim, t).transpose(2, 3)  # [B, H, T, D]

        q = heads(self.conv_q(x)) / math.sqrt(self.head_dim)
        k, v = heads(self.conv_k(x)), heads(self.conv_v(x))
        out = self.attend(q, k, v, self.emb_rel_k, self.emb_rel_v, attn_mask)  # [B, H, T, D]
        return self.conv_o(out.transpose(2, 3).reshape(b, c, t))


# (q scaled by 1/sqrt(D), k, v: [B, H, T, D]; emb_rel_k, emb_rel_v: [n_rel, 2W+1, D] for offsets
# -W..W; attn_mask: [B, 1, T, T], 0 where masked) -> [B, H, T, D]
RelativeAttentionFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor
]


def relative_windows(emb: torch.Tensor, length: int) -> torch.Tensor:
    """Embeddings [n_rel, 2W+1, D] for offsets -(length-1)..(length-1): [n_rel, 2*length - 1, D],
    zero beyond the window."""
    window = (emb.shape[1] - 1) // 2
    pad = max(length - (window + 1), 0)
    start = max(window + 1 - length, 0)
    if pad:
        emb = F.pad(emb, (0, 0, pad, pad))
    return emb[:, start : start + 2 * length - 1]


def relative_attention_native(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    emb_rel_k: torch.Tensor,
    emb_rel_v: torch.Tensor,
    attn_mask: torch.Tensor,
) -> torch.Tensor:
    """The reference: full score and weight matrices, as upstream VITS computes them.

    Not a plain scaled_dot_product_attention: the relative-value term needs the attention weights
    themselves (vits/attention_sdpa.py gets them another way).
    """
    t = q.shape[2]
    scores = q @ k.transpose(-2, -1)  # [B, H, T, T]
    rel_logits = q @ relative_windows(emb_rel_k, t).unsqueeze(0).transpose(-2, -1)  # [B, H, T, 2T-1]
    scores = scores + rel_to_abs(rel_logits)
    scores = scores.masked_fill(attn_mask == 0, MASKED_SCORE)
    p = torch.softmax(scores, dim=-1)
    return p @ v + abs_to_rel(p) @ relative_windows(emb_rel_v, t).unsqueeze(0)


def rel_to_abs(x: torch.Tensor) -> torch.Tensor:
    """[B, H, T, 2T-1] logits by relative offset -> [B, H, T, T] by absolute key position."""
    b, h, t, _ = x.shape
    x = F.pad(x, (0, 1)).view(b, h, 2 * t * t)
    x = F.pad(x, (0, t - 1)).view(b, h, t + 1, 2 * t - 1)
    return x[:, :, :t, t - 1 :]


def abs_to_rel(x: torch.Tensor) -> torch.Tensor:
    """[B, H, T, T] weights by absolute key position -> [B, H, T, 2T-1] by relative offset."""
    b, h, t, _ = x.shape
    x = F.pad(x, (0, t - 1)).view(b, h, t * (2 * t - 1))
    x = F.pad(x, (t, 0)).view(b, h, t, 2 * t)
    return x[:, :, :, 1:]


class FeedForward(nn.Module):
    """Two 'same'-padded convolutions with a ReLU between, masked."""

    def __init__(self, channels: int, filter_channels: int, kernel_size: int) -> None:
        super().__init__()
        self.pad = ((kernel_size - 1) // 2, kernel_size // 2)
        self.conv_1 = nn.Conv1d(channels, filter_channels, kernel_size)
        self.conv_2 = nn.Conv1d(filter_channels, channels, kernel_size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # x: [B, C, T], mask: [B, 1, T]
        x = torch.relu(self.conv_1(F.pad(x * mask, self.pad)))
        return self.conv_2(F.pad(x * mask, self.pad)) * mask


class Encoder(nn.Module):
    """Post-norm transformer stack."""

    def __init__(
        self,
        channels: int,
        filter_channels: int,
        n_heads: int,
        n_layers: int,
        kernel_size: int,
        window: int,
        share: bool,
    ) -> None:
        super().__init__()
        self.attn_layers = nn.ModuleList(
            RelativeAttention(channels, n_heads, window, share) for _ in range(n_layers)
        )
        self.norm_layers_1 = nn.ModuleList(ChannelLayerNorm(channels) for _ in range(n_layers))
        self.ffn_layers = nn.ModuleList(
            FeedForward(channels, filter_channels, kernel_size) for _ in range(n_layers)
        )
        self.norm_layers_2 = nn.ModuleList(ChannelLayerNorm(channels) for _ in range(n_layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # x: [B, C, T], mask: [B, 1, T]
        attn_mask = mask.unsqueeze(2) * mask.unsqueeze(-1)
        x = x * mask
        for attn, norm1, ffn, norm2 in zip(
            self.attn_layers, self.norm_layers_1, self.ffn_layers, self.norm_layers_2
        ):
            x = norm1(x + attn(x, attn_mask))
            x = norm2(x + ffn(x, mask))
        return x * mask


class TextEncoder(nn.Module):
    """Phoneme ids -> hidden states and the prior's statistics."""

    def __init__(
        self,
        n_vocab: int,
        out_channels: int,
        hidden: int,
        filter_channels: int,
        n_heads: int,
        n_layers: int,
        kernel_size: int,
        window_size: int,
        heads_share: bool,
    ) -> None:
        super().__init__()
        self.hidden = hidden
        self.emb = nn.Embedding(n_vocab, hidden)
        self.encoder = Encoder(
            hidden, filter_channels, n_heads, n_layers, kernel_size, window_size, heads_share
        )
        self.proj = nn.Conv1d(hidden, 2 * out_channels, 1)

    def forward(
        self, ids: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # ids: [B, T] int64, mask: [B, 1, T] -> x: [B, H, T], m, logs: [B, C, T]
        x = (self.emb(ids) * math.sqrt(self.hidden)).transpose(1, 2)
        x = self.encoder(x * mask, mask)
        m, logs = (self.proj(x) * mask).chunk(2, dim=1)
        return x, m, logs
