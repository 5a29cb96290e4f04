"""GPT-SoVITS v3 voices over real HTTP: a tiny `make-checkpoint` model configured in the server, a voice
uploaded over `POST /voices`, then spoken through `POST /tts` and `POST /v1/audio/speech`.

The tiny random T2S never emits EOS, so every request is bounded by `force_n_tokens`: `/tts` passes it in
its `params`; OpenAI's request has no family parameters, so the voice carries it as a default parameter
(a request's own params override the voice's). At speed 1.0, N tokens give floor(3.75 N) mel frames of
256 samples: exactly N x 960 samples at 24 kHz when N is a multiple of 4.
"""

from __future__ import annotations

import json
import time

import httpx
import numpy as np
import pytest
from gpt_sovits_fixtures import REFERENCE_TEXT
from test_server_helpers import running_server

from voicehub.models.gpt_sovits.sovits import SAMPLES_PER_TOKEN
from voicehub.server.config import ModelSpec, ServerConfig
from voicehub.server.pool import load_model

SR = 24000
VOICE_TOKENS = 8  # the uploaded voice's default force_n_tokens
REQUEST_TOKENS = 12  # /tts overrides it per request
TEXT = "Hello from the server."  # one sentence: one chunk, no pause
TIMEOUT = 120.0


@pytest.fixture(scope="module")
def server(tiny_set, tmp_path_factory):
    spec = ModelSpec("tiny-v3", path=str(tiny_set), model_type="gpt-sovits-v3")
    config = ServerConfig(
        data_dir=tmp_path_factory.mktemp("data"),
        models={"tiny-v3": spec},
        default_voice="tiny-v3",
        warmup_text="",
    )
    model = load_model(spec, "cpu")  # the server's own loader, once per module
    with running_server(config, model) as (url, _):
        yield url


@pytest.fixture(scope="module")
def voice(server, reference_wav):
    fields = {
        "name": "fox",
        "family": "gpt-sovits-v3",
        "transcript": REFERENCE_TEXT,
        "language": "en",
        "params": json.dumps({"force_n_tokens": VOICE_TOKENS, "seed": 3}),
    }
    with open(reference_wav, "rb") as fh:
        r = httpx.post(f"{server}/voices", data=fields, files={"audio": ("ref.wav", fh, "audio/wav")})
    assert r.status_code == 201, r.text
    body = r.json()
    assert (
        body["family"] == "gpt-sovits-v3" and body["has_reference_audio"] and 4.0 < body["duration_s"] < 6.0
    )
    return "fox"


def test_tts_speaks_an_uploaded_voice(server, voice):
    body = {
        "text": TEXT,
        "voice": voice,
        "speed": 1.0,
        "seed": 1,
        "params": {"force_n_tokens": REQUEST_TOKENS},
    }
    r = httpx.post(f"{server}/tts", json=body, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    assert (r.headers["x-sample-rate"], r.headers["x-dtype"], r.headers["x-voice"]) == (
        str(SR),
        "f32le",
        voice,
    )
    audio = np.frombuffer(r.content, "<f4")
    assert len(audio) == REQUEST_TOKENS * SAMPLES_PER_TOKEN
    assert np.isfinite(audio).all() and np.abs(audio).max() > 0


def test_openai_speech_speaks_an_uploaded_voice(server, voice):
    body = {"model": "gpt-sovits-v3", "voice": voice, "input": TEXT, "response_format": "pcm"}
    r = httpx.post(f"{server}/v1/audio/speech", json=body, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    # The model's 24 kHz is OpenAI's pcm rate: no resampling, so the length is exact.
    assert r.headers["x-sample-rate"] == str(SR)
    assert len(r.content) == 2 * VOICE_TOKENS * SAMPLES_PER_TOKEN  # s16le
    # The configured model's name works as well as the family's; the voice's seed makes it repeatable.
    again = httpx.post(f"{server}/v1/audio/speech", json={**body, "model": "tiny-v3"}, timeout=TIMEOUT)
    assert again.status_code == 200 and again.content == r.content


def test_unknown_voice_is_404_listing_the_valid_names(server, voice):
    for route, body in (
        ("/tts", {"text": TEXT, "voice": "nobody"}),
        ("/v1/audio/speech", {"model": "gpt-sovits-v3", "voice": "nobody", "input": TEXT}),
    ):
        r = httpx.post(f"{server}{route}", json=body, timeout=TIMEOUT)
        assert r.status_code == 404, r.text
        message = r.json()["error"]["message"]
        assert "'nobody'" in message and voice in message and "tiny-v3" in message


def test_models_lists_the_model_its_family_and_its_text_frontend(server):
    deadline = time.monotonic() + 30
    while httpx.get(f"{server}/ready").status_code != 200:  # the default voice's model is preloaded
        assert time.monotonic() < deadline, "the server never became ready"
        time.sleep(0.05)
    data = {m["id"]: m for m in httpx.get(f"{server}/v1/models").json()["data"]}
    assert {"tiny-v3", "gpt-sovits-v3"} <= set(data)
    info = data["tiny-v3"]["voicehub"]
    assert info["loaded"] and info["model_type"] == "gpt-sovits-v3" and info["sample_rate"] == SR
    assert info["text_frontend"] == {"polyphone_source": "pypinyin", "g2pw_model_dir": None}
    assert "voicehub" not in data["gpt-sovits-v3"]  # a family name, not a model


def test_request_seed_overrides_the_voice_seed(server, voice):
    def speak(**fields):
        body = {"text": TEXT, "voice": voice, "speed": 1.0, "params": {"force_n_tokens": 4}, **fields}
        r = httpx.post(f"{server}/tts", json=body, timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        return r.content

    voice_seed = speak()  # the voice's params hold seed 3
    assert speak(seed=3) == voice_seed
    assert speak(seed=4) != voice_seed
