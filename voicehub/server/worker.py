"""The one worker thread that owns the models: a bounded queue in, chunks out to each request.

Request handlers never touch a model or CUDA state: they submit a `Job` and await its chunks.
The worker advances up to `max_active_streams` streams one chunk at a time (a stream that has not
yet produced audio goes first), and checks each job's cancel flag and deadline before every
chunk, so a client that leaves stops its work within one chunk.
Interleaving needs families whose `stream` keeps its state in the generator; a family with one
static cache per model must run with max_active_streams = 1 (the default). With batching on, jobs
for GPT-SoVITS models skip this loop: the worker hands them to the model's stream engine, which
batches all its streams (server/batching.py), and steps every busy engine once per loop turn.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from voicehub.models.base import TTSModel
from voicehub.server.batching import BatchedStreams
from voicehub.server.config import Limits, ModelSpec
from voicehub.server.errors import (
    BadRequestError,
    CancelledError,
    NotReadyError,
    QueueFullError,
    RequestTimeoutError,
    status_of,
)
from voicehub.server.metrics import Metrics
from voicehub.server.pool import ModelPool, freeze_long_lived
from voicehub.types import AudioChunk
from voicehub.voices import REFERENCE_FAMILIES

log = logging.getLogger("voicehub.server")
_END = object()
_IDLE_POLL_S = 0.05  # how often an idle worker looks at its stop flag


class Job:
    """One utterance to make. Created in a handler; the worker pushes chunks into it thread-safely."""

    def __init__(
        self,
        spec: ModelSpec,
        text: str,
        *,
        voice: Any = None,
        seed: int | None = None,
        speed: float | None = None,
        params: dict[str, Any] | None = None,
        timeout_s: float = 120.0,
        request_id: str | None = None,
    ):
        self.id = request_id or uuid.uuid4().hex
        self.spec, self.text, self.voice, self.speed = spec, text, voice, speed
        self.params = dict(params or {})
        # A voice's default params (or a request's) may hold a seed; the request's own field wins, and
        # it leaves params so `stream(seed=..., **params)` gets it once.
        params_seed = self.params.pop("seed", None)
        self.seed = seed if seed is not None else params_seed
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.created = time.monotonic()
        self.cancelled = threading.Event()
        self._loop = asyncio.get_running_loop()
        self._out: asyncio.Queue[Any] = asyncio.Queue()

    def push(self, item: Any) -> None:
        """From the worker thread: hand a chunk, _END or an exception to the waiting handler."""
        try:
            self._loop.call_soon_threadsafe(self._out.put_nowait, item)
        except RuntimeError:  # the handler's event loop is gone: nobody listens any more
            self.cancelled.set()

    def finish(self, error: BaseException | None = None) -> None:
        """From the worker thread: the end of the stream, or the error that ended it."""
        self.push(_END if error is None else error)

    def cancel(self) -> None:
        self.cancelled.set()

    async def next(self) -> AudioChunk | None:
        """The next chunk, or None at the end; raises what the model raised, or RequestTimeoutError."""
        remaining = self.deadline - time.monotonic()
        try:
            item = await asyncio.wait_for(self._out.get(), timeout=max(remaining, 0.0) + 1.0)
        except TimeoutError:
            self.cancel()
            raise RequestTimeoutError(
                f"no audio within the request timeout of {self.timeout_s:g} s; send shorter text or retry"
            ) from None
        if item is _END:
            return None
        if isinstance(item, BaseException):
            raise item
        return item


@dataclass
class _Active:
    job: Job
    chunks: Any  # the model's stream iterator
    n_chunks: int = 0
    n_samples: int = 0
    compute_s: float = 0.0
    sample_rate: int = 0
    started: float = field(default_factory=time.perf_counter)


class Worker:
    """Owns the model pool on its own thread; `submit` is the only entry from handlers."""

    def __init__(
        self,
        pool: ModelPool,
        limits: Limits,
        metrics: Metrics,
        preload: list[ModelSpec] | None = None,
        warmup_text: str = "",
        batching: bool = False,
    ):
        """batching: run GPT-SoVITS jobs on batching stream engines (server/batching.py)."""
        self.pool, self.limits, self.metrics = pool, limits, metrics
        self.batched = BatchedStreams(pool, limits, metrics) if batching else None
        self._preload_specs = list(preload or [])
        self._warmup_text = warmup_text
        self._queue: queue.Queue[Job] = queue.Queue(maxsize=limits.max_queue)
        self._stop = threading.Event()
        self.ready = threading.Event()
        self.startup_error: str | None = None
        self.heartbeat = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="voicehub-worker", daemon=True)

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel what is left and end the thread (after the HTTP server has drained its streams)."""
        self._stop.set()
        self._thread.join(timeout)
        gc.unfreeze()  # what the pool froze can be collected again once this worker's models go

    def queue_depth(self) -> int:
        return self._queue.qsize()

    def submit(self, job: Job) -> None:
        if self._stop.is_set() or not self.is_alive:
            raise NotReadyError("the server is shutting down; retry on another instance")
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            raise QueueFullError(
                f"the server is busy: {self.limits.max_queue} requests are already waiting; retry shortly"
            ) from None
        self.metrics.queue_depth.set(self._queue.qsize())

    def _preload(self) -> None:
        try:
            for spec in self._preload_specs:
                model = self.pool.get(spec)
                if self._batches(model) and getattr(model, "is_runtime_loaded", True):
                    self.batched.engine_for(spec, model)  # graph capture now, not on the first request
                self._warm_up(spec, model)
            freeze_long_lived()  # what the warm-ups built (graphs, engines, caches) joins the models
            self.ready.set()
        except Exception as exc:  # the worker keeps serving models that do load; /ready says why not
            self.startup_error = f"preloading failed: {type(exc).__name__}: {exc}"
            log.error(self.startup_error)

    def _warm_up(self, spec: ModelSpec, model: TTSModel) -> None:
        """Pay first-request costs (allocations, graph capture) now, with no voice: the model's default.

        A family that clones a reference voice refuses a request without one, so its model is warmed
        up only when its spec gives the family's `default_voice` load option.
        """
        if not self._warmup_text:
            return
        if model.model_type in REFERENCE_FAMILIES and spec.options.get("default_voice") is None:
            log.warning(
                "not warming up model %r: a %s model needs a voice; give it options.default_voice "
                "to warm it up at start",
                spec.name,
                model.model_type,
            )
            return
        if self._batches(model):
            self.batched.warm_up(spec, model, self._warmup_text)
            return
        for _ in model.stream(self._warmup_text):
            pass

    def _batches(self, model: TTSModel) -> bool:
        return self.batched is not None and self.batched.accepts(model)

    def _run(self) -> None:
        self._preload()
        active: list[_Active] = []
        turn = 0
        while not self._stop.is_set():
            self.heartbeat = time.monotonic()
            self._admit(active)
            self.metrics.queue_depth.set(self._queue.qsize())
            n_batched = self.batched.n_streams if self.batched is not None else 0
            self.metrics.active_streams.set(len(active) + n_batched)
            if active:
                turn += 1
                self._step(active, turn)
            if self.batched is not None:
                self.batched.step()
        for a in active:
            self._finish(a, active, CancelledError("the server is shutting down"))
        if self.batched is not None:
            self.batched.close(CancelledError("the server is shutting down"))
        while not self._queue.empty():
            self._queue.get_nowait().push(CancelledError("the server is shutting down"))

    def _admit(self, active: list[_Active]) -> None:
        while len(active) < self.limits.max_active_streams:
            is_busy = active or (self.batched is not None and self.batched.is_busy)
            try:
                job = self._queue.get_nowait() if is_busy else self._queue.get(timeout=_IDLE_POLL_S)
            except queue.Empty:
                return
            if job.cancelled.is_set():
                self.metrics.cancelled.inc()
                continue
            try:
                pinned = frozenset(a.job.spec.name for a in active)
                if self.batched is not None:
                    pinned |= self.batched.pinned()
                model = self.pool.get(job.spec, pinned)
                self.metrics.models_loaded.set(len(self.pool.loaded()))
                params = job.params if job.speed is None else {**job.params, "speed": job.speed}
                if self._batches(model):
                    self.batched.submit(job, job.spec, model, params)
                    continue
                try:
                    chunks = iter(model.stream(job.text, voice=job.voice, seed=job.seed, **params))
                except TypeError as exc:  # unknown parameter names: the caller's mistake, named by the family
                    raise BadRequestError(str(exc)) from None
            except Exception as exc:
                self._report(job, exc)
                continue
            active.append(_Active(job, chunks, sample_rate=model.sample_rate))

    def _step(self, active: list[_Active], turn: int) -> None:
        fresh = [a for a in active if a.n_chunks == 0]  # first audio first
        a = fresh[0] if fresh else active[turn % len(active)]
        if a.job.cancelled.is_set():
            self.metrics.cancelled.inc()
            self._finish(a, active, None)
            return
        if time.monotonic() > a.job.deadline:
            self._finish(
                a, active, RequestTimeoutError(f"the request ran past its {a.job.timeout_s:g} s timeout")
            )
            return
        t0 = time.perf_counter()
        try:
            chunk = next(a.chunks)
        except StopIteration:
            self._finish(a, active, None, done=True)
            return
        except Exception as exc:
            self._finish(a, active, exc)
            return
        a.compute_s += time.perf_counter() - t0
        a.n_chunks += 1
        a.n_samples += len(chunk.audio)
        a.job.push(chunk)

    def _finish(
        self, a: _Active, active: list[_Active], exc: BaseException | None, done: bool = False
    ) -> None:
        active.remove(a)
        close = getattr(a.chunks, "close", None)
        if close is not None:
            try:
                close()  # runs the model's finally blocks, freeing its per-stream state
            except Exception as close_exc:
                log.warning("closing stream %s failed: %s", a.job.id, close_exc)
        if done:
            if a.n_samples and a.sample_rate:
                self.metrics.rtf.observe(a.compute_s / (a.n_samples / a.sample_rate))
            a.job.push(_END)
        elif exc is not None:
            self._report(a.job, exc)

    def _report(self, job: Job, exc: BaseException) -> None:
        status, _ = status_of(exc)
        if status >= 500 and not isinstance(exc, RequestTimeoutError | CancelledError):
            log.exception("job %s failed", job.id, exc_info=exc)
        job.push(exc)
