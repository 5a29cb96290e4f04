"""The VITS inference network (Kim et al. 2021) as Piper trains it: text encoder, duration
predictor, prior flow and HiFi-GAN decoder, with module names matching Piper's state dicts.

Synthesis is split in two so a stream can start early: `latent` (text -> z, cheap) and
`decode` (z -> audio, the bulk of the work, convolutional so it can run in windows).
"""

from __future__ import annotations

import torch
from torch import nn

from voicehub.models.vits.config import VitsArchitecture
from voicehub.models.vits.duration import DurationPredictor, StochasticDurationPredictor
from voicehub.models.vits.generator import Generator
from voicehub.models.vits.layers import ResidualCouplingBlock
from voicehub.models.vits.text_encoder import RelativeAttentionFn, TextEncoder


class VitsSynthesizer(nn.Module):
    """Phoneme ids -> latent frames -> waveform. Inference only (no posterior encoder)."""

    def __init__(self, arch: VitsArchitecture) -> None:
        super().__init__()
        self.arch = arch
        a = arch
        self.enc_p = TextEncoder(
            a.n_vocab,
            a.inter_channels,
            a.hidden_channels,
            a.filter_channels,
            a.n_heads,
            a.n_layers,
            a.kernel_size,
            a.window_size,
            a.heads_share,
        )
        if a.use_sdp:
            self.dp: nn.Module = StochasticDurationPredictor(
                a.hidden_channels,
                a.dp_filter_channels,
                a.dp_kernel_size,
                a.sdp_n_flows,
                a.sdp_num_bins,
                a.gin_channels,
            )
        else:
            self.dp = DurationPredictor(
                a.hidden_channels, a.dp_filter_channels, a.dp_kernel_size, a.gin_channels
            )
        self.flow = ResidualCouplingBlock(
            a.inter_channels,
            a.flow_hidden_channels,
            a.flow_kernel_size,
            a.flow_dilation_rate,
            a.flow_n_layers,
            a.flow_n_flows,
            a.gin_channels,
        )
        self.dec = Generator(
            a.inter_channels,
            a.resblock,
            a.resblock_kernel_sizes,
            a.resblock_dilation_sizes,
            a.upsample_rates,
            a.upsample_initial_channel,
            a.upsample_kernel_sizes,
            a.gin_channels,
        )
        if a.n_speakers > 1:
            self.emb_g = nn.Embedding(a.n_speakers, a.gin_channels)

    def set_attention(self, attend: RelativeAttentionFn) -> RelativeAttentionFn:
        """Route the text encoder's attention layers through `attend`; returns the previous function."""
        layers = self.enc_p.encoder.attn_layers
        previous = layers[0].attend
        for layer in layers:
            layer.attend = attend
        return previous

    def speaker(self, sid: torch.Tensor | None) -> torch.Tensor | None:
        """Speaker conditioning [B, G, 1] for a multi-speaker voice, else None. sid: [B] int64."""
        if self.arch.n_speakers <= 1:
            return None
        assert sid is not None, "a multi-speaker voice needs a speaker id"
        return self.emb_g(sid).unsqueeze(-1)

    def latent(
        self,
        ids: torch.Tensor,
        g: torch.Tensor | None,
        noise_scale: float,
        length_scale: float,
        noise_w: float,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Phoneme ids [1, T_text] -> latent z [1, C, T_frames] (one utterance; frames = hop-length steps)."""
        assert ids.shape[0] == 1, "one utterance at a time"
        mask = torch.ones(1, 1, ids.shape[1], device=ids.device, dtype=self.enc_p.emb.weight.dtype)
        x, m, logs = self.enc_p(ids, mask)
        logw = self.dp(x, mask, g, noise_w, generator)
        w_ceil = torch.ceil(torch.exp(logw) * mask * length_scale)  # [1, 1, T_text] frames per phoneme
        frames = w_ceil[0, 0].long()
        if int(frames.sum()) < 1:  # upstream clamps the length to at least one frame
            frames = frames.clone()
            frames[-1] = 1
        m = torch.repeat_interleave(m, frames, dim=2)  # [1, C, T_frames]
        logs = torch.repeat_interleave(logs, frames, dim=2)
        noise = torch.randn(m.shape, generator=generator, device=m.device, dtype=m.dtype)
        z_p = m + noise * torch.exp(logs) * noise_scale
        y_mask = torch.ones(1, 1, z_p.shape[2], device=z_p.device, dtype=z_p.dtype)
        return self.flow.reverse(z_p, y_mask, g)

    def decode(self, z: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        """Latent z [B, C, T] -> audio [B, T * hop] in [-1, 1]."""
        return self.dec(z, g)[:, 0]

    def forward(
        self,
        ids: torch.Tensor,
        scales: tuple[float, float, float],
        sid: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Piper's ONNX signature: ids [1, T], scales (noise, length, noise_w) -> audio [1, n]."""
        g = self.speaker(sid)
        noise_scale, length_scale, noise_w = scales
        return self.decode(self.latent(ids, g, noise_scale, length_scale, noise_w, generator), g)
