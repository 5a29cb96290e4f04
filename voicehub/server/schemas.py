"""Per-request parameters, validated with pydantic in one place; unknown fields are refused."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.requests import Request

from voicehub.server.encoding import FileFormat, NativeFormat
from voicehub.server.errors import BadRequestError, ServerError

ParamValue = float | int | str | bool
MIN_SPEED, MAX_SPEED = 0.25, 4.0  # OpenAI's range


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", str_max_length=1_000_000)


class SynthesisParams(_Strict):
    """Fields both native routes take. params: family parameters (e.g. noise_scale, sample_steps)."""

    text: str = Field(min_length=1)
    voice: str | None = Field(default=None, max_length=64)
    model: str | None = Field(default=None, max_length=64)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    speed: float | None = Field(default=None, ge=MIN_SPEED, le=MAX_SPEED)
    params: dict[str, ParamValue] = Field(default_factory=dict, max_length=32)


class StreamRequest(SynthesisParams):
    format: NativeFormat = NativeFormat.F32LE


class FileRequest(SynthesisParams):
    format: FileFormat = FileFormat.WAV


class VoiceRef(_Strict):
    id: str = Field(max_length=64)


class SpeechRequest(BaseModel):
    """OpenAI's `POST /v1/audio/speech` body."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(max_length=64)
    input: str = Field(min_length=1)
    voice: str | VoiceRef
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: float = Field(default=1.0, ge=MIN_SPEED, le=MAX_SPEED, strict=True)  # JSON only: no "1" or true
    instructions: str | None = Field(default=None, max_length=4096)
    stream_format: Literal["audio", "sse"] = "audio"

    @field_validator("voice")
    @classmethod
    def _voice_name(cls, v: str | VoiceRef) -> str | VoiceRef:
        if isinstance(v, str) and len(v) > 64:
            raise ValueError("voice names are at most 64 characters")
        return v

    @property
    def voice_name(self) -> str:
        return self.voice.id if isinstance(self.voice, VoiceRef) else self.voice


def describe(exc: ValidationError) -> str:
    """One readable sentence per problem: 'text: Field required; speed: Input should be ...'."""
    parts = []
    for err in exc.errors(include_url=False, include_input=False):
        where = ".".join(str(p) for p in err["loc"]) or "body"
        parts.append(f"{where}: {err['msg']}")
    return "invalid request: " + "; ".join(parts[:8])


def validate(model: type[BaseModel], data: Any) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ValidationFailed(describe(exc)) from None


class ValidationFailed(ServerError):
    status, code = 422, "invalid_request"


def parse_json(raw: bytes | str) -> Any:
    """JSON from UTF-8 bytes (RFC 8259); anything else, or nesting too deep to parse, is a 400."""
    try:
        return json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)
    except UnicodeDecodeError:
        raise BadRequestError("the body is not UTF-8 text; send a JSON object encoded as UTF-8") from None
    except json.JSONDecodeError as exc:
        raise BadRequestError(f"the body is not valid JSON ({exc}); send a JSON object") from None
    except RecursionError:
        raise BadRequestError("the JSON is nested too deeply; send a flat JSON object") from None


async def read_json_body(request: Request, *, allow_query: bool) -> dict[str, Any]:
    """The JSON object in the body, with query parameters filling fields the body leaves out."""
    raw = await request.body()
    data: dict[str, Any] = {}
    if raw.strip():
        data = parse_json(raw)
        if not isinstance(data, dict):
            raise BadRequestError(f"the body must be a JSON object, not a {type(data).__name__}")
    if allow_query:
        for key, value in request.query_params.items():
            data.setdefault(key, value)
    elif request.query_params:
        raise BadRequestError("this route takes its parameters in a JSON body, not in the query string")
    return data
