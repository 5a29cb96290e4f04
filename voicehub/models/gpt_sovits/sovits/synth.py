"""Eager reference path of v3's acoustic stage: semantic tokens -> normalised-then-restored mel.

Mirrors upstream's v3 inference (inference_webui.py `get_tts_wav`, TTS.py
`using_vocoder_synthesis`): the reference's own features and mel are the CFM prompt; the
target features are solved in chunks of at most T_CHUNK frames, each prompted by the previous
chunk's last frames, and the chunks are joined. One semantic token = 3.75 mel frames = 960
samples at 24 kHz (speed 1.0).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from voicehub.audio.mel import denorm_spec, norm_spec
from voicehub.models.gpt_sovits.cfm.solver import solve
from voicehub.models.gpt_sovits.sovits.model import SynthesizerV3

T_REF = 468  # most reference frames kept as prompt (v3)
T_CHUNK = 934  # prompt + generated frames per CFM call (v3)
SAMPLES_PER_TOKEN = 960  # 24 kHz samples per 25 Hz semantic token at speed 1.0


@dataclass
class ReferencePrompt:
    """What a voice's reference contributes to every request (compute once per voice)."""

    ge: torch.Tensor  # [1, gin, 1] style vector
    fea: torch.Tensor  # [1, inter2, T_min] reference condition features (last T_min frames)
    mel: torch.Tensor  # [1, mel, T_min] normalised reference mel, aligned with fea


@torch.no_grad()
def encode_reference(
    model: SynthesizerV3,
    ref_codes: torch.Tensor,
    ref_phones: torch.Tensor,
    ref_spec: torch.Tensor,
    ref_mel: torch.Tensor,
) -> ReferencePrompt:
    """Style, features and prompt mel of a reference.

    ref_codes: [1, 1, T] or [1, T] semantic tokens of the reference audio; ref_phones: [1, P];
    ref_spec: [1, 1025, Ts] linear spectrogram at 32 kHz (`voicehub.audio.mel.linear_spectrogram`
    with 2048 / 640 / 2048); ref_mel: [1, 100, Tm] log-mel at 24 kHz
    (`voicehub.audio.mel.MelSpectrogram(V3_MEL)`), not normalised. Everything in the model's dtype and device.
    """
    ge = model.style(ref_spec)
    fea = model.decode_encp(_as_codes(ref_codes), ref_phones, ge)
    mel = norm_spec(ref_mel)
    t_min = min(mel.shape[2], fea.shape[2])
    t_keep = min(t_min, T_REF)
    # Trim both to the common length, then keep the last T_REF frames at most.
    mel, fea = mel[:, :, :t_min][:, :, t_min - t_keep :], fea[:, :, :t_min][:, :, t_min - t_keep :]
    return ReferencePrompt(ge=ge, fea=fea, mel=mel.to(fea.dtype))


@torch.no_grad()
def decode_mel(
    model: SynthesizerV3,
    prompt: ReferencePrompt,
    codes: torch.Tensor,
    phones: torch.Tensor,
    sample_steps: int,
    speed: float = 1.0,
    generator: torch.Generator | None = None,
    solver: Callable[..., torch.Tensor] | None = None,
    encoder: Callable[..., torch.Tensor] | None = None,
) -> torch.Tensor:
    """Semantic tokens [1, 1, T] (or [1, T]) + phoneme ids [1, P] -> log-mel [1, 100, L].

    L = floor(3.75 * T) at speed 1.0. The CFM noise is drawn per chunk from `generator`
    (the global RNG when None), in the model's dtype, as upstream draws it. solver: what solves each
    chunk, with `cfm.solver.solve`'s signature (None: `solve` itself, at the chunk's own frame count,
    as upstream; the pipeline passes `solve_bucketed`, which equals it up to float rounding). encoder:
    what makes the CFM's condition features, called as encoder(model, codes, phones, ge, speed) (None:
    `model.decode_encp`, at the sentence's own shapes; the pipeline passes
    `encoder_graphs.decode_encp_bucketed`, which equals it up to float rounding).
    """
    if speed <= 0:
        raise ValueError(f"speed must be > 0, got {speed}")
    # decoders return tokens on the CPU (DecodeResult); the codebook lookup runs where the phones are
    codes = _as_codes(codes).to(phones.device)
    if encoder is None:
        fea_todo = model.decode_encp(codes, phones, prompt.ge, speed)
    else:
        fea_todo = encoder(model, codes, phones, prompt.ge, speed)
    fea_ref, mel_ref = prompt.fea, prompt.mel
    t_min = mel_ref.shape[2]
    if t_min == 0:
        raise ValueError("the reference prompt is empty; the reference audio must be 3-10 s long")
    chunk_len = T_CHUNK - t_min
    estimator = model.cfm.estimator
    solver = solve if solver is None else solver  # looked up per call: tests and profilers wrap it
    out = []
    for start in range(0, fea_todo.shape[2], chunk_len):
        chunk = fea_todo[:, :, start : start + chunk_len]
        mu = torch.cat([fea_ref, chunk], dim=2).transpose(1, 2)  # [1, N, inter2]
        noise = torch.randn(mu.shape[0], estimator.proj_out.out_features, mu.shape[1], generator=generator,
                            device=mu.device, dtype=mu.dtype)  # fmt: skip
        mel = solver(estimator, mu, mel_ref, noise, sample_steps)[:, :, mel_ref.shape[2] :]
        # The next chunk is prompted by this one's tail, as upstream does.
        mel_ref, fea_ref = mel[:, :, -t_min:], chunk[:, :, -t_min:]
        out.append(mel)
    return denorm_spec(torch.cat(out, dim=2))


def _as_codes(codes: torch.Tensor) -> torch.Tensor:
    # [T] / [1, T] / [n_q, 1, T] -> [n_q, 1, T]
    if codes.dim() == 1:
        return codes[None, None]
    if codes.dim() == 2:
        return codes[None]
    return codes
