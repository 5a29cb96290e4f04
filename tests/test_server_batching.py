"""The server's batching of GPT-SoVITS streams over real HTTP (tiny `make-checkpoint` model, CPU).

Two streams requested at once run on one stream engine together and each returns what it returns
alone; a client that leaves frees its stream; `--no-batching` (server.batching = false) keeps the
one-stream worker. The tiny T2S never samples EOS, so every request is bounded with force_n_tokens.
"""

from __future__ import annotations

import argparse
import threading
import time
from dataclasses import replace

import httpx
import numpy as np
import pytest
from gpt_sovits_fixtures import REFERENCE_TEXT
from test_server_helpers import running_server

from voicehub.models.gpt_sovits import Voice
from voicehub.server import cli_commands
from voicehub.server.config import ConfigError, ModelSpec, ServerConfig, load_config
from voicehub.server.pool import load_model

TIMEOUT = 120.0
LONG = {"text": "A longer stream. With two sentences.", "seed": 1, "params": {"force_n_tokens": 24}}
SHORT = {"text": "A short one.", "seed": 2, "params": {"force_n_tokens": 12}}
STREAMING = {"stream_chunk_tokens": 4, "sample_steps": 2}


@pytest.fixture(scope="module")
def model(tiny_set):
    return load_model(ModelSpec("tiny-v3", path=str(tiny_set), model_type="gpt-sovits-v3"), "cpu")


def _config(tmp_path_factory, tiny_set, **overrides) -> ServerConfig:
    spec = ModelSpec("tiny-v3", path=str(tiny_set), model_type="gpt-sovits-v3")
    config = ServerConfig(
        data_dir=tmp_path_factory.mktemp("data"),
        models={"tiny-v3": spec},
        default_voice="tiny-v3",
        warmup_text="",
    )
    return replace(config, **overrides)


def _add_voice(url: str, wav) -> str:
    fields = {"name": "fox", "family": "gpt-sovits-v3", "transcript": REFERENCE_TEXT, "language": "en"}
    with open(wav, "rb") as fh:
        r = httpx.post(f"{url}/voices", data=fields, files={"audio": ("ref.wav", fh, "audio/wav")})
    assert r.status_code == 201, r.text
    return "fox"


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_set, model, reference_wav):
    with running_server(_config(tmp_path_factory, tiny_set), model) as (url, app):
        yield url, app, _add_voice(url, reference_wav)


def _body(request: dict, voice: str) -> dict:
    return {**request, "voice": voice, "params": {**request["params"], **STREAMING}}


def _speak(url: str, body: dict) -> np.ndarray:
    pieces = []
    with httpx.stream("POST", f"{url}/tts", json=body, timeout=TIMEOUT) as r:
        assert r.status_code == 200, r.read()
        for piece in r.iter_bytes():
            pieces.append(piece)
    return np.frombuffer(b"".join(pieces), "<f4")


def _engine(app):
    engines = app.state.voicehub.worker.batched._engines
    assert len(engines) == 1  # one model's weights: one engine
    return next(iter(engines.values()))[0]


def test_two_concurrent_streams_each_equal_their_solo_run(server):
    # every try: both streams equal their solo runs; the two must share a CFM call in one of three tries (when
    # they overlap is the machine's scheduling: on a loaded CI core the short one once started after the long
    # one's last CFM call)
    url, app, voice = server
    solo = [_speak(url, _body(r, voice)) for r in (LONG, SHORT)]
    engine = _engine(app)
    shared = False
    for _ in range(3):
        n_batches = len(engine.recent_cfm_batches)
        got: list = [None, None]

        def speak(i, request, out=got):
            out[i] = _speak(url, _body(request, voice))

        threads = [threading.Thread(target=speak, args=(i, r)) for i, r in enumerate((LONG, SHORT))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        for audio, alone in zip(got, solo):
            assert audio is not None and audio.shape == alone.shape
            np.testing.assert_allclose(audio, alone, atol=1e-4)
        assert engine.is_idle
        if any(len(b) == 2 for b in list(engine.recent_cfm_batches)[n_batches:]):
            shared = True
            break
    assert shared, "the two streams never shared a CFM call in three tries"


def test_a_client_that_leaves_frees_its_stream(server):
    url, app, voice = server
    engine = _engine(app)
    body = _body({"text": "Leaving early.", "seed": 3, "params": {"force_n_tokens": 200}}, voice)
    with httpx.stream("POST", f"{url}/tts", json=body, timeout=TIMEOUT) as r:
        assert r.status_code == 200
        next(r.iter_bytes())  # the first chunk, then the client goes
    deadline = time.monotonic() + 30
    while not engine.is_idle:
        assert time.monotonic() < deadline, "the engine kept the stream of a client that left"
        time.sleep(0.05)
    assert engine.scheduler.is_idle and bool(engine.t2s.state.done.all())


def test_no_batching_keeps_the_one_stream_worker(tmp_path_factory, tiny_set, model, reference_wav):
    with running_server(_config(tmp_path_factory, tiny_set, batching=False), model) as (url, app):
        voice = _add_voice(url, reference_wav)
        assert app.state.voicehub.worker.batched is None
        body = _body(SHORT, voice)
        audio = _speak(url, body)
        entry = app.state.voicehub.registry.get(voice)
    stored = Voice(entry.reference_audio, entry.transcript, entry.language)
    params = {**body["params"], "seed": body["seed"]}
    want = np.concatenate([c.audio for c in model.stream(body["text"], voice=stored, **params)])
    np.testing.assert_array_equal(audio, want)  # the single-stream path itself


def test_batching_is_on_by_default_and_the_flag_turns_it_off(tmp_path):
    parser = argparse.ArgumentParser()
    cli_commands.add_parsers(parser.add_subparsers(dest="command"))
    on = parser.parse_args(["serve", "--data-dir", str(tmp_path)])
    off = parser.parse_args(["serve", "--data-dir", str(tmp_path), "--no-batching"])
    assert cli_commands._server_config(on).batching is True
    assert cli_commands._server_config(off).batching is False
    toml = tmp_path / "server.toml"
    toml.write_text("[server]\nbatching = false\n[limits]\nmax_batch_streams = 8\n")
    config = load_config(toml)
    assert config.batching is False and config.limits.max_batch_streams == 8
    toml.write_text('[server]\nbatching = "no"\n')
    with pytest.raises(ConfigError, match="server.batching must be true or false"):
        load_config(toml)
