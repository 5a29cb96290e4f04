"""SoVITS v3 encoders: semantic+phoneme encoder with MRTE, reference style encoder, codebook."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from voicehub.models.gpt_sovits.sovits.layers import MultiHeadAttention, TransformerEncoder, sequence_mask

MRTE_HEADS = 4  # fixed in upstream's MRTE(); not recoverable from tensor shapes
STYLE_HEADS = 2  # fixed in upstream's MelStyleEncoder(); not recoverable from tensor shapes
STYLE_KERNEL = 5


class MRTE(nn.Module):
    """Multi-reference timbre encoder: content attends to the phonemes, plus the style vector."""

    def __init__(self, channels: int, hidden: int):
        super().__init__()
        self.cross_attention = MultiHeadAttention(hidden, hidden, MRTE_HEADS)
        self.c_pre = nn.Conv1d(channels, hidden, 1)
        self.text_pre = nn.Conv1d(channels, hidden, 1)
        self.c_post = nn.Conv1d(hidden, channels, 1)

    def forward(self, ssl, ssl_mask, text, text_mask, ge):
        # ssl: [B, C, Ts], ssl_mask: [B, 1, Ts], text: [B, C, Tt], text_mask: [B, 1, Tt], ge: [B, hidden, 1]
        attn_mask = text_mask.unsqueeze(2) * ssl_mask.unsqueeze(-1)
        ssl = self.c_pre(ssl * ssl_mask)
        text = self.text_pre(text * text_mask)
        x = self.cross_attention(ssl * ssl_mask, text * text_mask, attn_mask) + ssl + ge
        return self.c_post(x * ssl_mask)


class TextEncoderV3(nn.Module):
    """`enc_p`: semantic features and phonemes -> content features [B, hidden, T] at 50 Hz."""

    def __init__(
        self, ssl_dim, hidden, filter_channels, n_heads, n_layers, kernel_size, n_symbols, mrte_hidden, inter
    ):
        super().__init__()
        self.ssl_proj = nn.Conv1d(ssl_dim, hidden, 1)
        self.encoder_ssl = TransformerEncoder(hidden, filter_channels, n_heads, n_layers // 2, kernel_size)
        self.encoder_text = TransformerEncoder(hidden, filter_channels, n_heads, n_layers, kernel_size)
        self.text_embedding = nn.Embedding(n_symbols, hidden)
        self.mrte = MRTE(hidden, mrte_hidden)
        self.encoder2 = TransformerEncoder(hidden, filter_channels, n_heads, n_layers // 2, kernel_size)
        # proj gives the VITS prior (m, logs); v3 inference never uses it, but files hold it.
        self.proj = nn.Conv1d(hidden, inter * 2, 1)

    def forward(self, y, y_lengths, text, text_lengths, ge, speed: float = 1.0) -> torch.Tensor:
        # y: [B, ssl_dim, T] 50 Hz features, text: [B, P] phoneme ids, ge: [B, mrte_hidden, 1]
        y_mask = sequence_mask(y_lengths, y.shape[2]).unsqueeze(1).to(y.dtype)
        y = self.ssl_proj(y * y_mask) * y_mask
        y = self.encoder_ssl(y * y_mask, y_mask)
        text_mask = sequence_mask(text_lengths, text.shape[1]).unsqueeze(1).to(y.dtype)
        t = self.text_embedding(text).transpose(1, 2)
        t = self.encoder_text(t * text_mask, text_mask)
        y = self.mrte(y, y_mask, t, text_mask, ge)
        y = self.encoder2(y * y_mask, y_mask)
        if speed != 1:
            # Speed changes duration here, on 50 Hz content, exactly as upstream's TextEncoder.
            y = F.interpolate(y, size=int(y.shape[-1] / speed) + 1, mode="linear")
        return y


class LinearNorm(nn.Module):
    """A Linear kept under `.fc` to match upstream's names."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class Conv1dGLU(nn.Module):
    """Residual gated conv; the conv sits under `.conv1.conv` as in upstream."""

    def __init__(self, channels: int, kernel_size: int):
        super().__init__()
        self.conv1 = nn.Module()
        self.conv1.conv = nn.Conv1d(channels, 2 * channels, kernel_size, padding=(kernel_size - 1) // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, C, T]
        a, b = self.conv1.conv(x).chunk(2, dim=1)
        return x + a * torch.sigmoid(b)


class StyleAttention(nn.Module):
    """Self-attention of MelStyleEncoder; scaled by sqrt(model width) as upstream does."""

    def __init__(self, dim: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.w_qs = nn.Linear(dim, dim)
        self.w_ks = nn.Linear(dim, dim)
        self.w_vs = nn.Linear(dim, dim)
        self.fc = nn.Linear(dim, dim)
        self.temperature = dim**0.5

    def forward(self, x: torch.Tensor, pad: torch.Tensor | None) -> torch.Tensor:
        # x: [B, T, D], pad: [B, T] True at padding
        b, t, d = x.shape
        h = self.n_heads
        q, k, v = (w(x).view(b, t, h, d // h).transpose(1, 2) for w in (self.w_qs, self.w_ks, self.w_vs))
        scores = (q @ k.transpose(-2, -1)) / self.temperature  # [B, H, T, T]
        if pad is not None:
            scores = scores.masked_fill(pad[:, None, None, :], float("-inf"))
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        return self.fc(out) + x


class MelStyleEncoder(nn.Module):
    """`ref_enc`: reference spectrogram [B, n_in, T] -> style vector [B, out_dim, 1]."""

    def __init__(self, n_in: int, hidden: int, out_dim: int):
        super().__init__()
        self.spectral = nn.Sequential(
            LinearNorm(n_in, hidden),
            nn.Mish(),
            nn.Identity(),
            LinearNorm(hidden, hidden),
            nn.Mish(),
            nn.Identity(),
        )
        self.temporal = nn.Sequential(Conv1dGLU(hidden, STYLE_KERNEL), Conv1dGLU(hidden, STYLE_KERNEL))
        self.slf_attn = StyleAttention(hidden, STYLE_HEADS)
        self.fc = LinearNorm(hidden, out_dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        # x: [B, n_in, T], mask: [B, 1, T] (1 = frame)
        pad = None if mask is None else (mask.int() == 0).squeeze(1)
        x = self.spectral(x.transpose(1, 2))
        x = self.temporal(x.transpose(1, 2)).transpose(1, 2)
        if pad is not None:
            x = x.masked_fill(pad.unsqueeze(-1), 0)
        x = self.fc(self.slf_attn(x, pad))
        if pad is None:
            return x.mean(dim=1).unsqueeze(-1)
        # Masked mean in float32, as upstream's temporal_avg_pool.
        n = (~pad).sum(dim=1)[:, None, None]
        w = (x.masked_fill(pad.unsqueeze(-1), 0).float() / n).sum(dim=1).to(x.dtype)
        return w.unsqueeze(-1)


class Codebook(nn.Module):
    """One k-means codebook; the EMA training buffers are kept because the files hold them."""

    def __init__(self, n_bins: int, dim: int):
        super().__init__()
        self.register_buffer("inited", torch.ones(1))
        self.register_buffer("cluster_size", torch.zeros(n_bins))
        self.register_buffer("embed", torch.empty(n_bins, dim).normal_())  # randn, skipped on meta
        self.register_buffer("embed_avg", torch.zeros(n_bins, dim))


class VQLayer(nn.Module):
    def __init__(self, n_bins: int, dim: int):
        super().__init__()
        self._codebook = Codebook(n_bins, dim)


class _VQStack(nn.Module):
    def __init__(self, n_q: int, n_bins: int, dim: int):
        super().__init__()
        self.layers = nn.ModuleList(VQLayer(n_bins, dim) for _ in range(n_q))


class ResidualQuantizer(nn.Module):
    """`quantizer`: semantic tokens <-> SSL-space features (residual VQ, one level in v3)."""

    def __init__(self, n_bins: int, dim: int, n_q: int = 1):
        super().__init__()
        self.vq = _VQStack(n_q, n_bins, dim)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        # codes: [n_q, B, T] -> [B, dim, T]
        out = 0
        for level, layer in zip(codes, self.vq.layers):
            out = out + F.embedding(level, layer._codebook.embed).transpose(1, 2)
        return out

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, dim, T] -> codes [n_q, B, T] (nearest code by Euclidean distance, residual)
        codes = []
        residual = x.transpose(1, 2)
        for layer in self.vq.layers:
            embed = layer._codebook.embed
            dist = residual.pow(2).sum(-1, keepdim=True) - 2 * residual @ embed.t() + embed.pow(2).sum(-1)
            idx = dist.argmin(dim=-1)
            codes.append(idx)
            residual = residual - F.embedding(idx, embed)
        return torch.stack(codes)
