"""Many GPT-SoVITS v3 streams on one GPU: T2S, CFM and vocoder work of all streams batched (issue 7).

`StreamEngine(model)` serves requests for voices that share the model's weights (voices with other
weights need their own engine: `engine_key`). `submit(text, voice=..., **params)` returns a
`SynthesisStream` of `AudioChunk`s, as `GptSovitsModel.stream` yields them. Each `step()` is one
round, run by one thread (the server's GPU worker, or the thread of `start()`):
1. new requests are set up (sentences cut, the voice's reference features) and join the T2S batch
   while rows are free; a stream's next sentence is queued as soon as its previous sentence's tokens
   are done, ahead of new streams;
2. the T2S scheduler (`ContinuousScheduler` over a `T2SRowEngine`) steps every row
   `stop_check_interval` times, each row with its own params, seed, position and stop;
3. each sentence's tokens go through streaming.py's chain in windows of `stream_chunk_tokens`
   (SoVITS `decode_encp` on the prefix; CFM prompted by the full reference and the last frames made;
   the vocoder with left context, lookahead and a cross-fade). The encoder rows of a batch's streams
   run as one padded, masked call (`encode_rows`), and so do their CFM pieces: one batch, most
   urgent first: a stream's first chunk before anything else, then the stream closest to running dry
   (deadline = when its first chunk left + the audio it has received). While T2S has work (busy
   rows, or requests to admit), a round runs batches while the most urgent stream left is within
   `urgent_s` of its deadline (or has no chunk yet), else one batch, or none while a new stream
   still waits for its first window's tokens; each batch's vocoder windows run right after it,
   batched by length. With no T2S work, a round runs every batch that is ready (serving_acoustic.py).
Differences from `GptSovitsModel.stream`, on purpose: every request streams within sentences
(`stream_chunk_tokens` defaults to the engine's `chunk_tokens`), and T2S sampling draws from per-row
counter streams (runtime/row_rng.py), so a fixed seed gives other tokens than the single-stream path:
a stream's tokens do not depend on the streams beside it. Greedy tokens are the same on both paths.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import deque
from dataclasses import replace
from typing import Any

import torch

from voicehub.errors import InvalidTextError
from voicehub.models.gpt_sovits.batch_acoustic import VocoderWindow
from voicehub.models.gpt_sovits.encoder_graphs import EncoderRowGraphs
from voicehub.models.gpt_sovits.engine_start import capture_start_graphs
from voicehub.models.gpt_sovits.model import GptSovitsModel, uses_graph_decoder
from voicehub.models.gpt_sovits.pipeline import MAX_SEED
from voicehub.models.gpt_sovits.serving_acoustic import AcousticRoundMixin
from voicehub.models.gpt_sovits.serving_config import SLOW_ROUND_S, EngineStats, ServingConfig
from voicehub.models.gpt_sovits.serving_stream import StreamRun, SynthesisStream
from voicehub.models.gpt_sovits.t2s.scheduler import T2SRowEngine
from voicehub.models.gpt_sovits.t2s.static import NATIVE_KERNELS, StaticDecodeConfig, T2SRequest
from voicehub.runtime.cuda_graphs import GraphPreset
from voicehub.runtime.round_loop import RoundLoop
from voicehub.runtime.scheduler import ContinuousScheduler, QueueFullError, StreamCancelledError
from voicehub.text.limits import check_text

log = logging.getLogger("voicehub.models.gpt_sovits")


def engine_key(model: GptSovitsModel) -> str:
    """What an engine is keyed by: the model's weights (files and dtype). Voices of one key share it."""
    return model.pipeline.model_id


class StreamEngine(AcousticRoundMixin):
    """Continuous batching of GPT-SoVITS v3 streams over one loaded model; see the module docstring."""

    def __init__(self, model: GptSovitsModel, config: ServingConfig | None = None):
        self.model, self.config = model, config or ServingConfig()
        self.pipeline = pipeline = model.pipeline
        self.key = engine_key(model)
        sizes = StaticDecodeConfig.for_checkpoint(pipeline.t2s.config, max_batch=self.config.max_streams)
        sizes = replace(sizes, stop_check_interval=self.config.stop_check_interval)
        preset = "full" if uses_graph_decoder(pipeline.device, model.cuda_graph_preset) else "off"
        self.t2s = T2SRowEngine(pipeline.t2s, sizes, preset)
        kernels = pipeline.t2s_decoder.kernels if pipeline.t2s_decoder is not None else NATIVE_KERNELS
        if kernels != NATIVE_KERNELS:  # the model was optimized: step with the same kernels
            self.t2s.set_step_kernels(kernels)
        self.scheduler = ContinuousScheduler(
            self.t2s, max_queue=self.config.max_streams + self.config.max_queue
        )
        self.stats = EngineStats()
        self.recent_cfm_batches: deque[tuple[int, ...]] = deque(maxlen=256)  # stream ids per CFM call
        self._lock = threading.Lock()
        self._inbox: deque[SynthesisStream] = deque()  # submitted, not yet set up
        self._waiting: deque[StreamRun] = deque()  # set up, waiting for a T2S row
        self._runs: list[StreamRun] = []  # admitted
        self._held: list[VocoderWindow] = []  # vocoder windows waiting to share a call (hold_vocoder)
        self._loop = RoundLoop(self.step, "voicehub-stream-engine", on_error=self._round_failed)
        # the batched encoder's graphs: the engine's own (CUDA with a capturing preset, as the acoustic graphs)
        self.encoder_graphs: EncoderRowGraphs | None = None
        if pipeline.acoustic_graphs is not None:
            # full/minimal: captured when the engine starts only (a capture mid-round stalled every stream,
            # H200 level 16); lazy: each on first use
            on_use = pipeline.acoustic_graphs.preset is GraphPreset.LAZY
            self.encoder_graphs = EncoderRowGraphs(pipeline.sovits, pipeline.device, capture_on_use=on_use)
        t0 = time.perf_counter()
        at_start = capture_start_graphs(pipeline, self.config, self.encoder_graphs)
        self.vocoder_graphs_at_start, self.encoder_graphs_at_start, self.cfm_graphs_at_start = at_start[:3]
        self.masked_vocoder_graphs_at_start = at_start.masked
        log.info(
            "GPT-SoVITS v3 stream engine: %d rows, T2S preset %s, %d vocoder, %d encoder, %d CFM and %d masked "
            "vocoder graphs captured in %.2f s, %s", sizes.max_batch, preset, *(len(k) for k in at_start),
            time.perf_counter() - t0, self.config,
        )  # fmt: skip

    # -- requests (any thread) --------------------------------------------------------------------

    def submit(
        self,
        text: str,
        *,
        voice: Any = None,
        seed: int | None = None,
        on_chunk: Any = None,
        on_end: Any = None,
        **params: Any,
    ) -> SynthesisStream:
        """Queue a request; text, parameters and voice are checked now (as `GptSovitsModel.stream`
        does), the reference and sentences at the engine's next step (errors then end the stream).
        on_chunk(chunk) and on_end(error or None) are called from the engine's thread."""
        text = check_text(text)
        request = self.model.request_params(seed, params)
        stream = SynthesisStream(text, self.model.resolve_voice(voice), request, on_chunk, on_end)
        with self._lock:
            if len(self._inbox) + len(self._waiting) >= self.config.max_queue + self._free_rows():
                raise QueueFullError(
                    f"{len(self._inbox) + len(self._waiting)} streams already wait for one of "
                    f"{self.config.max_streams} rows; retry later, or raise max_queue / max_streams"
                )
            self._inbox.append(stream)
        self._loop.wake()
        return stream

    @property
    def n_streams(self) -> int:
        """Streams submitted and not finished (running or waiting)."""
        return len(self._runs) + len(self._waiting) + len(self._inbox)

    @property
    def is_idle(self) -> bool:
        return self.n_streams == 0

    # -- the round (one thread) -------------------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> bool:
        """One round (see the module docstring); returns whether any stream is left."""
        t_round, graphs_before = time.perf_counter(), self._graphs_held()
        try:
            return self._round()
        finally:
            took = time.perf_counter() - t_round
            self.stats.rounds += 1
            self.stats.round_s_max = max(self.stats.round_s_max, took)
            self.stats.slow_rounds += took > SLOW_ROUND_S
            self.stats.captures_in_rounds += self._graphs_held() - graphs_before

    def _graphs_held(self) -> int:
        """CUDA graphs of the acoustic stage and of the engine's encoder held now (T2S's are not counted)."""
        acoustic = self.pipeline.acoustic_graphs
        held = 0 if acoustic is None else acoustic.n_captured()
        return held + (0 if self.encoder_graphs is None else self.encoder_graphs.n_captured)

    def _round(self) -> bool:
        self._drop_cancelled()
        self._set_up_new()
        self._admit()
        if not self.scheduler.is_idle:
            t0 = time.perf_counter()
            try:
                self.scheduler.pump()  # a failure ends every live row's handle with the error
            except Exception:
                log.exception("T2S step failed; its streams fail")
            self.stats.t2s_s += time.perf_counter() - t0
        for run in list(self._runs):
            self._advance(run)
        self._acoustic()
        return not self.is_idle

    def run_until_idle(self, max_rounds: int = 1_000_000) -> None:
        self._loop.run_until_idle(max_rounds)

    def start(self) -> None:
        """Run rounds in a daemon thread until `stop()`; it sleeps while idle."""
        self._loop.start()

    def stop(self, timeout: float | None = None) -> None:
        self._loop.stop(timeout)

    def close(self, error: BaseException | None = None) -> None:
        """End every stream (with `error`, default StreamCancelledError) and free its rows; the engine
        thread must be stopped first."""
        error = error or StreamCancelledError("the stream engine was closed")
        with self._lock:
            inbox, self._inbox = list(self._inbox), deque()
        for stream in inbox:
            stream._end(error)
        self._held = []
        for run in [*self._waiting, *self._runs]:
            self._end(run, error)
        try:
            self.scheduler.pump()  # frees the cancelled rows
        except Exception:
            log.exception("freeing the T2S rows failed")

    def _round_failed(self, error: Exception) -> None:
        # a bug, not a bad request: every stream fails, the loop goes on
        log.error("stream engine round failed; ending every stream", exc_info=error)
        self.close(error)

    def _free_rows(self) -> int:
        return max(self.config.max_streams - self.scheduler.n_active - self.scheduler.n_waiting, 0)

    def _drop_cancelled(self) -> None:
        with self._lock:
            gone = [s for s in self._inbox if s.is_cancelled]
            for stream in gone:
                self._inbox.remove(stream)
        for stream in gone:
            stream._end(StreamCancelledError("the stream was cancelled before it started"))
        for run in [r for r in (*self._waiting, *self._runs) if r.stream.is_cancelled]:
            self._end(run, StreamCancelledError("the stream was cancelled"))

    def _end(self, run: StreamRun, error: BaseException | None) -> None:
        """Take a run out of the engine (its T2S rows are freed at the next pump) and end its stream."""
        run.cancel_t2s()
        if run in self._runs:
            self._runs.remove(run)
        elif run in self._waiting:
            self._waiting.remove(run)
        run.stream._end(error)

    def _set_up_new(self) -> None:
        while True:
            with self._lock:
                if not self._inbox:
                    return
                stream = self._inbox.popleft()
            try:
                self._waiting.append(self._set_up(stream))
            except Exception as error:  # a bad request fails alone
                stream._end(error)

    def _set_up(self, stream: SynthesisStream) -> StreamRun:
        params, pipeline = stream.params, self.pipeline
        sentences = pipeline.sentences(stream.text, params)
        if not sentences:
            raise InvalidTextError(f"nothing to speak in {stream.text[:60]!r} after cutting")
        ref = pipeline.reference(stream.voice, params.prompt_language)
        seed = params.seed if params.seed is not None else secrets.randbelow(MAX_SEED)
        chunk = params.stream_chunk_tokens or self.config.chunk_tokens
        speakable = pipeline.speakable(sentences, params.text_language)
        run = StreamRun(stream, ref, seed, int(chunk), speakable, pipeline, self.config.vocoder_bucket_frames)
        run.next_sentence()  # raises InvalidTextError when nothing is speakable
        return run

    def _admit(self) -> None:
        while self._waiting and self._free_rows() > 0:
            run = self._waiting.popleft()
            self._runs.append(run)
            self._submit_t2s(run)

    def _submit_t2s(self, run: StreamRun) -> None:
        sentence, ref = run.sentences[-1], run.ref
        device = self.pipeline.device
        phone_ids = torch.tensor(ref.phone_ids + sentence.features.phone_ids, dtype=torch.long, device=device)
        bert = torch.cat([ref.bert, sentence.features.bert], dim=1)  # [1024, P_ref + P]
        request = T2SRequest(phone_ids, bert, ref.prompt_tokens, run.stream.params.sampling(sentence.seed))
        try:
            sentence.t2s = self.scheduler.submit(request, on_tokens=sentence.on_tokens)
        except Exception as error:  # e.g. a prompt too long for the static cache
            self._end(run, error)

    def _advance(self, run: StreamRun) -> None:
        """After a pump: a sentence whose tokens are done gets its last window, the next one its T2S."""
        if not run.sentences:
            return
        sentence = run.sentences[-1]
        handle = sentence.t2s
        if handle is None or not handle.is_finished or sentence.is_t2s_done:
            return
        try:
            handle.result(timeout=0)
        except Exception as error:
            self._end(run, error)
            return
        sentence.finish_tokens()
        if not sentence.is_last:
            try:
                run.next_sentence()
            except Exception as error:
                self._end(run, error)
                return
            self._submit_t2s(run)

    # -- acoustic work (its batches: serving_acoustic.py) ------------------------------------------

    def _has_t2s_work(self) -> bool:
        return not self.scheduler.is_idle or bool(self._inbox or self._waiting)
