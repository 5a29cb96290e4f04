"""Helpers the server tests share: a real uvicorn on a free loopback port, the sine model, audio bytes.

(Named test_server_* so it sits in the server's test files; it holds no tests itself.)
"""

from __future__ import annotations

import io
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import uvicorn

from voicehub.server.app import create_app
from voicehub.server.config import Limits, ModelSpec, ServerConfig
from voicehub.server.fake import SineModel

API_KEY = "test-key-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sine_config(data_dir: Path, **overrides: Any) -> ServerConfig:
    limits = overrides.pop("limits", {})
    spec = ModelSpec("sine", model_type="sine", factory="voicehub.server.fake:SineModel", preload=True)
    config = ServerConfig(data_dir=data_dir, models={"sine": spec}, default_voice="sine", warmup_text="")
    return replace(config, limits=Limits(**limits), **overrides)


@contextmanager
def running_server(config: ServerConfig, model: SineModel | None = None) -> Iterator[tuple[str, Any]]:
    """Serve `config` on 127.0.0.1:<free port> in a thread; yields (base_url, app). `model` replaces the sine model."""
    model = model or SineModel()
    app = create_app(config, loader=lambda spec: model)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False, lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        if getattr(model, "gate", None) is not None:
            model.gate.set()
        server.should_exit = True
        thread.join(10)


def expected_audio(text: str, **kwargs: Any) -> np.ndarray:
    """What the sine model makes for `text`, straight from the model (the reference for server output)."""
    return SineModel(**kwargs).generate(text).audio


def wav_bytes(seconds: float, rate: int = 16000, channels: int = 1, fmt: str = "WAV") -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    audio = 0.3 * np.sin(2 * np.pi * 200 * t)
    data = np.stack([audio] * channels, axis=1) if channels > 1 else audio
    buf = io.BytesIO()
    sf.write(buf, data.astype(np.float32), rate, format=fmt, subtype="PCM_16")
    return buf.getvalue()
