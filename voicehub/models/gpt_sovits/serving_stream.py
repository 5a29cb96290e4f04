"""One request inside the stream engine (serving.py): the caller's handle and the engine's state of it.

`SynthesisStream` is what `StreamEngine.submit` returns: iterate it for `AudioChunk`s (it raises what
ended the stream: the model's error, or StreamCancelledError after `cancel()`), or pass callbacks.
`StreamRun` is the engine's side: the sentences in flight, each a `SentenceRun` with its semantic
tokens (cut into windows at streaming.py's `window_ends`, as `stepwise_windows` cuts them), its
`CfmRows` and `VocoderRows`, and the pieces ready to leave, joined as `Pipeline._stream` joins them
(fades at sentence edges next to a pause, the pause after every sentence but the last).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from voicehub.audio.fades import fade_in, fade_out
from voicehub.models.gpt_sovits.batch_acoustic import (
    CfmPiece,
    CfmRows,
    EncoderRow,
    VocoderRows,
    VocoderWindow,
)
from voicehub.models.gpt_sovits.params import GptSovitsParams
from voicehub.models.gpt_sovits.pipeline import (
    EDGE_FADE_S,
    SAMPLE_RATE,
    Pipeline,
    ReferenceFeatures,
    SentenceFeatures,
    sentence_seed,
)
from voicehub.models.gpt_sovits.reference import Voice
from voicehub.models.gpt_sovits.streaming import window_ends
from voicehub.runtime.scheduler import StreamHandle
from voicehub.types import AudioChunk

log = logging.getLogger("voicehub.models.gpt_sovits")
_END = object()
_IDS = itertools.count()


class SynthesisStream:
    """A request in a StreamEngine. `tokens` holds each sentence's semantic tokens as they stream."""

    def __init__(
        self,
        text: str,
        voice: Voice,
        params: GptSovitsParams,
        on_chunk: Callable[[AudioChunk], None] | None = None,
        on_end: Callable[[BaseException | None], None] | None = None,
    ):
        self.id = next(_IDS)
        self.text, self.voice, self.params = text, voice, params
        self.on_chunk, self.on_end = on_chunk, on_end
        self.created = time.perf_counter()
        self.first_chunk_at: float | None = None  # perf_counter() when the first chunk left
        self.n_chunks, self.n_samples = 0, 0
        self.tokens: list[list[int]] = []
        self.error: BaseException | None = None
        self._queue: queue.Queue[Any] = queue.Queue()
        self._cancel, self._finished = threading.Event(), threading.Event()

    @property
    def delivered_s(self) -> float:
        """Seconds of audio handed out so far."""
        return self.n_samples / SAMPLE_RATE

    def cancel(self) -> None:
        """Stop the stream: the engine drops it (and frees its T2S row) at its next step."""
        self._cancel.set()

    @property
    def is_cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def is_finished(self) -> bool:
        return self._finished.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the stream to end; whether it did within `timeout`."""
        return self._finished.wait(timeout)

    def __iter__(self) -> Iterator[AudioChunk]:
        return self.chunks()

    def chunks(self, timeout: float | None = None) -> Iterator[AudioChunk]:
        """The chunks in order; at the end raises the stream's error, if any."""
        while True:
            item = self._queue.get(timeout=timeout)
            if item is _END:
                if self.error is not None:
                    raise self.error
                return
            yield item

    def _deliver(self, chunk: AudioChunk) -> None:
        if self.first_chunk_at is None:
            self.first_chunk_at = time.perf_counter()
        self.n_chunks += 1
        self.n_samples += len(chunk.audio)
        self._queue.put(chunk)
        if self.on_chunk is not None:
            try:
                self.on_chunk(chunk)
            except Exception:  # a listener's failure ends its own stream, not the engine's round
                log.exception("on_chunk of stream %d failed; cancelling it", self.id)
                self.cancel()

    def _end(self, error: BaseException | None) -> None:
        if self._finished.is_set():
            return
        self.error = error
        self._finished.set()
        self._queue.put(_END)
        if self.on_end is not None:
            try:
                self.on_end(error)
            except Exception:
                log.exception("on_end of stream %d failed", self.id)


def priority(stream: SynthesisStream) -> tuple[int, float]:
    """Sort key, most urgent first: no chunk sent yet (oldest first), then the earliest deadline, the
    time its playback runs dry if it started with the first chunk: first chunk + audio delivered."""
    if stream.first_chunk_at is None:
        return (0, stream.created)
    return (1, stream.first_chunk_at + stream.delivered_s)


def is_urgent(stream: SynthesisStream, now: float, urgent_s: float) -> bool:
    """No chunk sent yet, or under `urgent_s` seconds from running dry."""
    rank, deadline = priority(stream)
    return rank == 0 or deadline - now < urgent_s


class SentenceRun:
    """One sentence of a stream: its tokens and windows (T2S side), its CFM and vocoder state."""

    def __init__(
        self,
        features: SentenceFeatures,
        index: int,
        is_last: bool,
        seed: int,
        chunk_tokens: int,
        ref: ReferenceFeatures,
        pipeline: Pipeline,
        params: GptSovitsParams,
        bucket_frames: int,
    ):
        self.features, self.index, self.is_last, self.seed = features, index, is_last, seed
        self.tokens: list[int] = []
        self._ends = window_ends(chunk_tokens)
        self._next_end = next(self._ends)
        self.windows: deque[tuple[int, bool]] = deque()  # (token prefix length, is_final) to synthesize
        self.t2s: StreamHandle | None = None
        self.is_t2s_done = False
        device = pipeline.device
        self.phones = torch.tensor([features.phone_ids], dtype=torch.long, device=device)
        generator = torch.Generator(device=device).manual_seed(seed)  # as Pipeline.stream_sentence
        self.cfm = CfmRows(ref.acoustic, int(params.sample_steps), generator)
        conf = pipeline.vocoder.conf
        self.voc = VocoderRows(conf.hop_size, conf.sampling_rate, bucket_frames=bucket_frames)
        self.n_fea = 0  # condition frames made so far
        self.window_mels: list[torch.Tensor] = []  # solved pieces of the window in progress
        self.is_window_final = False
        self.is_window_open = False  # a window left the queue; its encoder features are due
        self.n_pieces = 0  # audio pieces sent

    def on_tokens(self, tokens: list[int]) -> None:
        """From the T2S scheduler: a window each time the count reaches the next window end."""
        for token in tokens:
            self.tokens.append(token)
            if len(self.tokens) == self._next_end:
                self.windows.append((len(self.tokens), False))
                self._next_end = next(self._ends)

    def finish_tokens(self) -> None:
        self.is_t2s_done = True
        self.windows.append((len(self.tokens), True))


@dataclass(eq=False)
class _Planned:
    """A sentence's vocoder window out for vocoding (None: its tail, `voc.finish()` after the windows
    before it), and its audio once it is back."""

    sentence: SentenceRun
    window: VocoderWindow | None
    audio: np.ndarray | None = None


class StreamRun:
    """The engine's state of one stream (touched by the engine's thread only)."""

    def __init__(
        self,
        stream: SynthesisStream,
        ref: ReferenceFeatures,
        seed: int,
        chunk_tokens: int,
        speakable: Iterator[tuple[SentenceFeatures, bool]],
        pipeline: Pipeline,
        bucket_frames: int,
    ):
        self.stream, self.ref, self.seed, self.chunk_tokens = stream, ref, seed, chunk_tokens
        self.pipeline, self.bucket_frames = pipeline, bucket_frames
        self.sentences: deque[SentenceRun] = deque()  # in flight: [0] in the acoustic stage, [-1] in T2S
        # (a sentence leaves when its last vocoder window is planned; its audio may still be out)
        self._speakable = speakable
        self._n_sentences = 0
        self._outbox: list[tuple[SentenceRun, np.ndarray, bool]] = []
        self._planned: deque[_Planned] = deque()  # windows out for vocoding (and tails), in stream order
        self.is_done = False

    @property
    def sample_steps(self) -> int:
        return int(self.stream.params.sample_steps)

    def next_sentence(self) -> SentenceRun:
        features, is_last = next(self._speakable)
        index = self._n_sentences
        sentence = SentenceRun(
            features, index, is_last, sentence_seed(self.seed, index), self.chunk_tokens,
            self.ref, self.pipeline, self.stream.params, self.bucket_frames,
        )  # fmt: skip
        self._n_sentences += 1
        self.stream.tokens.append(sentence.tokens)
        self.sentences.append(sentence)
        return sentence

    def cancel_t2s(self) -> None:
        for sentence in self.sentences:
            if sentence.t2s is not None and not sentence.t2s.is_finished:
                sentence.t2s.cancel()

    # -- scheduling -------------------------------------------------------------------------------

    @property
    def priority(self) -> tuple[int, float]:
        return priority(self.stream)

    def is_urgent(self, now: float, urgent_s: float) -> bool:
        return is_urgent(self.stream, now, urgent_s)

    @property
    def is_acoustic_ready(self) -> bool:
        if not self.sentences:
            return False
        sentence = self.sentences[0]
        return sentence.cfm.n_todo > 0 or bool(sentence.windows)

    # -- the acoustic chain (streaming.stream_windows; the engine batches each call) ---------------

    def encoder_row(self) -> EncoderRow | None:
        """When the oldest sentence has no frames left to solve, its next window leaves the queue, and
        this is the SoVITS encoder row of the window's token prefix (earlier tokens are the encoder's
        context). None: frames are left, or the prefix is empty. `prepare_piece` takes the result."""
        sentence = self.sentences[0]
        if sentence.cfm.n_todo:
            return None
        n_tokens, sentence.is_window_final = sentence.windows.popleft()
        sentence.is_window_open = True
        if n_tokens == 0:
            return None
        tokens = torch.tensor(sentence.tokens[:n_tokens], dtype=torch.long, device=self.pipeline.device)
        speed = float(self.stream.params.speed)
        return EncoderRow(self, tokens, sentence.phones[0], self.ref.acoustic.ge, speed)

    def prepare_piece(self, windows: list[VocoderWindow], fea: torch.Tensor | None) -> CfmPiece | None:
        """The next CFM piece of the oldest sentence. fea: [1, inter2, n] the encoder output of the row
        `encoder_row` gave (None when it gave none); its frames past those made before are new. A
        window with no new frames goes straight to the vocoder (into `windows`, or out as the
        sentence's tail) and gives None."""
        sentence = self.sentences[0]
        if sentence.is_window_open:
            sentence.is_window_open = False
            new = self.ref.acoustic.fea[:, :, :0]
            if fea is not None:
                new, sentence.n_fea = fea[:, :, sentence.n_fea :], fea.shape[2]
            if new.shape[2] == 0:
                self._push_mel(sentence, self.ref.acoustic.mel[:, :, :0], windows)
                return None
            sentence.cfm.add(new)
        return sentence.cfm.next_piece(self, self.pipeline.sovits.cfm.estimator.proj_out.out_features)

    def absorb_piece(self, mel: torch.Tensor, windows: list[VocoderWindow]) -> None:
        """mel: [1, mel, n] normalised CFM output of the piece `prepare_piece` gave."""
        sentence = self.sentences[0]
        sentence.window_mels.append(sentence.cfm.absorb(mel))
        if sentence.cfm.n_todo == 0:
            mel, sentence.window_mels = torch.cat(sentence.window_mels, dim=2), []
            self._push_mel(sentence, mel, windows)

    def _push_mel(self, sentence: SentenceRun, mel: torch.Tensor, windows: list[VocoderWindow]) -> None:
        """The sentence's window for this mel into `windows` (the engine vocodes it when it flushes), in
        line behind the stream's windows still out; a sentence whose last window is planned leaves the
        acoustic stage now, so the next one's work need not wait for that window's audio."""
        window = sentence.voc.push(mel, self, is_last=sentence.is_window_final)
        if window is None and not sentence.is_window_final:
            return
        self._planned.append(_Planned(sentence, window))
        if window is not None:
            windows.append(window)
        if sentence.is_window_final:
            self.sentences.popleft()
        self._take_audio()

    def absorb_window(self, window: VocoderWindow, audio: np.ndarray) -> None:
        """audio: float32 [n_frames * hop] of a window `_push_mel` gave out (in any order)."""
        (planned,) = [p for p in self._planned if p.window is window]
        planned.audio = audio
        self._take_audio()

    def _take_audio(self) -> None:
        # the planned windows' audio in order, as far as it is vocoded (a window None: the sentence's tail)
        while self._planned and (self._planned[0].window is None or self._planned[0].audio is not None):
            p = self._planned.popleft()
            if p.window is None:
                self._out(p.sentence, p.sentence.voc.finish(), True)
            else:
                self._out(p.sentence, p.sentence.voc.absorb(p.window, p.audio), p.window.is_last)

    @property
    def n_unvocoded(self) -> int:
        """Windows given out for vocoding whose audio has not come back."""
        return sum(p.audio is None and p.window is not None for p in self._planned)

    def _out(self, sentence: SentenceRun, audio: np.ndarray, is_final: bool) -> None:
        if len(audio) or is_final:  # as stream_windows: empty pieces are skipped, the final one is not
            self._outbox.append((sentence, audio, is_final))

    def send_ready(self) -> None:
        """Hand the finished pieces to the stream as AudioChunks (Pipeline._stream's joins)."""
        fade = round(EDGE_FADE_S * SAMPLE_RATE)
        pause = np.zeros(round(self.stream.params.pause_s * SAMPLE_RATE), np.float32)
        for sentence, audio, is_final in self._outbox:
            if sentence.index > 0 and sentence.n_pieces == 0:
                audio = fade_in(audio, fade)
            if is_final and not sentence.is_last:
                audio = np.concatenate([fade_out(audio, fade), pause])
            chunk = AudioChunk(
                audio=audio.astype(np.float32, copy=False),
                sample_rate=SAMPLE_RATE,
                text=sentence.features.text,
                index=self.stream.n_chunks,
                start_s=self.stream.n_samples / SAMPLE_RATE,
                is_last=is_final and sentence.is_last,
                phonemes=" ".join(sentence.features.phones),
            )
            sentence.n_pieces += 1
            self.stream._deliver(chunk)
            self.is_done = self.is_done or chunk.is_last
        self._outbox.clear()
