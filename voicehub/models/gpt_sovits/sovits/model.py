"""SoVITS v3 (upstream `SynthesizerTrnV3`), inference only, with upstream's tensor names."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from voicehub.models.gpt_sovits.cfm.dit import CFM, DiT
from voicehub.models.gpt_sovits.sovits.config import SoVITSV3Arch
from voicehub.models.gpt_sovits.sovits.encoders import MelStyleEncoder, ResidualQuantizer, TextEncoderV3
from voicehub.models.gpt_sovits.sovits.layers import WNEncoder, sequence_mask

CONTENT_TO_MEL = 1.875  # 50 Hz content frames -> 93.75 Hz mel frames (24 kHz, hop 256)
MEL_LENGTH_FACTOR = 3.875  # upstream's (generous) mask length per semantic token for wns1


class SynthesizerV3(nn.Module):
    """Semantic tokens + phonemes + reference style -> CFM condition features [B, inter2, T_mel].

    The CFM (`self.cfm.estimator`) turns those features into a mel; see `cfm.solver.solve`.
    """

    def __init__(self, arch: SoVITSV3Arch):
        super().__init__()
        self.arch = arch
        a = arch
        self.enc_p = TextEncoderV3(
            a.ssl_dim, a.hidden_channels, a.filter_channels, a.n_heads, a.n_layers, a.kernel_size,
            a.n_symbols, a.mrte_hidden, a.inter_channels,
        )  # fmt: skip
        self.ref_enc = MelStyleEncoder(a.style_in, a.style_hidden, a.gin_channels)
        # 25 Hz semantic frames: ssl_proj halves the 50 Hz HuBERT rate (kernel 2, stride 2).
        self.ssl_proj = nn.Conv1d(a.ssl_dim, a.ssl_dim, 2, stride=2)
        self.quantizer = ResidualQuantizer(a.n_bins, a.ssl_dim, a.n_q)
        self.bridge = nn.Sequential(nn.Conv1d(a.inter_channels, a.inter2, 1), nn.LeakyReLU())
        self.wns1 = WNEncoder(a.inter2, a.wn_kernel, a.wn_layers, a.gin_channels)
        # linear_mel is a training-time auxiliary head; files hold it, inference never calls it.
        self.linear_mel = nn.Conv1d(a.inter2, a.mel_dim, 1)
        dit = DiT(
            a.dit_dim,
            a.dit_depth,
            a.dit_heads,
            a.dit_dim_head,
            a.dit_ff_mult,
            a.mel_dim,
            a.inter2,
            a.dit_conv_layers,
        )
        self.cfm = CFM(dit)

    def style(self, refer: torch.Tensor) -> torch.Tensor:
        """Reference linear spectrogram [B, 1025, T] (32 kHz, n_fft 2048, hop 640) -> style [B, gin, 1]."""
        lengths = torch.full((refer.shape[0],), refer.shape[2], device=refer.device)
        mask = sequence_mask(lengths, refer.shape[2]).unsqueeze(1).to(refer.dtype)
        return self.ref_enc(refer[:, : self.arch.style_in] * mask, mask)

    @torch.no_grad()
    def decode_encp(self, codes: torch.Tensor, text: torch.Tensor, ge: torch.Tensor, speed: float = 1.0):
        """Condition features for the CFM, as upstream's `decode_encp`.

        codes: [n_q, 1, T] semantic tokens (25 Hz); text: [1, P] phoneme ids; ge: [1, gin, 1] style.
        Returns [1, inter2, floor(1.875 * L)] with L = 2T at speed 1 (int(2T / speed) + 1 otherwise).
        """
        t_sem = codes.shape[2]
        y_lengths = torch.tensor([2 * t_sem], device=codes.device)
        if speed == 1:
            mel_len = int(t_sem * MEL_LENGTH_FACTOR)
        else:
            mel_len = int(t_sem * MEL_LENGTH_FACTOR / speed) + 1
        text_lengths = torch.tensor([text.shape[-1]], device=text.device)
        quantized = self.quantizer.decode(codes).to(ge.dtype)
        quantized = F.interpolate(quantized, scale_factor=2, mode="nearest")  # 25 Hz -> 50 Hz
        x = self.enc_p(quantized, y_lengths, text, text_lengths, ge, speed)
        fea = F.interpolate(self.bridge(x), scale_factor=CONTENT_TO_MEL, mode="nearest")
        return self.wns1(fea, torch.tensor([mel_len], device=codes.device), ge)

    @torch.no_grad()
    def extract_latent(self, ssl: torch.Tensor) -> torch.Tensor:
        """HuBERT features [B, ssl_dim, T] (50 Hz) -> semantic tokens [n_q, B, T // 2]."""
        return self.quantizer.encode(self.ssl_proj(ssl))
