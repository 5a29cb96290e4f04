"""Run the app on uvicorn: JSON log lines, a key check for public binds, and a drain on SIGTERM.

uvicorn handles SIGTERM and SIGINT: it stops accepting connections, lets in-flight HTTP
responses (streams included) finish for up to `limits.drain_timeout_s`, then runs the app's
shutdown, which stops the worker. Open WebSocket sessions are closed with code 1012.
"""

from __future__ import annotations

import json
import logging
import sys
import time

from voicehub.server.config import ServerConfig


class JsonFormatter(logging.Formatter):
    """One JSON object per line; a message that is itself a JSON object is merged in."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        message = record.getMessage()
        try:
            parsed = json.loads(message) if message.startswith("{") else None
        except json.JSONDecodeError:
            parsed = None
        out.update(parsed if isinstance(parsed, dict) else {"message": message})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure_logging(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    for name in ("voicehub", "uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level.upper())
        logger.propagate = False


def serve(config: ServerConfig, log_level: str = "info") -> None:
    """Check the config, build the app and serve until SIGTERM/SIGINT (then drain and exit)."""
    import uvicorn

    from voicehub.server.app import create_app

    config.check()
    configure_logging(log_level)
    app = create_app(config)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_config=None,
            access_log=False,  # RequestContextMiddleware writes one JSON line per request instead
            timeout_graceful_shutdown=int(config.limits.drain_timeout_s) or None,
            ws_max_size=4 * 1024 * 1024,
        )
    )
    server.run()
