"""GPT-SoVITS jobs on batching stream engines, one engine per set of weights, driven by the worker.

With batching on (the default; `voicehub serve --no-batching` turns it off), the worker hands every
job for a GPT-SoVITS v3 model to that model's `StreamEngine` (models/gpt_sovits/serving.py) instead
of interleaving `model.stream` iterators: the engine decodes all its streams' T2S steps together and
batches their CFM and vocoder work. Voices that share the model's files share its engine; a model
with other weights (a LoRA or another GPT) gets its own. Everything here runs on the worker thread.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from voicehub.models.base import TTSModel
from voicehub.runtime.scheduler import QueueFullError as EngineQueueFullError
from voicehub.server.config import Limits, ModelSpec
from voicehub.server.errors import BadRequestError, QueueFullError, RequestTimeoutError
from voicehub.server.metrics import Metrics
from voicehub.server.pool import ModelPool
from voicehub.voices import GPT_SOVITS_FAMILY

if TYPE_CHECKING:
    from voicehub.models.gpt_sovits.serving import StreamEngine, SynthesisStream
    from voicehub.server.worker import Job

log = logging.getLogger("voicehub.server")


@dataclass(eq=False)
class _Entry:
    job: Job
    stream: SynthesisStream
    spec_name: str
    is_stopping: bool = False  # the worker cancelled it (client gone or timeout)


class BatchedStreams:
    """The engines (by weights) and the jobs running on them."""

    def __init__(self, pool: ModelPool, limits: Limits, metrics: Metrics):
        self.pool, self.limits, self.metrics = pool, limits, metrics
        self._engines: dict[str, tuple[StreamEngine, str]] = {}  # engine key -> (engine, spec name)
        self._entries: list[_Entry] = []

    @staticmethod
    def accepts(model: TTSModel) -> bool:
        """Whether jobs for `model` go to a stream engine (its family batches)."""
        return model.model_type == GPT_SOVITS_FAMILY

    @property
    def n_streams(self) -> int:
        return len(self._entries)

    @property
    def is_busy(self) -> bool:
        return any(not engine.is_idle for engine, _ in self._engines.values())

    def pinned(self) -> frozenset[str]:
        """Models with live streams: the pool must not unload them."""
        return frozenset(e.spec_name for e in self._entries)

    def engine_for(self, spec: ModelSpec, model: TTSModel) -> StreamEngine:
        """The engine of `model`'s weights, built (and its T2S graphs captured) on first use."""
        from voicehub.models.gpt_sovits.serving import ServingConfig, StreamEngine, engine_key

        key = engine_key(model)
        if key in self._engines:
            return self._engines[key][0]
        config = ServingConfig(max_streams=self.limits.max_batch_streams, max_queue=self.limits.max_queue)
        engine = StreamEngine(model, config)
        self._engines[key] = (engine, spec.name)
        return engine

    def submit(self, job: Job, spec: ModelSpec, model: TTSModel, params: dict[str, Any]) -> None:
        """Start `job` on its model's engine; chunks and the end go straight into the job."""
        engine = self.engine_for(spec, model)
        try:
            stream = engine.submit(
                job.text, voice=job.voice, seed=job.seed, on_chunk=job.push, on_end=job.finish, **params
            )
        except TypeError as exc:  # unknown parameter names: the caller's mistake, named by the family
            raise BadRequestError(str(exc)) from None
        except EngineQueueFullError as exc:
            raise QueueFullError(f"the server is busy: {exc}") from None
        self._entries.append(_Entry(job, stream, spec.name))

    def warm_up(self, spec: ModelSpec, model: TTSModel, text: str) -> None:
        """One request through the engine (its default voice), so the first real one pays nothing."""
        engine = self.engine_for(spec, model)
        stream = engine.submit(text)
        engine.run_until_idle()
        for _ in stream:  # raises what failed the warm-up
            pass

    def step(self) -> None:
        """Stop jobs whose client left or whose time ran out, then one round of every busy engine."""
        now = time.monotonic()
        for entry in list(self._entries):
            if entry.stream.is_finished:
                self._entries.remove(entry)
            elif not entry.is_stopping and entry.job.cancelled.is_set():
                entry.is_stopping = True
                entry.stream.cancel()
                self.metrics.cancelled.inc()
            elif not entry.is_stopping and now > entry.job.deadline:
                entry.is_stopping = True
                entry.stream.cancel()
                entry.job.push(
                    RequestTimeoutError(f"the request ran past its {entry.job.timeout_s:g} s timeout")
                )
        for key, (engine, name) in list(self._engines.items()):
            if not engine.is_idle:
                try:
                    engine.step()
                except Exception as exc:  # a bug, not a bad request: the engine's streams fail, it goes
                    log.exception("stream engine of model %r failed; its streams fail", name)
                    engine.close(exc)
                    del self._engines[key]
            elif name not in self.pool.loaded():  # the pool unloaded its model: let the memory go
                del self._engines[key]

    def close(self, error: BaseException) -> None:
        """End every stream with `error` (shutdown)."""
        for engine, _ in self._engines.values():
            engine.close(error)
        self._entries.clear()
