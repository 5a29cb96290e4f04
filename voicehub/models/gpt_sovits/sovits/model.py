"""SoVITS v3 (upstream `SynthesizerTrnV3`), inference only, with upstream's tensor names."""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial

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
    def decode_encp_padded(
        self,
        codes: torch.Tensor,
        code_lengths: Sequence[int],
        text: torch.Tensor,
        text_lengths: Sequence[int],
        ge: torch.Tensor,
        speeds: Sequence[float],
    ) -> tuple[torch.Tensor, list[int]]:
        """`decode_encp` of B rows at once, right-padded; row i equals its call alone up to float rounding.

        codes: [n_q, B, T] semantic tokens, row i valid for code_lengths[i]; text: [B, P] phoneme ids,
        valid for text_lengths[i]; ge: [B, gin, 1]; speeds: B floats. Returns features [B, inter2, N]
        and each row's length (what `decode_encp` returns for it); frames past a row's length are not
        zero. Every encoder masks the padding out of valid frames; the speed resampling, whose
        positions depend on a row's own length, runs row by row.
        """
        y_lengths = [2 * t for t in code_lengths]
        quantized = self.quantizer.decode(codes).to(ge.dtype)
        quantized = F.interpolate(quantized, scale_factor=2, mode="nearest")  # 25 Hz -> 50 Hz
        as_tensor = partial(torch.tensor, device=codes.device)
        x = self.enc_p(quantized, as_tensor(y_lengths), text, as_tensor(text_lengths), ge)  # speed 1 here
        x, x_lengths = _resample_rows(x, y_lengths, speeds)
        fea = F.interpolate(self.bridge(x), scale_factor=CONTENT_TO_MEL, mode="nearest")
        # the nearest index of a frame does not depend on the input length, so a row's frames are its own
        fea_lengths = [math.floor(n * CONTENT_TO_MEL) for n in x_lengths]
        # wns1's mask alone is `mel_len` (past the features: no effect); padding is also masked here
        mask_lengths = [min(_mel_len(t, s), n) for t, s, n in zip(code_lengths, speeds, fea_lengths)]
        return self.wns1(fea, as_tensor(mask_lengths), ge), fea_lengths

    @torch.no_grad()
    def extract_latent(self, ssl: torch.Tensor) -> torch.Tensor:
        """HuBERT features [B, ssl_dim, T] (50 Hz) -> semantic tokens [n_q, B, T // 2]."""
        return self.quantizer.encode(self.ssl_proj(ssl))


def _mel_len(t_sem: int, speed: float) -> int:
    # the mask length of `decode_encp` for t_sem tokens
    if speed == 1:
        return int(t_sem * MEL_LENGTH_FACTOR)
    return int(t_sem * MEL_LENGTH_FACTOR / speed) + 1


def _resample_rows(
    x: torch.Tensor, lengths: list[int], speeds: Sequence[float]
) -> tuple[torch.Tensor, list[int]]:
    """x: [B, C, T] content, row i valid for lengths[i] -> each row at its speed, right-padded with zeros.

    As TextEncoderV3 at speed != 1, on the row's own frames: linear resampling positions depend on
    the input and output lengths, so a padded row resampled in the batch would not equal its solo call.
    """
    if all(s == 1 for s in speeds):
        return x, lengths
    new_lengths = [n if s == 1 else int(n / s) + 1 for n, s in zip(lengths, speeds)]
    out = x.new_zeros(x.shape[0], x.shape[1], max(new_lengths))
    for i, (n, s, m) in enumerate(zip(lengths, speeds, new_lengths)):
        row = x[i : i + 1, :, :n]
        out[i, :, :m] = row[0] if s == 1 else F.interpolate(row, size=m, mode="linear")[0]
    return out, new_lengths
