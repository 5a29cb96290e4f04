"""The FastAPI app: routes, error mapping, middleware and the worker's lifetime."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from voicehub.errors import VoiceHubError
from voicehub.models.base import TTSModel
from voicehub.server import routes_native, routes_openai, routes_voices, routes_ws
from voicehub.server.config import ModelSpec, ServerConfig
from voicehub.server.errors import error_body, status_of
from voicehub.server.middleware import APIKeyMiddleware, RequestContextMiddleware
from voicehub.server.state import AppState, request_id
from voicehub.voices import VoiceRegistry

log = logging.getLogger("voicehub.server")
EXPOSED_HEADERS = ["X-Request-ID", "X-Sample-Rate", "X-Channels", "X-Dtype", "X-Voice", "X-VoiceHub-Note"]


def _error_response(request: Request, exc: BaseException) -> JSONResponse:
    status, code = status_of(exc)
    rid = request_id(request)
    if status >= 500:
        log.error("request %s failed: %s: %s", rid, type(exc).__name__, exc, exc_info=exc)
        message = (
            str(exc)
            if code != "server_error"
            else f"internal error; quote request id {rid} when reporting it"
        )
    else:
        message = str(exc)
    return JSONResponse(error_body(message, code, rid), status_code=status)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(VoiceHubError)
    async def _voicehub(request: Request, exc: VoiceHubError) -> JSONResponse:
        return _error_response(request, exc)

    @app.exception_handler(ValueError)
    async def _value(request: Request, exc: ValueError) -> JSONResponse:
        return _error_response(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        body = error_body("invalid request: " + "; ".join(parts[:8]), "invalid_request", request_id(request))
        return JSONResponse(body, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail)
        if exc.status_code == 404:
            message = f"no route {request.url.path!r}; see /docs for the routes"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path!r}"
        return JSONResponse(
            error_body(
                message, "not_found" if exc.status_code == 404 else "invalid_request", request_id(request)
            ),
            status_code=exc.status_code,
        )

    @app.exception_handler(Exception)
    async def _any(request: Request, exc: Exception) -> JSONResponse:
        return _error_response(request, exc)


def playground_html() -> str:
    return resources.files("voicehub.server").joinpath("static/index.html").read_text(encoding="utf-8")


def create_app(
    config: ServerConfig,
    *,
    registry: VoiceRegistry | None = None,
    loader: Callable[[ModelSpec], TTSModel] | None = None,
) -> FastAPI:
    """Build the app. `loader` replaces how models are built from their specs (tests use fakes)."""
    state = AppState.build(config, registry, loader)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.worker.start()
        try:
            yield
        finally:  # the HTTP server has drained its streams by now: stop what is left
            state.worker.stop()

    app = FastAPI(title="VoiceHub", version="0.1.0", lifespan=lifespan)
    app.state.voicehub = state
    _install_error_handlers(app)
    for module in (routes_native, routes_openai, routes_voices, routes_ws):
        app.include_router(module.router)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def playground() -> HTMLResponse:
        return HTMLResponse(playground_html())

    # Added last = outermost: request ids first, then CORS (so 401s carry CORS headers), then keys.
    app.add_middleware(APIKeyMiddleware, keys=config.api_keys)
    if config.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(config.cors_origins),
            allow_methods=["GET", "POST", "PUT", "DELETE", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type", "X-API-Key", "X-Request-ID"],
            expose_headers=EXPOSED_HEADERS,
        )
    app.add_middleware(
        RequestContextMiddleware, metrics=state.metrics, max_body_bytes=config.limits.max_body_bytes
    )
    return app
