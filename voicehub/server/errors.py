"""Server-side errors and how each maps to an HTTP status and an OpenAI-style error body."""

from __future__ import annotations

from typing import Any

from voicehub.errors import AudioFormatError, InvalidTextError, ModelNotFoundError, VoiceHubError
from voicehub.voices import VoiceError, VoiceExistsError, VoiceNotFoundError


class ServerError(VoiceHubError):
    """An error with its HTTP status; `code` is a short machine-readable word."""

    status = 500
    code = "server_error"

    def __init__(self, message: str, **extra: Any):
        super().__init__(message)
        self.extra = extra


class BadRequestError(ServerError):
    status, code = 400, "invalid_request"


class UnauthorizedError(ServerError):
    status, code = 401, "invalid_api_key"


class NotFoundError(ServerError):
    status, code = 404, "not_found"


class ConflictError(ServerError):
    status, code = 409, "conflict"


class PayloadTooLargeError(ServerError):
    status, code = 413, "payload_too_large"


class QueueFullError(ServerError):
    status, code = 503, "queue_full"


class NotReadyError(ServerError):
    status, code = 503, "not_ready"


class RequestTimeoutError(ServerError):
    status, code = 504, "timeout"


class CancelledError(ServerError):
    """The job was cancelled (client gone, session.cancel, or shutdown)."""

    status, code = 499, "cancelled"


def status_of(exc: BaseException) -> tuple[int, str]:
    """(HTTP status, code) for an exception a handler or the worker raised; unknown ones are 500."""
    if isinstance(exc, ServerError):
        return exc.status, exc.code
    if isinstance(exc, VoiceNotFoundError | ModelNotFoundError):
        return 404, "not_found"
    if isinstance(exc, VoiceExistsError):
        return 409, "conflict"
    if isinstance(exc, AudioFormatError | InvalidTextError | VoiceError):
        return 400, "invalid_request"
    if isinstance(exc, VoiceHubError | ValueError):
        return 400, "invalid_request"
    return 500, "server_error"


def error_body(message: str, code: str, request_id: str | None = None) -> dict[str, Any]:
    """The body OpenAI clients parse: {"error": {"message", "type", "code"}}."""
    kind = (
        "invalid_request_error"
        if code not in ("server_error", "queue_full", "not_ready", "timeout")
        else code
    )
    body: dict[str, Any] = {"error": {"message": message, "type": kind, "code": code}}
    if request_id:
        body["error"]["request_id"] = request_id
    return body
