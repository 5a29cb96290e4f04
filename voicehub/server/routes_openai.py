"""OpenAI-compatible routes: `POST /v1/audio/speech` and `GET /v1/models`.

Audio formats: pcm (24 kHz s16le mono, resampled with libsoxr) and wav leave chunk by chunk;
mp3, opus and flac are encoded when the utterance is whole; aac is refused (no encoder here).
With stream_format=sse, each `speech.audio.delta` event carries base64 audio in the requested
format and `speech.audio.done` ends the stream, as OpenAI defines them.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from voicehub.server.encoding import (
    MEDIA_TYPES,
    OPENAI_PCM_RATE,
    StreamResampler,
    encode_file,
    s16le,
    wav_stream_header,
)
from voicehub.server.errors import BadRequestError
from voicehub.server.schemas import SpeechRequest, read_json_body, validate
from voicehub.server.state import AppState, app_state, iter_chunks, request_id, start_job
from voicehub.server.worker import Job
from voicehub.types import AudioChunk

router = APIRouter()
INSTRUCTIONS_NOTE = "instructions are accepted and ignored: VoiceHub voices have no instruction control"


async def _progressive(
    state: AppState, job: Job, first: AudioChunk, fmt: str, rate: int
) -> AsyncIterator[bytes]:
    """pcm: 24 kHz s16le; wav: a streaming header, then s16le at the model's rate."""
    if fmt == "wav":
        yield wav_stream_header(rate)
    resample = StreamResampler(first.sample_rate, rate)
    async for chunk in iter_chunks(state, job, first):
        data = s16le(resample(chunk.audio))
        if data:
            yield data
    tail = resample(np.zeros(0, np.float32), last=True)  # the resampler's held-back samples
    if len(tail):
        yield s16le(tail)


async def _whole(state: AppState, job: Job, first: AudioChunk, fmt: str) -> AsyncIterator[bytes]:
    pieces = [c.audio async for c in iter_chunks(state, job, first)]
    data, _ = await asyncio.to_thread(encode_file, np.concatenate(pieces), first.sample_rate, fmt)
    yield data


def _sse(audio: AsyncIterator[bytes], n_input_chars: int) -> AsyncIterator[bytes]:
    async def events() -> AsyncIterator[bytes]:
        n_bytes = 0
        async for data in audio:
            n_bytes += len(data)
            event = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
            yield f"data: {json.dumps(event)}\n\n".encode()
        # Token counts have no meaning here; characters in and kilobytes out stand in for them.
        usage = {"input_tokens": n_input_chars, "output_tokens": n_bytes // 1024}
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        yield f"data: {json.dumps({'type': 'speech.audio.done', 'usage': usage})}\n\n".encode()

    return events()


@router.post("/v1/audio/speech")
async def speech(request: Request) -> StreamingResponse:
    state = app_state(request)
    req = validate(SpeechRequest, await read_json_body(request, allow_query=False))
    if req.response_format == "aac":
        raise BadRequestError(
            "response_format 'aac' is not available: this server has no AAC encoder; use mp3, opus, flac, wav or pcm"
        )
    target = state.catalog.resolve(req.model, req.voice_name)
    job, first = await start_job(
        state, target, req.input, route="/v1/audio/speech", rid=request_id(request), speed=req.speed
    )
    fmt = req.response_format
    rate = OPENAI_PCM_RATE if fmt == "pcm" else first.sample_rate
    if fmt in ("pcm", "wav"):
        audio = _progressive(state, job, first, fmt, rate)
    else:
        audio = _whole(state, job, first, fmt)
    headers = {"X-Voice": target.voice_name, "Cache-Control": "no-store"}
    if fmt in ("pcm", "wav"):
        headers["X-Sample-Rate"] = str(rate)
    if req.instructions:
        headers["X-VoiceHub-Note"] = INSTRUCTIONS_NOTE
    if req.stream_format == "sse":
        return StreamingResponse(_sse(audio, len(req.input)), media_type="text/event-stream", headers=headers)
    return StreamingResponse(audio, media_type=MEDIA_TYPES[fmt], headers=headers)


@router.get("/v1/models")
async def models(request: Request) -> JSONResponse:
    """Configured models, model families with voices, and the configured aliases.

    A configured model also carries `voicehub`: whether it is loaded and, once it is, what it says
    about itself (e.g. a GPT-SoVITS model's `text_frontend.polyphone_source`: g2pw or pypinyin).
    """
    state = app_state(request)
    names = state.catalog.model_names() + sorted(state.config.model_aliases)
    loaded = state.pool.info()
    data = []
    for name in names:
        entry = {"id": name, "object": "model", "created": 0, "owned_by": "voicehub"}
        if name in state.config.models:
            entry["voicehub"] = {"loaded": name in loaded, **loaded.get(name, {})}
        data.append(entry)
    return JSONResponse({"object": "list", "data": data})
