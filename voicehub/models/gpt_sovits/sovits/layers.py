"""VITS-style building blocks of SoVITS v3, named as upstream's checkpoints name them.

Inference only: dropout layers are left out (they hold no tensors), masks are kept so a batch
of different lengths stays exact.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from voicehub.models.gpt_sovits.sovits.strict import WeightNormConv1d

REL_WINDOW = 4  # relative-attention window of upstream's attentions.Encoder


def sequence_mask(lengths: torch.Tensor, max_length: int) -> torch.Tensor:
    """[B] lengths -> [B, max_length] bool, True inside the sequence."""
    return torch.arange(max_length, device=lengths.device)[None, :] < lengths[:, None]


class ChannelLayerNorm(nn.Module):
    """LayerNorm over the channel dim of [B, C, T] (parameters `gamma`, `beta`)."""

    def __init__(self, channels: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, C, T]
        y = F.layer_norm(x.transpose(1, -1), (x.shape[1],), self.gamma, self.beta, self.eps)
        return y.transpose(1, -1)


class MultiHeadAttention(nn.Module):
    """Conv1d-projected attention; with `window` set, relative position terms as in VITS.

    Relative keys/values cover offsets -window..window (shared over heads); farther pairs
    get no relative term, which is what upstream's pad-and-slice construction yields.
    """

    def __init__(self, channels: int, out_channels: int, n_heads: int, window: int | None = None):
        super().__init__()
        assert channels % n_heads == 0
        self.n_heads, self.window = n_heads, window
        self.head_dim = channels // n_heads
        self.conv_q = nn.Conv1d(channels, channels, 1)
        self.conv_k = nn.Conv1d(channels, channels, 1)
        self.conv_v = nn.Conv1d(channels, channels, 1)
        self.conv_o = nn.Conv1d(channels, out_channels, 1)
        if window is not None:
            # upstream's randn * head_dim**-0.5, drawn in place (the same values) so the meta build skips it
            self.emb_rel_k = nn.Parameter(torch.empty(1, 2 * window + 1, self.head_dim))
            self.emb_rel_v = nn.Parameter(torch.empty(1, 2 * window + 1, self.head_dim))
            nn.init.normal_(self.emb_rel_k, std=self.head_dim**-0.5)
            nn.init.normal_(self.emb_rel_v, std=self.head_dim**-0.5)

    def forward(self, x: torch.Tensor, c: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        # x: [B, C, Tq] queries, c: [B, C, Tk] keys/values, mask: [B, 1, Tq, Tk] (1 = attend)
        b, _, t_q = x.shape
        t_k = c.shape[2]
        q = self.conv_q(x).view(b, self.n_heads, self.head_dim, t_q).transpose(2, 3)
        k = self.conv_k(c).view(b, self.n_heads, self.head_dim, t_k).transpose(2, 3)
        v = self.conv_v(c).view(b, self.n_heads, self.head_dim, t_k).transpose(2, 3)
        q = q / math.sqrt(self.head_dim)
        scores = q @ k.transpose(-2, -1)  # [B, H, Tq, Tk]
        if self.window is not None:
            band, valid = self._band_index(t_q, x.device)
            rel = q @ self.emb_rel_k[0].transpose(0, 1)  # [B, H, Tq, 2w+1]
            scores = scores + _scatter_band(rel, band, valid, t_k)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -1e4)
        p = F.softmax(scores, dim=-1)
        out = p @ v
        if self.window is not None:
            p_band = torch.gather(p, -1, band.expand(b, self.n_heads, -1, -1)) * valid
            out = out + p_band @ self.emb_rel_v[0]
        out = out.transpose(2, 3).reshape(b, -1, t_q)
        return self.conv_o(out)

    def _band_index(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        # band[i, r] = key index i + r - w for offset slot r; valid where it falls inside [0, T)
        w = self.window
        pos = (
            torch.arange(length, device=device)[:, None] + torch.arange(2 * w + 1, device=device)[None, :] - w
        )
        valid = (pos >= 0) & (pos < length)
        return pos.clamp(0, length - 1)[None, None], valid[None, None].to(self.emb_rel_k.dtype)


def _scatter_band(rel: torch.Tensor, band: torch.Tensor, valid: torch.Tensor, t_k: int) -> torch.Tensor:
    # rel: [B, H, T, 2w+1] offset logits -> [B, H, T, Tk] with zeros outside the band
    out = rel.new_zeros(*rel.shape[:-1], t_k)
    return out.scatter_add(-1, band.expand(rel.shape[0], rel.shape[1], -1, -1), rel * valid)


class FFN(nn.Module):
    """Two same-padded convolutions with ReLU, masked before each."""

    def __init__(self, channels: int, filter_channels: int, kernel_size: int):
        super().__init__()
        self.kernel_size = kernel_size
        self.conv_1 = nn.Conv1d(channels, filter_channels, kernel_size)
        self.conv_2 = nn.Conv1d(filter_channels, channels, kernel_size)

    def _pad(self, x: torch.Tensor) -> torch.Tensor:
        k = self.kernel_size
        return x if k == 1 else F.pad(x, ((k - 1) // 2, k // 2))

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor) -> torch.Tensor:
        # x: [B, C, T], x_mask: [B, 1, T]
        x = torch.relu(self.conv_1(self._pad(x * x_mask)))
        return self.conv_2(self._pad(x * x_mask)) * x_mask


class TransformerEncoder(nn.Module):
    """Post-norm self-attention encoder with relative positions (upstream attentions.Encoder)."""

    def __init__(self, channels: int, filter_channels: int, n_heads: int, n_layers: int, kernel_size: int):
        super().__init__()
        self.attn_layers = nn.ModuleList(
            MultiHeadAttention(channels, channels, n_heads, window=REL_WINDOW) for _ in range(n_layers)
        )
        self.norm_layers_1 = nn.ModuleList(ChannelLayerNorm(channels) for _ in range(n_layers))
        self.ffn_layers = nn.ModuleList(FFN(channels, filter_channels, kernel_size) for _ in range(n_layers))
        self.norm_layers_2 = nn.ModuleList(ChannelLayerNorm(channels) for _ in range(n_layers))

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor) -> torch.Tensor:
        # x: [B, C, T], x_mask: [B, 1, T]
        attn_mask = x_mask.unsqueeze(2) * x_mask.unsqueeze(-1)
        x = x * x_mask
        for attn, norm1, ffn, norm2 in zip(
            self.attn_layers, self.norm_layers_1, self.ffn_layers, self.norm_layers_2
        ):
            x = norm1(x + attn(x, x, attn_mask))
            x = norm2(x + ffn(x, x_mask))
        return x * x_mask


class WN(nn.Module):
    """WaveNet-style gated dilated convolutions with a global condition (weight-normed in files)."""

    def __init__(self, channels: int, kernel_size: int, dilation_rate: int, n_layers: int, gin_channels: int):
        super().__init__()
        self.channels = channels
        self.cond_layer = WeightNormConv1d(gin_channels, 2 * channels * n_layers, 1)
        self.in_layers = nn.ModuleList()
        self.res_skip_layers = nn.ModuleList()
        for i in range(n_layers):
            dilation = dilation_rate**i
            pad = (kernel_size * dilation - dilation) // 2
            self.in_layers.append(
                WeightNormConv1d(channels, 2 * channels, kernel_size, dilation=dilation, padding=pad)
            )
            out = 2 * channels if i < n_layers - 1 else channels  # the last layer has no residual half
            self.res_skip_layers.append(WeightNormConv1d(channels, out, 1))

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        # x: [B, C, T], x_mask: [B, 1, T], g: [B, gin, 1]
        c = self.channels
        output = torch.zeros_like(x)
        g = self.cond_layer(g)
        n_layers = len(self.in_layers)
        for i, (in_layer, res_skip) in enumerate(zip(self.in_layers, self.res_skip_layers)):
            h = in_layer(x) + g[:, 2 * c * i : 2 * c * (i + 1)]
            acts = torch.tanh(h[:, :c]) * torch.sigmoid(h[:, c:])
            rs = res_skip(acts)
            if i < n_layers - 1:
                x = (x + rs[:, :c]) * x_mask
                output = output + rs[:, c:]
            else:
                output = output + rs
        return output * x_mask


class WNEncoder(nn.Module):
    """pre conv -> WN conditioned on the style vector -> proj (upstream models.Encoder)."""

    def __init__(self, channels: int, kernel_size: int, n_layers: int, gin_channels: int):
        super().__init__()
        self.pre = nn.Conv1d(channels, channels, 1)
        self.enc = WN(channels, kernel_size, 1, n_layers, gin_channels)
        self.proj = nn.Conv1d(channels, channels, 1)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        # x: [B, C, T], lengths: [B], g: [B, gin, 1] -> [B, C, T]
        x_mask = sequence_mask(lengths, x.shape[2]).unsqueeze(1).to(x.dtype)
        x = self.enc(self.pre(x) * x_mask, x_mask, g)
        return self.proj(x) * x_mask
