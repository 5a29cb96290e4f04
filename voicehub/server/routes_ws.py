"""WebSocket `/v1/audio/speech/stream`: text in as it is written, audio out sentence by sentence.

Client messages (JSON text frames): `session.config`, `input.text`, `input.flush`, `input.done`,
`session.cancel`. Server messages: `session.created`, `session.configured`, per chunk an
`audio.chunk` JSON header followed by one binary frame of PCM, `segment.done`, `session.cancelled`,
`error`, and `session.done` before it closes. The schema is in docs/server.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import Field

from voicehub.audio.io import to_pcm
from voicehub.errors import InvalidTextError, VoiceHubError
from voicehub.server.catalog import Target
from voicehub.server.encoding import NativeFormat
from voicehub.server.errors import BadRequestError, status_of
from voicehub.server.schemas import MAX_SPEED, MIN_SPEED, ParamValue, _Strict, validate
from voicehub.server.segment import Piece, Segmenter
from voicehub.server.state import AppState, app_state, request_id
from voicehub.server.worker import Job
from voicehub.text.limits import check_text

router = APIRouter()
MESSAGE_TYPES = ("session.config", "input.text", "input.flush", "input.done", "session.cancel")
MAX_MESSAGE_CHARS = 100_000


class SessionConfig(_Strict):
    type: str = "session.config"
    model: str | None = Field(default=None, max_length=64)
    voice: str | None = Field(default=None, max_length=64)
    format: NativeFormat = NativeFormat.F32LE
    seed: int | None = Field(default=None, ge=0)
    speed: float | None = Field(default=None, ge=MIN_SPEED, le=MAX_SPEED)
    params: dict[str, ParamValue] = Field(default_factory=dict, max_length=32)


@dataclass
class _Segment:
    index: int
    piece: Piece
    job: Job
    generation: int


class Session:
    def __init__(self, state: AppState, ws: WebSocket):
        self.state, self.ws = state, ws
        self.config = SessionConfig()
        self.target: Target | None = None
        self.segmenter = Segmenter()
        self.segments: asyncio.Queue[_Segment | None] = asyncio.Queue()
        self.jobs: list[Job] = []
        self.generation = 0  # session.cancel bumps it; older segments are dropped
        self.n_segments = self.n_chunks = 0
        self.send_lock = asyncio.Lock()

    async def send(self, message: dict[str, Any], audio: bytes | None = None) -> None:
        async with self.send_lock:  # a header and its binary frame must stay adjacent
            await self.ws.send_text(json.dumps(message))
            if audio is not None:
                await self.ws.send_bytes(audio)

    async def error(self, exc: BaseException) -> None:
        status, code = status_of(exc)
        message = str(exc) if status < 500 else "internal error while making audio; see the server log"
        await self.send({"type": "error", "code": code, "status": status, "message": message})

    def configure(self, data: dict[str, Any]) -> None:
        if self.n_segments:
            raise BadRequestError("session.config must come before the first input.text")
        config = validate(SessionConfig, data)
        self.target = self.state.catalog.resolve(config.model, config.voice)
        self.config = config

    def dispatch(self, pieces: list[Piece]) -> None:
        if self.target is None:
            self.target = self.state.catalog.resolve(None, None)
        for piece in pieces:
            try:
                text = check_text(piece.text, self.state.config.limits.max_text_chars)
            except InvalidTextError:
                continue  # punctuation only: nothing to say
            job = Job(
                self.target.spec,
                text,
                voice=self.target.voice,
                seed=self.config.seed,
                speed=self.config.speed,
                params={**self.target.params, **self.config.params},
                timeout_s=self.state.config.limits.request_timeout_s,
            )
            self.state.worker.submit(job)  # QueueFullError goes back to the client as an error
            self.jobs.append(job)
            self.segments.put_nowait(_Segment(self.n_segments, piece, job, self.generation))
            self.n_segments += 1

    def cancel(self) -> None:
        self.generation += 1
        for job in self.jobs:
            job.cancel()
        self.jobs.clear()
        self.segmenter.clear()

    async def handle(self, data: dict[str, Any]) -> bool:
        """Act on one client message; False when the client has said input.done."""
        kind = data.get("type")
        if kind == "session.config":
            self.configure(data)
            assert self.target is not None
            # The sample rate is in each audio.chunk header: it is known once the worker has the model.
            await self.send(
                {
                    "type": "session.configured",
                    "voice": self.target.voice_name,
                    "format": self.config.format.value,
                }
            )
        elif kind == "input.text":
            text = data.get("text")
            if not isinstance(text, str):
                raise BadRequestError("input.text needs a 'text' string")
            if len(self.segmenter.buffer) + len(text) > self.state.config.limits.max_text_chars:
                raise BadRequestError(
                    f"more than {self.state.config.limits.max_text_chars:,} characters are waiting unspoken; "
                    "send input.flush or end sentences with punctuation"
                )
            self.dispatch(self.segmenter.feed(text))
        elif kind == "input.flush":
            self.dispatch(self.segmenter.flush())
        elif kind == "input.done":
            self.dispatch(self.segmenter.flush())
            return False
        elif kind == "session.cancel":
            self.cancel()
            await self.send({"type": "session.cancelled"})
        else:
            raise BadRequestError(f"unknown message type {kind!r}; valid types: {', '.join(MESSAGE_TYPES)}")
        return True

    async def sender(self) -> None:
        """Send each segment's audio in order, as its chunks arrive."""
        while (segment := await self.segments.get()) is not None:
            if segment.generation != self.generation:
                continue
            try:
                await self.send_segment(segment)
            except Exception as exc:
                if segment.generation == self.generation:
                    await self.error(exc)
        await self.send({"type": "session.done", "n_segments": self.n_segments, "n_chunks": self.n_chunks})

    async def send_segment(self, segment: _Segment) -> None:
        fmt = self.config.format
        piece, job = segment.piece, segment.job
        n = 0
        while (chunk := await job.next()) is not None:
            if segment.generation != self.generation:
                job.cancel()
                return
            if n == 0:
                self.state.metrics.first_audio.labels("/v1/audio/speech/stream").observe(
                    time.monotonic() - job.created
                )
            pos = piece.text.find(chunk.text) if chunk.text else -1
            start, end = (
                (piece.start + pos, piece.start + pos + len(chunk.text))
                if pos >= 0
                else (piece.start, piece.end)
            )
            header = {
                "type": "audio.chunk",
                "index": self.n_chunks,
                "segment": segment.index,
                "chunk": n,
                "sample_rate": chunk.sample_rate,
                "format": fmt.value,
                "channels": 1,
                "n_samples": len(chunk.audio),
                "text": chunk.text,
                "text_start": start,
                "text_end": end,
                "is_last": chunk.is_last,
            }
            await self.send(header, to_pcm(chunk.audio, fmt.audio_format))
            self.state.metrics.audio_seconds.inc(chunk.duration)
            self.n_chunks += 1
            n += 1
        await self.send({"type": "segment.done", "segment": segment.index, "text": piece.text, "n_chunks": n})


async def _receive(ws: WebSocket, timeout: float) -> dict[str, Any] | None:
    """The next JSON message; None for a frame that is not a JSON object (already answered)."""
    message = await asyncio.wait_for(ws.receive(), timeout=timeout)
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000))
    text = message.get("text")
    if text is None or len(text) > MAX_MESSAGE_CHARS:
        raise BadRequestError(f"send JSON text messages of at most {MAX_MESSAGE_CHARS:,} characters")
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise BadRequestError(
            'a message is not valid JSON; send objects like {"type": "input.text", "text": "..."}'
        ) from None
    if not isinstance(data, dict):
        raise BadRequestError("each message must be a JSON object with a 'type'")
    return data


@router.websocket("/v1/audio/speech/stream")
async def speech_stream(ws: WebSocket) -> None:
    state = app_state(ws)
    await ws.accept()
    session = Session(state, ws)
    await session.send(
        {"type": "session.created", "session_id": request_id(ws), "voice": state.config.default_voice}
    )
    sender = asyncio.create_task(session.sender())
    idle = state.config.limits.ws_idle_timeout_s
    try:
        while True:
            try:
                data = await _receive(ws, idle)
                if not await session.handle(data):
                    break
            except (VoiceHubError, ValueError, LookupError) as exc:  # the client's mistake, or a full queue
                await session.error(exc)
        session.segments.put_nowait(None)
        await sender
        await ws.close(1000)
    except (WebSocketDisconnect, TimeoutError, RuntimeError):
        session.cancel()  # the client left or went idle: stop its work
        sender.cancel()
        with contextlib.suppress(Exception):
            await ws.close(1000)
    finally:
        session.cancel()
        if not sender.done():
            sender.cancel()
