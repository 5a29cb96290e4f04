"""ASGI middleware: request ids and structured logs, body-size limit, API-key check.

Pure ASGI (not BaseHTTPMiddleware) so streamed responses pass through untouched and a client's
disconnect still reaches the route.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import time
import uuid
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from voicehub.server.errors import PayloadTooLargeError, error_body
from voicehub.server.metrics import Metrics

log = logging.getLogger("voicehub.server")
_CLIENT_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
# Probes and the page itself are open: load balancers check them without keys, and the page asks
# for the key and sends it with each call.
PUBLIC_PATHS = frozenset({"/", "/health", "/ready", "/favicon.ico"})


async def send_json(
    send: Send, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]]
) -> None:
    data = json.dumps(body).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *headers]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": data})


class RequestContextMiddleware:
    """Gives each request an id (a safe client X-Request-ID, else a new one), logs one JSON line per
    request, counts it, and refuses bodies over `max_body_bytes` with 413."""

    def __init__(self, app: ASGIApp, metrics: Metrics, max_body_bytes: int):
        self.app, self.metrics, self.max_body_bytes = app, metrics, max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers", []))
        given = headers.get(b"x-request-id", b"").decode("latin-1")
        rid = given if _CLIENT_ID_RE.fullmatch(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        id_header = (b"x-request-id", rid.encode())
        status = {"code": 101 if scope["type"] == "websocket" else 500}
        t0 = time.perf_counter()

        if scope["type"] == "http":
            length = headers.get(b"content-length", b"0")
            if length.isdigit() and int(length) > self.max_body_bytes:
                status["code"] = 413
                msg = f"the request body is over the limit of {self.max_body_bytes:,} bytes"
                await send_json(send, 413, error_body(msg, "payload_too_large", rid), [id_header])
                return self._log(scope, rid, 413, t0)

        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:  # a chunked body with no Content-Length
                    raise PayloadTooLargeError(
                        f"the request body is over the limit of {self.max_body_bytes:,} bytes"
                    )
            return message

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                message["headers"] = [*message.get("headers", []), id_header]
            elif message["type"] == "websocket.close" and status["code"] == 101:
                status["code"] = message.get("code", 1000)
            await send(message)

        try:
            await self.app(scope, limited_receive, send_with_id)
        finally:
            self._log(scope, rid, status["code"], t0)

    def _log(self, scope: Scope, rid: str, status: int, t0: float) -> None:
        route = scope.get("route")
        path = getattr(route, "path", None) or "unmatched"
        self.metrics.requests.labels(path, str(status)).inc()
        record = {
            "event": "request",
            "request_id": rid,
            "method": scope.get("method", "WS"),
            "path": scope.get("path"),
            "status": status,
            "duration_ms": round((time.perf_counter() - t0) * 1000, 1),
        }
        log.info(json.dumps(record))


class APIKeyMiddleware:
    """Requires `Authorization: Bearer KEY` (or `X-API-Key: KEY`) on every route but the public ones.

    Every configured key is compared in constant time, and a wrong key and a missing one get the
    same 401, so a caller learns nothing about which part failed.
    """

    def __init__(self, app: ASGIApp, keys: tuple[str, ...]):
        self.app = app
        self.keys = [k.encode() for k in keys]

    def _authorized(self, scope: Scope) -> bool:
        headers = dict(scope.get("headers", []))
        auth = headers.get(b"authorization", b"")
        given = auth[7:].strip() if auth[:7].lower() == b"bearer " else headers.get(b"x-api-key", b"")
        ok = False
        for key in self.keys:  # no early exit: the time taken does not depend on which key matched
            ok |= hmac.compare_digest(given, key)
        return ok

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or not self.keys or scope["path"] in PUBLIC_PATHS:
            return await self.app(scope, receive, send)
        if scope["type"] == "http" and scope["method"] == "OPTIONS":
            return await self.app(scope, receive, send)  # CORS preflights carry no credentials
        if self._authorized(scope):
            return await self.app(scope, receive, send)
        rid = scope.get("state", {}).get("request_id", "")
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": "missing or invalid API key"})
            return
        msg = "missing or invalid API key; send it as 'Authorization: Bearer <key>'"
        await send_json(
            send, 401, error_body(msg, "invalid_api_key", rid), [(b"www-authenticate", b"Bearer")]
        )
