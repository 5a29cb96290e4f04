"""Native routes: raw PCM stream, whole files, health, readiness, metrics, presets."""

from __future__ import annotations

import asyncio
import time

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from voicehub.server.encoding import MEDIA_TYPES, encode_file
from voicehub.server.schemas import FileRequest, StreamRequest, read_json_body, validate
from voicehub.server.state import app_state, iter_chunks, request_id, start_job

router = APIRouter()
HEARTBEAT_STALE_S = 600.0  # a worker silent this long is stuck (a long model load can take minutes)


async def _start(request: Request, schema: type, route: str):
    """Validate the body as `schema`, resolve its model and voice, and queue the job (both routes)."""
    state = app_state(request)
    req = validate(schema, await read_json_body(request, allow_query=True))
    target = state.catalog.resolve(req.model, req.voice)
    job, first = await start_job(
        state, target, req.text, route=route, rid=request_id(request),
        seed=req.seed, speed=req.speed, params=req.params,
    )  # fmt: skip
    return state, req, target, job, first


@router.post("/tts")
async def tts_stream(request: Request) -> StreamingResponse:
    """Raw mono PCM as it is made (f32le by default, s16le on request); rate and dtype in headers."""
    state, req, target, job, first = await _start(request, StreamRequest, "/tts")
    fmt = req.format.audio_format

    async def body():
        from voicehub.audio.io import to_pcm

        async for chunk in iter_chunks(state, job, first):
            yield to_pcm(chunk.audio, fmt)

    headers = {
        "X-Sample-Rate": str(first.sample_rate),
        "X-Channels": "1",
        "X-Dtype": req.format.value,
        "X-Voice": target.voice_name,
        "Cache-Control": "no-store",
    }
    return StreamingResponse(body(), media_type="application/octet-stream", headers=headers)


@router.post("/tts/file")
async def tts_file(request: Request) -> Response:
    """A whole file (wav, flac, mp3, opus) of the utterance."""
    state, req, target, job, first = await _start(request, FileRequest, "/tts/file")
    pieces = [chunk.audio async for chunk in iter_chunks(state, job, first)]
    audio = np.concatenate(pieces)
    data, rate = await asyncio.to_thread(encode_file, audio, first.sample_rate, req.format)
    headers = {"X-Sample-Rate": str(rate), "X-Voice": target.voice_name}
    return Response(data, media_type=MEDIA_TYPES[req.format.value], headers=headers)


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """The process answers and the worker thread is alive and not stuck."""
    worker = app_state(request).worker
    age = time.monotonic() - worker.heartbeat
    ok = worker.is_alive and age < HEARTBEAT_STALE_S
    return JSONResponse(
        {
            "status": "ok" if ok else "unhealthy",
            "worker_alive": worker.is_alive,
            "heartbeat_age_s": round(age, 3),
        },
        status_code=200 if ok else 503,
    )


@router.get("/ready")
async def ready(request: Request) -> JSONResponse:
    """Preloaded models are loaded and warmed up (first-request costs already paid)."""
    state = app_state(request)
    worker = state.worker
    is_ready = worker.ready.is_set() and worker.is_alive
    body = {
        "ready": is_ready,
        "models_loaded": state.pool.loaded(),
        "queue_depth": worker.queue_depth(),
    }
    if worker.startup_error:
        body["error"] = worker.startup_error
    return JSONResponse(body, status_code=200 if is_ready else 503)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    data = app_state(request).metrics.render()
    return Response(data, media_type="text/plain; version=0.0.4; charset=utf-8")


@router.get("/presets")
async def presets() -> JSONResponse:
    """GPT-SoVITS v3 generation presets (pass their fields in `params`)."""
    from voicehub.models.gpt_sovits.presets import PRESETS

    return JSONResponse({"presets": {name.value: p.to_dict() for name, p in PRESETS.items()}})
