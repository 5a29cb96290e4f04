"""The acoustic stage of many GPT-SoVITS v3 streams at once: CFM pieces and vocoder windows, batched.

Per stream, `CfmRows` and `VocoderRows` keep the state of streaming.py's `CfmStream` and
`VocoderStream` (same constants, same chunking, same order of noise draws) with each model call taken
out: they say what to compute (`next_piece`, `push`) and take the result back (`absorb`), so the
serving engine can run the calls of many streams together:
- `encode_rows` runs the SoVITS encoder (`decode_encp`) of many streams' windows as one right-padded,
  masked call (`SynthesizerV3.decode_encp_padded`): token and phoneme counts, speeds and styles differ;
  with the engine's `EncoderRowGraphs`, the rows of each speed replay (row bucket, tokens, phonemes,
  speed) graphs instead (encoder_graphs.py).
- `solve_pieces` solves CFM pieces of different lengths as one right-padded batch. The DiT masks the
  padded frames (cfm/dit.py), so a row's frames are what it gets alone, up to float rounding.
- `vocode_windows` vocodes windows of equal length as one batch. BigVGAN pads its borders by
  replication, so a frame-padded row would change near its end: only windows of one length share a call.
  `VocoderRows(bucket_frames=k)` makes lengths meet: a window grows to a multiple of k frames by
  taking more *left* context, already-final mel whose output is dropped (never padding); a window with
  no history to grow into (a sentence's first) ends earlier instead, at a multiple of k, when it still
  carries its minimum of new frames. With the model's acoustic graphs, the windows of one such length
  replay one (row bucket, length) graph, the rows padded with zeros (rows are convolved alone).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from voicehub.audio.fades import FadeShape, StreamJoiner
from voicehub.audio.mel import denorm_spec
from voicehub.models.gpt_sovits.acoustic_graphs import AcousticGraphs
from voicehub.models.gpt_sovits.bigvgan import BigVGAN, vocode
from voicehub.models.gpt_sovits.cfm.dit import DiT
from voicehub.models.gpt_sovits.cfm.solver import solve_padded
from voicehub.models.gpt_sovits.encoder_graphs import EncoderRowGraphs
from voicehub.models.gpt_sovits.sovits import ReferencePrompt, SynthesizerV3
from voicehub.models.gpt_sovits.sovits.synth import T_CHUNK
from voicehub.models.gpt_sovits.streaming import (
    CFM_CONTEXT_FRAMES,
    MIN_FIRST_S,
    VOCODER_LEFT_FRAMES,
    VOCODER_LOOKAHEAD_FRAMES,
    VOCODER_OVERLAP_FRAMES,
)
from voicehub.runtime.eager_conv import without_cudnn


@dataclass(eq=False)
class EncoderRow:
    """One row of a batched SoVITS encoder call: a window's token prefix and what conditions it."""

    owner: Any
    tokens: torch.Tensor  # [T] semantic tokens (25 Hz) of the sentence so far, T >= 1
    phones: torch.Tensor  # [P] phoneme ids of the sentence
    ge: torch.Tensor  # [1, gin, 1] the voice's style
    speed: float


@dataclass
class EncoderCalls:
    """What `encode_rows` ran: calls (replays and eager calls), rows replayed from graphs (and the zero
    rows that padded them to a row bucket), rows run eagerly by reason ('no_graphs': no encoder graphs,
    as on the CPU or preset off; see `EncoderRowGraphs.eager_reason` for the others)."""

    calls: int = 0
    replayed: int = 0
    padded_rows: int = 0
    eager: dict[str, int] = field(default_factory=dict)

    def count_eager(self, reason: str, n_rows: int) -> None:
        self.calls += 1
        self.eager[reason] = self.eager.get(reason, 0) + n_rows


@torch.inference_mode()
def encode_rows(
    sovits: SynthesizerV3, rows: Sequence[EncoderRow], graphs: EncoderRowGraphs | None = None
) -> tuple[list[torch.Tensor], EncoderCalls]:
    """Condition features of each row, [1, inter2, n], each `sovits.decode_encp` of the row alone up to
    float rounding, and what ran. Without graphs: one right-padded `decode_encp_padded` call (padded
    frames are masked; one row runs `decode_encp` itself, the exact single-stream call). graphs: the
    rows of each speed, longest prefix first, replay (row bucket, tokens, phonemes, speed) graphs, as
    many rows a replay as the graphs' rows x tokens bound allows; rows no graph serves run eagerly,
    and `EncoderCalls.eager` says why."""
    report = EncoderCalls()
    if graphs is None:
        report.count_eager("no_graphs", len(rows))
        return _encode_eager(sovits, rows), report
    assert graphs.model is sovits, "the graphs of this SoVITS model"
    graphs.check()
    out: list[torch.Tensor | None] = [None] * len(rows)
    by_speed: dict[float, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        by_speed[float(r.speed)].append(i)
    for speed, members in by_speed.items():
        members.sort(key=lambda i: -len(rows[i].tokens))  # rows of like lengths share a bucket
        too_long = [i for i in members if not graphs.is_in_range(len(rows[i].tokens), len(rows[i].phones))]
        if too_long:
            _put(out, too_long, _encode_eager(sovits, [rows[i] for i in too_long]))
            report.count_eager("too_long", len(too_long))
        members = [i for i in members if i not in too_long]
        lo, most = 0, graphs.row_buckets[-1]
        while lo < len(members):
            chunk = members[lo : lo + min(most, graphs.rows_per_call(len(rows[members[lo]].tokens)))]
            lo += len(chunk)
            n_phones = max(len(rows[i].phones) for i in chunk)
            key = graphs.key(len(chunk), len(rows[chunk[0]].tokens), n_phones, speed)
            reason = graphs.eager_reason(key)
            if reason is not None:
                _put(out, chunk, _encode_eager(sovits, [rows[i] for i in chunk]))
                report.count_eager(reason, len(chunk))
                continue
            inputs = [(rows[i].tokens, rows[i].phones, rows[i].ge) for i in chunk]
            _put(out, chunk, graphs.encode(inputs, speed))
            report.calls += 1
            report.replayed += len(chunk)
            report.padded_rows += key[0] - len(chunk)
    return out, report  # type: ignore[return-value]


def _put(out: list, indices: Sequence[int], values: Sequence[Any]) -> None:
    for i, value in zip(indices, values):
        out[i] = value


@without_cudnn  # shapes no graph holds: no cuDNN plans to build for each
def _encode_eager(sovits: SynthesizerV3, rows: Sequence[EncoderRow]) -> list[torch.Tensor]:
    # one right-padded, masked `decode_encp_padded` call; one row: `decode_encp` itself
    if len(rows) == 1:
        (r,) = rows
        return [sovits.decode_encp(r.tokens[None, None], r.phones[None], r.ge, r.speed)]
    first = rows[0].tokens
    codes = first.new_zeros(1, len(rows), max(len(r.tokens) for r in rows))  # [n_q = 1, B, T]
    text = first.new_zeros(len(rows), max(len(r.phones) for r in rows))
    for i, r in enumerate(rows):
        codes[0, i, : len(r.tokens)] = r.tokens
        text[i, : len(r.phones)] = r.phones
    ge = torch.cat([r.ge for r in rows])
    fea, lengths = sovits.decode_encp_padded(
        codes, [len(r.tokens) for r in rows], text, [len(r.phones) for r in rows], ge, [r.speed for r in rows]
    )
    return [fea[i : i + 1, :, :n] for i, n in enumerate(lengths)]


@dataclass(eq=False)
class CfmPiece:
    """One row of a CFM batch: the reference + context frames that prompt it, then the new frames."""

    owner: Any  # who absorbs the result (the engine's stream)
    mu: torch.Tensor  # [N, inter2] condition features: prompt frames, then the new ones
    prompt: torch.Tensor  # [mel, P] normalised prompt mel (P < N)
    noise: torch.Tensor  # [mel, N] standard normal, drawn from the stream's generator
    sample_steps: int

    @property
    def n_frames(self) -> int:
        return self.mu.shape[0]


class CfmRows:
    """`CfmStream` of one sentence, split: `add` condition frames, take `next_piece`, `absorb` its mel."""

    def __init__(
        self,
        prompt: ReferencePrompt,
        sample_steps: int,
        generator: torch.Generator,
        context: int = CFM_CONTEXT_FRAMES,
    ):
        self.prompt, self.sample_steps, self.generator, self.context = (
            prompt,
            sample_steps,
            generator,
            context,
        )
        self._todo = prompt.fea[:, :, :0]  # [1, inter2, n] frames not yet in a piece
        self._fea = prompt.fea[:, :, :0]  # [1, inter2, <= context] features of the latest output frames
        self._mel = prompt.mel[:, :, :0]  # [1, mel, <= context] their normalised mel
        self._piece: torch.Tensor | None = None  # the frames of the piece out for solving
        self.n_calls = 0

    @property
    def n_todo(self) -> int:
        return self._todo.shape[2]

    def add(self, fea: torch.Tensor) -> None:
        """fea: [1, inter2, n] new condition frames (from `decode_encp` of the token prefix)."""
        self._todo = torch.cat([self._todo, fea], dim=2)

    def next_piece(self, owner: Any, mel_dim: int) -> CfmPiece:
        """The next piece (as many todo frames as fit T_CHUNK after the prompt); its noise is drawn now."""
        assert self._piece is None and self.n_todo, "absorb the last piece first; add frames"
        fea_ref = torch.cat([self.prompt.fea, self._fea], dim=2)
        mel_ref = torch.cat([self.prompt.mel, self._mel], dim=2)
        room = T_CHUNK - fea_ref.shape[2]
        self._piece, self._todo = self._todo[:, :, :room], self._todo[:, :, room:]
        mu = torch.cat([fea_ref, self._piece], dim=2).transpose(1, 2)  # [1, N, inter2]
        noise = torch.randn(
            1, mel_dim, mu.shape[1], generator=self.generator, device=mu.device, dtype=mu.dtype
        )
        return CfmPiece(owner, mu[0], mel_ref[0], noise[0], self.sample_steps)

    def absorb(self, mel: torch.Tensor) -> torch.Tensor:
        """mel: [1, mel, n] normalised output of the last piece -> denormalised [1, mel, n]."""
        assert self._piece is not None and mel.shape[2] == self._piece.shape[2]
        if self.context:
            self._fea = torch.cat([self._fea, self._piece], dim=2)[:, :, -self.context :]
            self._mel = torch.cat([self._mel, mel], dim=2)[:, :, -self.context :]
        self._piece = None
        self.n_calls += 1
        return denorm_spec(mel)


@torch.inference_mode()
def solve_pieces(
    estimator: DiT, pieces: Sequence[CfmPiece], graphs: AcousticGraphs | None = None
) -> list[torch.Tensor]:
    """Solve pieces of one `sample_steps` together -> each piece's new frames, normalised [1, mel, n].

    Rows are right-padded to the longest; `keep` is 0 on each row's prompt frames and on its padding,
    and the mask keeps the padding out of every valid frame. Without padding no mask is passed, so one
    piece alone runs exactly `solve`'s computation. graphs: the batch replays the CFM graph of its
    (rows, frames) bucket instead (rows and frames padded further; equal up to float rounding).
    """
    (n_steps,) = {p.sample_steps for p in pieces}
    if graphs is not None:
        assert estimator is graphs.cfm.estimator, "the graphs of this model's CFM"
        xs = graphs.solve_rows([(p.mu, p.prompt, p.noise) for p in pieces], n_steps)
        return [x[None, :, p.prompt.shape[1] :] for x, p in zip(xs, pieces)]
    first = pieces[0].mu
    b, n = len(pieces), max(p.n_frames for p in pieces)
    mel_dim = pieces[0].noise.shape[0]
    mu = first.new_zeros(b, n, first.shape[1])
    prompt_x = first.new_zeros(b, mel_dim, n)
    noise = first.new_zeros(b, mel_dim, n)
    keep = first.new_zeros(b, 1, n)
    for i, p in enumerate(pieces):
        n_prompt = p.prompt.shape[1]
        mu[i, : p.n_frames] = p.mu
        prompt_x[i, :, :n_prompt] = p.prompt
        noise[i, :, : p.n_frames] = p.noise
        keep[i, :, n_prompt : p.n_frames] = 1
    mask = None  # no padding: one piece alone runs exactly `solve`'s computation
    if any(p.n_frames < n for p in pieces):
        lengths = torch.tensor([p.n_frames for p in pieces], device=mu.device)
        mask = torch.arange(n, device=mu.device) < lengths[:, None]
    x = solve_padded(estimator, mu, prompt_x, keep, noise, n_steps, mask)
    return [x[i : i + 1, :, p.prompt.shape[1] : p.n_frames] for i, p in enumerate(pieces)]


@dataclass(eq=False)
class VocoderWindow:
    """One vocoder call of one stream: mel frames [lo, lo + n_frames) of the sentence; samples
    [keep_from, keep_to) of its output are new. `is_whole`: the utterance in one call (no join)."""

    owner: Any
    mel: torch.Tensor  # [num_mels, n_frames] denormalised
    lo: int
    keep_from: int
    keep_to: int
    is_whole: bool
    is_last: bool

    @property
    def n_frames(self) -> int:
        return self.mel.shape[1]


class VocoderRows:
    """`VocoderStream` of one sentence, split: `push` mel (and get the window to vocode, if any), then
    `absorb` the window's audio (or `finish` when the last push needed no call) for final samples."""

    def __init__(
        self,
        hop: int,
        sample_rate: int,
        left: int = VOCODER_LEFT_FRAMES,
        lookahead: int = VOCODER_LOOKAHEAD_FRAMES,
        overlap: int = VOCODER_OVERLAP_FRAMES,
        min_first_s: float = MIN_FIRST_S,
        bucket_frames: int = 1,
    ):
        if min(left, lookahead, overlap) < 0 or bucket_frames < 1:
            raise ValueError("left, lookahead and overlap must be >= 0 frames, bucket_frames >= 1")
        self.hop, self.left, self.lookahead, self.overlap = hop, left, lookahead, overlap
        self.bucket = bucket_frames
        self.min_first = int(np.ceil(min_first_s * sample_rate / hop))
        self.joiner = StreamJoiner(overlap * hop, FadeShape.LINEAR)  # as VocoderStream
        self._mel: torch.Tensor | None = None  # [1, num_mels, frames] everything received
        self._done = 0  # frames planned into a window so far

    def push(self, mel: torch.Tensor, owner: Any, is_last: bool = False) -> VocoderWindow | None:
        """mel: [1, num_mels, n] denormalised -> the window to vocode now, or None (with is_last:
        nothing left to vocode, `finish()` gives the tail)."""
        self._mel = mel if self._mel is None else torch.cat([self._mel, mel], dim=2)
        total = self._mel.shape[2]
        if is_last and self._done == 0:  # all in one call, as VocoderStream: no join
            self._done = total
            if total == 0:
                return None
            return VocoderWindow(owner, self._mel[0], 0, 0, total * self.hop, is_whole=True, is_last=True)
        if is_last:
            return self._window(owner, total, is_last=True) if total > self._done else None
        end = total - self.lookahead
        need = max(self.overlap + 1, self.min_first if self._done == 0 else 1)  # new frames at least
        if end - self._done < need:
            return None
        return self._window(owner, end, is_last=False, need=need)

    def _window(self, owner: Any, end: int, is_last: bool, need: int = 1) -> VocoderWindow:
        # frames [start, end) are new; start reaches `overlap` back to cross-fade the last output
        start = max(self._done - self.overlap, 0)
        lo, hi = max(start - self.left, 0), min(end + self.lookahead, self._mel.shape[2])
        if self.bucket > 1:
            grown = hi - -(-(hi - lo) // self.bucket) * self.bucket
            cut = lo + (hi - lo) // self.bucket * self.bucket  # the window ended early at a multiple
            if grown >= 0:
                lo = grown  # more left context when the stream has it
            elif not is_last and cut - self.lookahead - self._done >= need:
                # no history to grow into (a sentence's first window): end it earlier, at a multiple;
                # the frames after it go to the next window
                hi, end = cut, cut - self.lookahead
        self._done = end
        mel = self._mel[0, :, lo:hi]
        return VocoderWindow(owner, mel, lo, (start - lo) * self.hop, (end - lo) * self.hop, False, is_last)

    def absorb(self, window: VocoderWindow, audio: np.ndarray) -> np.ndarray:
        """audio: float32 [n_frames * hop] of `window` -> the samples that are final now."""
        if window.is_whole:
            return audio
        ready = self.joiner.push(audio[window.keep_from : window.keep_to])
        return np.concatenate([ready, self.joiner.finish()]) if window.is_last else ready

    def finish(self) -> np.ndarray:
        """The held-back tail, when the last push needed no vocoder call."""
        return self.joiner.finish()


@dataclass
class VocoderCalls:
    """What `vocode_windows` ran: calls, windows replayed from graphs (and the zero rows that padded
    them to a row bucket), windows replayed one a call on the masked graphs (a length off the bucket
    grid), windows run eagerly by reason ('no_graphs': no acoustic graphs, as on the CPU or preset
    off; see `VocoderGraphs.eager_reason` for the others)."""

    calls: int = 0
    replayed: int = 0
    padded_rows: int = 0
    off_grid: int = 0
    eager: dict[str, int] = field(default_factory=dict)

    def add(self, other: VocoderCalls) -> None:
        self.calls += other.calls
        self.replayed += other.replayed
        self.padded_rows += other.padded_rows
        self.off_grid += other.off_grid
        for reason, n in other.eager.items():
            self.eager[reason] = self.eager.get(reason, 0) + n


@torch.inference_mode()
def vocode_windows(
    vocoder: BigVGAN,
    windows: Sequence[VocoderWindow],
    max_batch: int,
    graphs: AcousticGraphs | None = None,
    bucket_frames: int = 1,
) -> tuple[list[np.ndarray], VocoderCalls]:
    """Vocode windows, those of one length together (at most max_batch a call) -> float32 audio each,
    and what ran. graphs: windows whose length is a multiple of bucket_frames (> 1: the grid
    `VocoderRows` grows windows to) replay the (row bucket, length) graph, rows padded with zeros; other
    lengths (a short sentence whole, or a window with no history to grow into) replay the masked one-row
    graph of their frame bucket, one window a call (`AcousticGraphs.vocode_mel`: the per-sentence path's
    few graphs, so a new length captures nothing inside a round). A window no graph serves runs eagerly,
    and `VocoderCalls.eager` says why."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i, w in enumerate(windows):
        groups[w.n_frames].append(i)
    out: list[np.ndarray | None] = [None] * len(windows)
    report = VocoderCalls()
    for n, members in groups.items():
        size = max_batch
        is_grid = bucket_frames > 1 and n % bucket_frames == 0
        if graphs is not None:
            size = min(max_batch, graphs.vocoder.rows_per_call(n)) if is_grid else 1
        for lo in range(0, len(members), size):
            chunk = members[lo : lo + size]
            mels = [windows[i].mel for i in chunk]
            reason = "no_graphs" if graphs is None else None
            if graphs is not None and not is_grid:  # the masked graphs serve any length, one window a call
                audio = graphs.vocode_mel(vocoder, mels[0][None])
                report.replayed += 1
                report.off_grid += 1
            elif graphs is not None and (reason := graphs.vocoder_eager_reason(len(chunk), n)) is None:
                audio = graphs.vocode_rows(vocoder, mels)
                report.replayed += len(chunk)
                report.padded_rows += graphs.vocoder.key(len(chunk), n)[0] - len(chunk)
            else:
                audio = vocode(vocoder, torch.stack(mels))
                report.eager[reason] = report.eager.get(reason, 0) + len(chunk)
            report.calls += 1
            audio = audio.float().cpu().numpy()
            for row, i in enumerate(chunk):
                out[i] = audio[row]
    return out, report  # type: ignore[return-value]
