"""The real server process: SIGTERM drains a stream in flight; the embedded Piper voice over HTTP."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
import soundfile as sf
from test_server_helpers import free_port, running_server

from voicehub.server.config import ServerConfig


def _start(tmp_path, port: int) -> subprocess.Popen:
    config = tmp_path / "server.toml"
    config.write_text(
        f"""
        [server]
        port = {port}
        data_dir = "{tmp_path / "data"}"
        default_voice = "sine"
        warmup_text = ""
        [limits]
        drain_timeout_s = 20
        [models.sine]
        factory = "voicehub.server.fake:SineModel"
        options = {{ delay_s = 0.05 }}
        """
    )
    code = f"from voicehub.server.config import load_config; from voicehub.server.serve import serve; serve(load_config({str(config)!r}))"
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready").status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(proc.stderr.read().decode()[-2000:])


def test_sigterm_drains_a_stream_in_flight_then_exits(tmp_path):
    port = free_port()
    proc = _start(tmp_path, port)
    try:
        words = " ".join(f"w{i}" for i in range(30))  # 30 chunks, 0.05 s each: 1.5 s of work
        with httpx.stream("POST", f"http://127.0.0.1:{port}/tts", json={"text": words}, timeout=30) as r:
            stream = r.iter_raw()
            pieces = [next(stream)]
            proc.send_signal(signal.SIGTERM)
            pieces += list(stream)
        assert len(b"".join(pieces)) == 30 * 2205 * 4  # the whole utterance arrived
        # uvicorn re-raises the signal once its graceful shutdown is done, so the status says SIGTERM.
        assert proc.wait(timeout=15) in (0, -signal.SIGTERM)
        log = proc.stderr.read().decode()
        assert '"event": "request"' in log and '"status": 200' in log  # structured JSON logs
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health")


def _has_vits() -> bool:
    try:
        import voicehub.models.vits as vits
    except ImportError:
        return False
    return hasattr(vits, "FAMILY") and bool(vits.FAMILY.installed())


@pytest.mark.skipif(not _has_vits(), reason="the VITS family (voicehub.models.vits.FAMILY) is not built yet")
def test_embedded_piper_voice_over_http(tmp_path):
    openai = pytest.importorskip("openai")
    from voicehub.server.pool import load_model

    config = ServerConfig(data_dir=tmp_path, warmup_text="")  # no arguments: the embedded voice
    model = load_model(config.models["en_US-joe-medium"], "cpu")
    with running_server(config, model) as (url, _):
        r = httpx.post(f"{url}/tts", json={"text": "Hello from the server.", "seed": 1}, timeout=120)
        assert r.status_code == 200 and r.headers["x-sample-rate"] == "22050"
        audio = np.frombuffer(r.content, "<f4")
        assert 0.6 < len(audio) / 22050 < 4.0 and np.sqrt(np.mean(audio**2)) > 0.01
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
        resp = client.audio.speech.create(
            model="en_US-joe-medium",
            voice="en_US-joe-medium",
            input="Hello from the server.",
            response_format="flac",
        )
        flac, rate = sf.read(io.BytesIO(resp.content))
        assert rate == 22050 and abs(len(flac) - len(audio)) < 0.3 * 22050  # same text, similar length
    assert os.environ.get("HF_HUB_OFFLINE") == "1"  # conftest keeps this offline
