"""`/voices`: list, show, add (multipart upload), update and delete registry voices.

Reference audio arrives as an uploaded file and the server stores it under its data folder;
a client never names a server path. Model files cannot be set over HTTP either (loading a
client-named checkpoint would run whatever it holds): a voice added here runs on the configured
model of its family. Set model files from the CLI or Python on the server's machine.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import UploadFile

from voicehub.server.errors import BadRequestError, ConflictError, PayloadTooLargeError
from voicehub.server.schemas import read_json_body
from voicehub.server.state import AppState, app_state
from voicehub.voices import check_name

router = APIRouter()
FIELDS = ("name", "family", "transcript", "language", "params")
MAX_FORM_FIELDS = 16


async def _read_upload(upload: UploadFile, limit: int) -> bytes:
    data = await upload.read(limit + 1)
    if len(data) > limit:
        raise PayloadTooLargeError(f"the audio file is over the upload limit of {limit:,} bytes")
    if not data:
        raise BadRequestError("the uploaded audio file is empty")
    return data


async def _voice_form(request: Request, state: AppState) -> tuple[dict[str, Any], bytes | None]:
    """The voice's fields and the audio bytes, from multipart/form-data or a JSON body (no audio)."""
    ctype = request.headers.get("content-type", "")
    audio = None
    if ctype.startswith("multipart/form-data"):
        form = await request.form(max_files=1, max_fields=MAX_FORM_FIELDS)
        fields: dict[str, Any] = {}
        for key, value in form.multi_items():
            if key == "audio" and isinstance(value, UploadFile):
                audio = await _read_upload(value, state.config.limits.max_upload_bytes)
            elif isinstance(value, UploadFile):
                raise BadRequestError(f"unexpected file field {key!r}; send the reference audio as 'audio'")
            else:
                fields[key] = value
        if "params" in fields:
            try:
                fields["params"] = json.loads(fields["params"])
            except (json.JSONDecodeError, RecursionError):
                raise BadRequestError("the 'params' field must be a JSON object") from None
    else:
        fields = await read_json_body(request, allow_query=False)
    if "model_files" in fields:
        raise BadRequestError(
            "model_files cannot be set over HTTP; the voice runs on the configured model of its family "
            "(set model files with `voicehub voices add` on the server)"
        )
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise BadRequestError(
            f"unknown field(s) {unknown}; voice fields: {', '.join(FIELDS)}, and the file 'audio'"
        )
    for key in ("name", "family", "transcript", "language"):
        if key in fields and not isinstance(fields[key], str):
            raise BadRequestError(f"field {key!r} must be a string")
    if "params" in fields and not isinstance(fields["params"], dict):
        raise BadRequestError("field 'params' must be a JSON object")
    return fields, audio


def _entries(state: AppState) -> list[dict[str, Any]]:
    out = [{"name": n, "family": s.model_type, "source": "model"} for n, s in state.config.models.items()]
    out += [{**v.to_dict(), "source": "config"} for v in state.catalog.config_voices.values()]
    out += [{**v.to_dict(), "source": "registry"} for v in state.registry.list()]
    return out


def _writable(state: AppState, name: str) -> None:
    check_name(name)
    if name in state.catalog.config_voices or name in state.config.models:
        raise ConflictError(f"{name!r} is defined in the server config; change it there")


@router.get("/voices")
async def list_voices(request: Request) -> JSONResponse:
    state = app_state(request)
    voices = await asyncio.to_thread(_entries, state)
    return JSONResponse({"voices": voices, "default": state.config.default_voice})


@router.get("/voices/{name}")
async def show_voice(name: str, request: Request) -> JSONResponse:
    state = app_state(request)
    check_name(name)
    if name in state.catalog.config_voices:
        return JSONResponse({**state.catalog.config_voices[name].to_dict(), "source": "config"})
    entry = await asyncio.to_thread(state.registry.get, name)
    return JSONResponse({**entry.to_dict(), "source": "registry"})


@router.post("/voices", status_code=201)
async def add_voice(request: Request) -> JSONResponse:
    state = app_state(request)
    fields, audio = await _voice_form(request, state)
    if "name" not in fields or "family" not in fields:
        raise BadRequestError(
            "a new voice needs 'name' and 'family' (and for gpt-sovits-v3: audio, transcript, language)"
        )
    _writable(state, fields["name"])
    name, family = fields.pop("name"), fields.pop("family")
    entry = await asyncio.to_thread(state.registry.add, name, family, reference_audio=audio, **fields)
    return JSONResponse({**entry.to_dict(), "source": "registry"}, status_code=201)


@router.put("/voices/{name}")
async def update_voice(name: str, request: Request) -> JSONResponse:
    state = app_state(request)
    _writable(state, name)
    fields, audio = await _voice_form(request, state)
    if fields.pop("name", name) != name:
        raise BadRequestError("a voice cannot be renamed; add it under the new name and delete the old one")
    entry = await asyncio.to_thread(state.registry.update, name, reference_audio=audio, **fields)
    return JSONResponse({**entry.to_dict(), "source": "registry"})


@router.delete("/voices/{name}", status_code=204)
async def delete_voice(name: str, request: Request) -> Response:
    state = app_state(request)
    _writable(state, name)
    await asyncio.to_thread(state.registry.delete, name)
    return Response(status_code=204)
