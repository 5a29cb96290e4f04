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
        zero. Every encoder masks the padding out of valid frames; the speed resampling reads each
        row's own frames (`resample_rows`).
        """
        sizes = [encp_lengths(t, s) for t, s in zip(code_lengths, speeds)]
        as_tensor = partial(torch.tensor, device=codes.device)
        resampled = any(s != 1 for s in speeds)
        fea = self.decode_encp_masked(
            codes, as_tensor(list(code_lengths)), text, as_tensor(list(text_lengths)), ge,
            as_tensor([c for c, _, _ in sizes]) if resampled else None,
            max(c for c, _, _ in sizes) if resampled else 2 * codes.shape[2],
            as_tensor([m for _, _, m in sizes]),
        )  # fmt: skip
        return fea, [f for _, f, _ in sizes]

    @torch.no_grad()
    def decode_encp_masked(
        self,
        codes: torch.Tensor,
        code_lengths: torch.Tensor,
        text: torch.Tensor,
        text_lengths: torch.Tensor,
        ge: torch.Tensor,
        content_lengths: torch.Tensor | None,
        n_content: int,
        mask_lengths: torch.Tensor,
    ) -> torch.Tensor:
        """The padded encoder with every length a tensor: no host sync and no shape that depends on a
        value, so a CUDA graph can capture it for fixed (T, P, n_content) and replay it for any lengths.

        codes: [n_q, B, T], code_lengths: [B] tokens; text: [B, P], text_lengths: [B] phonemes;
        ge: [B, gin, 1]; content_lengths: [B] 50 Hz content frames after the speed resampling (None:
        every row at speed 1, no resampling, n_content == 2T); mask_lengths: [B] feature frames that
        wns1 keeps (`encp_lengths`). Returns [B, inter2, floor(1.875 * n_content)]; frames past a row's
        feature length are not zero.
        """
        quantized = self.quantizer.decode(codes).to(ge.dtype)
        quantized = F.interpolate(quantized, scale_factor=2, mode="nearest")  # 25 Hz -> 50 Hz
        y_lengths = 2 * code_lengths
        x = self.enc_p(quantized, y_lengths, text, text_lengths, ge)  # speed 1 here
        if content_lengths is not None:
            x = resample_rows(x, y_lengths, content_lengths, n_content)
        assert x.shape[2] == n_content, "n_content is 2T when no row is resampled"
        # the nearest index of a frame does not depend on the input length, so a row's frames are its own
        fea = F.interpolate(self.bridge(x), scale_factor=CONTENT_TO_MEL, mode="nearest")
        # wns1's mask alone is `mel_len` (past the features: no effect); padding is also masked here
        return self.wns1(fea, mask_lengths, ge)

    @torch.no_grad()
    def extract_latent(self, ssl: torch.Tensor) -> torch.Tensor:
        """HuBERT features [B, ssl_dim, T] (50 Hz) -> semantic tokens [n_q, B, T // 2]."""
        return self.quantizer.encode(self.ssl_proj(ssl))


def _mel_len(t_sem: int, speed: float) -> int:
    # the mask length of `decode_encp` for t_sem tokens
    if speed == 1:
        return int(t_sem * MEL_LENGTH_FACTOR)
    return int(t_sem * MEL_LENGTH_FACTOR / speed) + 1


def encp_lengths(n_tokens: int, speed: float) -> tuple[int, int, int]:
    """(content frames after the speed resampling, feature frames, wns1 mask frames) that `decode_encp`
    makes from n_tokens semantic tokens at `speed`: the host-side lengths of `decode_encp_masked`."""
    content = 2 * n_tokens if speed == 1 else int(2 * n_tokens / speed) + 1
    n_fea = math.floor(content * CONTENT_TO_MEL)
    return content, n_fea, min(_mel_len(n_tokens, speed), n_fea)


def resample_rows(
    x: torch.Tensor, in_lengths: torch.Tensor, out_lengths: torch.Tensor, n_out: int
) -> torch.Tensor:
    """x: [B, C, T] content, row b valid for in_lengths[b] -> [B, C, n_out]: row b resampled to
    out_lengths[b] frames as `F.interpolate(row, size=out_lengths[b], mode="linear")` of its own frames
    (upstream's speed change in TextEncoder), zeros past that.

    Tensor ops only, so padded rows and graph replays need no host-side lengths. The positions are
    PyTorch's: the scale in the kernel's precision (fp32, fp64 for fp64 input), source positions
    scale * (j + 0.5) - 0.5 rounded once (as the CPU kernel's double arithmetic and the CUDA kernel's
    fused multiply-add round them), the blend in that precision.
    """
    rows, channels, t_in = x.shape
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    scale = in_lengths.to(acc) / out_lengths.clamp(min=1).to(acc)  # [B]
    dst = torch.arange(n_out, device=x.device, dtype=torch.float64) + 0.5  # [n_out], exact
    src = (scale.double()[:, None] * dst - 0.5).to(acc).clamp(min=0)  # [B, n_out] align_corners=False
    i0 = src.long().clamp(max=t_in - 1)  # floor (src >= 0); positions past a row's end are masked
    i1 = torch.minimum(i0 + 1, (in_lengths[:, None] - 1).clamp(min=0))
    w1 = src - i0
    xa = x.to(acc)
    pick = lambda i: xa.gather(2, i[:, None, :].expand(rows, channels, n_out))  # noqa: E731
    out = pick(i0) * (1 - w1)[:, None] + pick(i1) * w1[:, None]
    keep = dst[None] < out_lengths[:, None]  # j + 0.5 < n: frames of the row
    return (out * keep[:, None]).to(x.dtype)
