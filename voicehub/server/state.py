"""What one app holds (config, registry, catalog, worker, metrics) and the job helpers routes share."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import HTTPConnection

from voicehub.models.base import TTSModel
from voicehub.server.catalog import Catalog, Target
from voicehub.server.config import ConfigError, ModelSpec, ServerConfig
from voicehub.server.errors import ServerError
from voicehub.server.metrics import Metrics
from voicehub.server.pool import ModelPool, load_model
from voicehub.server.worker import Job, Worker
from voicehub.text.limits import check_text
from voicehub.types import AudioChunk
from voicehub.voices import VoiceRegistry


@dataclass
class AppState:
    config: ServerConfig
    registry: VoiceRegistry
    catalog: Catalog
    metrics: Metrics
    pool: ModelPool
    worker: Worker

    @classmethod
    def build(
        cls,
        config: ServerConfig,
        registry: VoiceRegistry | None = None,
        loader: Callable[[ModelSpec], TTSModel] | None = None,
    ) -> AppState:
        limits = config.limits
        registry = registry or VoiceRegistry(
            config.data_dir, min_reference_s=limits.min_reference_s, max_reference_s=limits.max_reference_s
        )
        catalog = Catalog(config, registry)
        try:
            catalog.resolve(None, None)
        except ServerError as exc:
            raise ConfigError(f"the default voice {config.default_voice!r} does not resolve: {exc}") from None
        metrics = Metrics()
        pool = ModelPool(loader or (lambda spec: load_model(spec, config.device)), limits.memory_budget_mb)
        preload = [s for n, s in config.models.items() if s.preload or n == config.default_voice]
        worker = Worker(pool, limits, metrics, preload, config.warmup_text, batching=config.batching)
        return cls(config, registry, catalog, metrics, pool, worker)


def app_state(conn: HTTPConnection) -> AppState:
    return conn.app.state.voicehub


def request_id(conn: HTTPConnection) -> str:
    return conn.scope.get("state", {}).get("request_id", "")


async def start_job(
    state: AppState,
    target: Target,
    text: str,
    *,
    route: str,
    rid: str,
    seed: int | None = None,
    speed: float | None = None,
    params: dict[str, Any] | None = None,
) -> tuple[Job, AudioChunk]:
    """Queue the utterance and wait for its first chunk, so errors still become a proper status."""
    text = check_text(text, state.config.limits.max_text_chars)
    merged = {**target.params, **(params or {})}
    job = Job(
        target.spec,
        text,
        voice=target.voice,
        seed=seed,
        speed=speed,
        params=merged,
        timeout_s=state.config.limits.request_timeout_s,
        request_id=rid,
    )
    state.worker.submit(job)
    try:
        first = await job.next()
    except BaseException:
        job.cancel()
        raise
    if first is None:
        raise ServerError("the model finished without making any audio")
    state.metrics.first_audio.labels(route).observe(time.monotonic() - job.created)
    return job, first


async def iter_chunks(state: AppState, job: Job, first: AudioChunk) -> AsyncIterator[AudioChunk]:
    """The job's chunks from the first on; leaving early (client gone) cancels the job."""
    try:
        chunk: AudioChunk | None = first
        while chunk is not None:
            state.metrics.audio_seconds.inc(chunk.duration)
            yield chunk
            chunk = await job.next()
    finally:
        job.cancel()  # a no-op after the end; otherwise the worker stops within one chunk
