"""Sub-sentence streaming of GPT-SoVITS v3 (issue 4): token windows -> CFM mel chunks -> vocoder chunks.

The chain, per sentence:
1. T2S tokens arrive while the sentence decodes, and leave in windows (`window_ends`: the first of
   `stream_chunk_tokens`, each later one twice the one before, up to MAX_WINDOW_TOKENS): from the
   static/graph decoder's `decode_iter` (a batch per stop check) or from `decode_steps` (the eager
   reference decode driven step by step); both give their whole-sentence decode's tokens, and the
   windows end at the same token counts however the tokens are batched;
2. SoVITS `decode_encp` runs on the token prefix so far (earlier tokens are the acoustic context the
   bidirectional encoder needs) and the new window's feature frames are kept;
3. the CFM solves those frames prompted by the full reference (mel + features, every chunk) followed by
   the last `CFM_CONTEXT_FRAMES` frames made so far, so consecutive chunks continue each other;
4. `VocoderStream` vocodes each mel chunk with left context and a short lookahead, and joins the
   vocoder outputs with a linear cross-fade (`StreamJoiner`): the result is within 30 dB of one-shot
   vocoding of the whole mel and has exactly its length.
Differences from the per-sentence path, on purpose: the encoder sees no tokens right of a window, the CFM
noise is drawn per window, and there is no whole-sentence peak normalisation (BigVGAN's output is already
in [-1, 1]). The utterance length is the per-sentence path's, sample for sample.

On CUDA with a capturing graph preset, the SoVITS encoder, the CFM pieces and the vocoder windows replay
from CUDA graphs (`acoustic_graphs.AcousticGraphs`, passed as `graphs`): the same windows, the same noise
draws, the encoder on right-padded masked tokens and phonemes, the CFM on a right-padded masked piece,
and a sentence's last vocoder window (any length) on masked window graphs (each equal up to float
rounding).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import torch

from voicehub.audio.fades import FadeShape, StreamJoiner
from voicehub.audio.mel import denorm_spec
from voicehub.models.gpt_sovits.bigvgan import BigVGAN, vocode
from voicehub.models.gpt_sovits.cfm.solver import solve
from voicehub.models.gpt_sovits.sovits import ReferencePrompt, SynthesizerV3
from voicehub.models.gpt_sovits.sovits.synth import T_CHUNK
from voicehub.models.gpt_sovits.t2s.config import EOS_BLOCKED_STEPS, MAX_DECODE_STEPS
from voicehub.models.gpt_sovits.t2s.decode import (
    T2SSamplingParams,
    _step_layers,
    encode_prompt,
    make_generator,
    race_noise,
    reference_probs,
)
from voicehub.models.gpt_sovits.t2s.model import T2SModel
from voicehub.runtime.eager_conv import without_cudnn

if TYPE_CHECKING:
    from voicehub.models.gpt_sovits.acoustic_graphs import AcousticGraphs

CFM_CONTEXT_FRAMES = 32  # mel frames of earlier output that prompt each CFM chunk after the reference
VOCODER_LEFT_FRAMES = 24  # mel frames vocoded left of a chunk and dropped (the convolutions' warm-up)
VOCODER_LOOKAHEAD_FRAMES = 8  # newest frames held back until more mel arrives (the right receptive field)
VOCODER_OVERLAP_FRAMES = 4  # frames cross-faded between consecutive vocoder outputs
MIN_FIRST_S = 0.25  # the first chunk of a sentence carries at least this much audio (unless it is all)
MAX_WINDOW_TOKENS = 100  # a sentence's later windows double up to this many tokens (4 s of audio at speed 1)

# `cfm.solver.solve`'s signature: (estimator, mu [1, N, inter2], prompt mel [1, mel, P], noise [1, mel, N],
# n_steps) -> [1, mel, N]; and `bigvgan.vocode`'s: (vocoder, mel [1, num_mels, n]) -> audio [1, n * hop].
Solver = Callable[..., torch.Tensor]
Vocode = Callable[[BigVGAN, torch.Tensor], torch.Tensor]


class VocoderStream:
    """Mel chunks in, final audio out: each call vocodes the new frames with left context and lookahead.

    push(mel [1, num_mels, n] denormalised, is_last) returns float32 samples that are final (with
    is_last, everything left). Joined output has exactly n_frames * hop samples, like `vocode` of the whole mel.
    vocode_window: what vocodes each window, of any length (`vocode`, or `AcousticGraphs.vocode_mel`:
    masked window graphs of a few shapes, one bucket for every window of the common chunk sizes).
    """

    def __init__(
        self,
        vocoder: BigVGAN,
        left: int = VOCODER_LEFT_FRAMES,
        lookahead: int = VOCODER_LOOKAHEAD_FRAMES,
        overlap: int = VOCODER_OVERLAP_FRAMES,
        min_first_s: float = MIN_FIRST_S,
        vocode_window: Vocode = vocode,
    ):
        if min(left, lookahead, overlap) < 0:
            raise ValueError("left, lookahead and overlap must be >= 0 frames")
        self.vocoder, self.left, self.lookahead, self.overlap = vocoder, left, lookahead, overlap
        self.vocode_window = vocode_window
        self.hop = vocoder.conf.hop_size
        self.min_first = int(np.ceil(min_first_s * vocoder.conf.sampling_rate / self.hop))
        self.joiner = StreamJoiner(overlap * self.hop, FadeShape.LINEAR)  # same signal on both sides
        self._mel: torch.Tensor | None = None  # [1, num_mels, frames] everything received
        self._done = 0  # frames whose audio was handed to the joiner
        self.n_calls = 0  # vocoder calls so far (tests count them)

    def push(self, mel: torch.Tensor, is_last: bool = False) -> np.ndarray:
        # mel: [1, num_mels, n]
        self._mel = mel if self._mel is None else torch.cat([self._mel, mel], dim=2)
        if is_last and self._done == 0:  # everything in one call: no join (and it may be under one overlap)
            self._done = self._mel.shape[2]
            self.n_calls += 1
            return self.vocode_window(self.vocoder, self._mel)[0].float().cpu().numpy()
        if is_last:
            ready = (
                self._emit(self._mel.shape[2]) if self._mel.shape[2] > self._done else np.zeros(0, np.float32)
            )
            return np.concatenate([ready, self.joiner.finish()])
        end = self._mel.shape[2] - self.lookahead
        if end - self._done < max(self.overlap + 1, self.min_first if self._done == 0 else 1):
            return np.zeros(0, np.float32)  # too little for a join, or for the first chunk
        return self._emit(end)

    def _emit(self, end: int) -> np.ndarray:
        # Frames [start, end) are emitted; start reaches `overlap` frames back to cross-fade the last output.
        start = max(self._done - self.overlap, 0)
        lo, hi = max(start - self.left, 0), min(end + self.lookahead, self._mel.shape[2])
        audio = self.vocode_window(self.vocoder, self._mel[:, :, lo:hi])[0].float()  # [(hi - lo) * hop]
        self.n_calls += 1
        piece = audio[(start - lo) * self.hop : (end - lo) * self.hop].cpu().numpy()
        self._done = end
        return self.joiner.push(piece)


class CfmStream:
    """Feature frames in, normalised mel frames out: each chunk is solved with the full reference prompt
    followed by the last `context` frames already made (features and mel), as one CFM call per piece.
    solver: `solve`, or a graph replay of it (the noise is drawn here either way, from `generator`)."""

    def __init__(
        self,
        model: SynthesizerV3,
        prompt: ReferencePrompt,
        sample_steps: int,
        generator: torch.Generator,
        context: int = CFM_CONTEXT_FRAMES,
        solver: Solver = solve,
    ):
        self.model, self.prompt, self.sample_steps, self.generator = model, prompt, sample_steps, generator
        self.context, self.solver = context, solver
        self.n_calls = 0
        self._fea = prompt.fea[:, :, :0]  # [1, inter2, <= context] features of the latest output frames
        self._mel = prompt.mel[:, :, :0]  # [1, mel, <= context] their normalised mel

    def push(self, fea: torch.Tensor) -> torch.Tensor:
        """fea: [1, inter2, n] new condition frames -> denormalised mel [1, mel, n]."""
        estimator = self.model.cfm.estimator
        out = []
        while fea.shape[2]:
            fea_ref = torch.cat([self.prompt.fea, self._fea], dim=2)
            mel_ref = torch.cat([self.prompt.mel, self._mel], dim=2)
            piece, fea = fea[:, :, : T_CHUNK - fea_ref.shape[2]], fea[:, :, T_CHUNK - fea_ref.shape[2] :]
            mu = torch.cat([fea_ref, piece], dim=2).transpose(1, 2)  # [1, N, inter2]
            noise = torch.randn(1, estimator.proj_out.out_features, mu.shape[1], generator=self.generator,
                                device=mu.device, dtype=mu.dtype)  # fmt: skip
            mel = self.solver(estimator, mu, mel_ref, noise, self.sample_steps)[:, :, mel_ref.shape[2] :]
            self.n_calls += 1
            self._fea = (
                torch.cat([self._fea, piece], dim=2)[:, :, -self.context :] if self.context else self._fea
            )
            self._mel = (
                torch.cat([self._mel, mel], dim=2)[:, :, -self.context :] if self.context else self._mel
            )
            out.append(mel)
        return denorm_spec(torch.cat(out, dim=2))


def window_ends(first: int, largest: int = MAX_WINDOW_TOKENS) -> Iterator[int]:
    """Token counts at which a streamed sentence's windows end, without end: the first window is `first`
    tokens (the first audio waits for it), each later one twice the one before, up to max(first, largest)
    (25: 25, 75, 175, 275, ...). Every CFM piece is prompted by the whole reference (~470 frames) and
    every vocoder window carries ~36 frames of context, so at 25 tokens (~80 new frames) a window solves
    ~7x its new frames; once audio is buffered, longer windows cut that work per second of audio (100
    tokens: ~2.7x) while the next window still arrives long before the audio runs dry (T2S decodes a
    stream several times faster than real time)."""
    if first < 1:
        raise ValueError(f"a window must be >= 1 tokens, got {first}")
    end, size = 0, first
    while True:
        end += size
        yield end
        size = min(2 * size, max(first, largest))


def stepwise_windows(batches: Iterable[torch.Tensor], first: int) -> Iterator[tuple[torch.Tensor, bool]]:
    """(token prefix, is_final) at every end of `window_ends(first)`, as tokens arrive in batches [n] (one
    per decode step, or one per stop check), and once at the end with every token."""
    prefix, ends = None, window_ends(first)
    n_next = next(ends)
    for batch in batches:
        prefix = batch if prefix is None else torch.cat([prefix, batch])
        while prefix.shape[0] >= n_next:
            yield prefix[:n_next], False
            n_next = next(ends)
    assert prefix is not None and prefix.shape[0], (
        "a decode draws at least one token (EOS is blocked at first)"
    )
    yield prefix, True


@torch.inference_mode()
def decode_steps(
    model: T2SModel,
    phone_ids: torch.Tensor,
    bert: torch.Tensor,
    prompt: torch.Tensor,
    params: T2SSamplingParams,
) -> Iterator[torch.Tensor]:
    """The eager reference decode (`t2s.decode.decode`) as a generator of tokens [1] long, one per step.

    Same sampling order, RNG stream and stops, so the same tokens, with one exception: where decoding
    ends on the cap (no EOS within max_new_tokens) upstream's callers drop the *first* token afterwards
    (`y[-idx:]`); a stream has already spoken it, so it keeps it (the sentence is one token longer).
    phone_ids: [Tx] long; bert: [1024, Tx]; prompt: [Ty] long semantic tokens, on the model's device.
    """
    cfg = model.config
    logits, keys, values = encode_prompt(model, phone_ids, bert, prompt)
    gen = make_generator(params.seed, phone_ids.device)
    cap, forced = params.max_new_tokens or cfg.early_stop_num, params.force_n_tokens
    history = prompt[None]
    for idx in range(forced or MAX_DECODE_STEPS):
        if forced is not None or idx < EOS_BLOCKED_STEPS:
            logits = logits[:, : cfg.eos]  # as decode(): EOS sliced off
        probs, penalized = reference_probs(logits, history, params)
        token = torch.argmax(probs / race_noise(probs, gen), dim=-1)  # [1]
        if forced is None and bool(token[0] == cfg.eos or penalized.argmax(-1)[0] == cfg.eos):
            return
        yield token
        history = torch.cat([history, token[:, None]], dim=1)
        n_generated = idx + 1
        if (
            n_generated >= forced
            if forced is not None
            else (n_generated > cap or idx == MAX_DECODE_STEPS - 1)
        ):
            return
        x = model.embed_audio_at(token, torch.full_like(token, prompt.shape[0] + idx))
        logits = model.logits(_step_layers(model, x, keys, values)[:, -1])


@torch.inference_mode()
def stream_windows(
    model: SynthesizerV3,
    vocoder: BigVGAN,
    prompt: ReferencePrompt,
    windows: Iterable[tuple[torch.Tensor, bool]],
    phones: torch.Tensor,
    sample_steps: int,
    speed: float,
    generator: torch.Generator,
    graphs: AcousticGraphs | None = None,
) -> Iterator[tuple[np.ndarray, bool]]:
    """Token windows (prefix so far [n], is_final) + phoneme ids [1, P] -> (float32 audio at 24 kHz, is_final).

    Lazy: each piece is yielded as soon as its window is through the chain (empty pieces are skipped,
    but the final one is always yielded). The pieces' total length is the per-sentence path's
    (`decode_mel` + `vocode` of the final prefix). graphs: the encoder, CFM and vocoder replay from its
    CUDA graphs (None: eager calls).
    """
    # Looked up per call (not bound as defaults), so a profiler can wrap the module's solve / vocode (or
    # the graphs' encode / solve / vocode, or the model's decode_encp).
    # The eager encoder runs without cuDNN (`without_cudnn`): every window is a new shape, and cuDNN would
    # plan each (the DiT and BigVGAN keep cuDNN: ATen's convolutions are slower there, conv_plan_probe).
    if graphs is None:
        solver, vocode_window, encode = solve, vocode, without_cudnn(model.decode_encp)
    else:
        solver, vocode_window, encode = graphs.solve, graphs.vocode_mel, partial(graphs.encode, model)
    cfm = CfmStream(model, prompt, sample_steps, generator, solver=solver)
    voc = VocoderStream(vocoder, vocode_window=vocode_window)
    n_done = 0  # feature frames already solved
    for tokens, is_final in windows:
        fea = encode(tokens[None, None], phones, prompt.ge, speed)  # [1, inter2, L(n)]
        new, n_done = fea[:, :, n_done:], fea.shape[2]
        mel = cfm.push(new) if new.shape[2] else denorm_spec(prompt.mel[:, :, :0])
        audio = voc.push(mel, is_last=is_final)
        if len(audio) or is_final:
            yield audio, is_final
