"""Native and OpenAI-compatible routes over real HTTP (uvicorn on loopback, httpx and the openai client)."""

from __future__ import annotations

import base64
import io
import json
import threading
import time

import httpx
import numpy as np
import pytest
import soundfile as sf
import soxr
from test_server_helpers import expected_audio, running_server, sine_config

from voicehub.server.fake import SineModel

TEXT = "one two three four"
S16_TOL = 1.0 / 32767 + 1e-6  # one s16 step


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    config = sine_config(
        tmp_path_factory.mktemp("data"), model_aliases={"tts-1": "sine"}, voice_aliases={"alloy": "sine"}
    )
    with running_server(config) as (url, app):
        yield url


def test_tts_streams_f32_and_s16_pcm_equal_to_the_model(server):
    want = expected_audio(TEXT)
    r = httpx.post(f"{server}/tts", json={"text": TEXT})
    assert r.status_code == 200
    assert (r.headers["x-sample-rate"], r.headers["x-channels"], r.headers["x-dtype"]) == (
        "22050",
        "1",
        "f32le",
    )
    np.testing.assert_array_equal(np.frombuffer(r.content, "<f4"), want)
    r = httpx.post(f"{server}/tts?format=s16le", json={"text": TEXT})
    assert r.headers["x-dtype"] == "s16le"
    got = np.frombuffer(r.content, "<i2") / 32767.0
    assert np.abs(got - want).max() <= S16_TOL


def test_tts_takes_query_parameters_without_a_body(server):
    r = httpx.post(f"{server}/tts", params={"text": TEXT, "format": "s16le", "seed": "3"})
    assert r.status_code == 200 and len(r.content) == 2 * len(expected_audio(TEXT))


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus"])
def test_tts_file_formats_decode_to_the_utterance(server, fmt):
    want = expected_audio(TEXT)
    r = httpx.post(f"{server}/tts/file", json={"text": TEXT, "format": fmt})
    assert r.status_code == 200, r.text
    audio, rate = sf.read(io.BytesIO(r.content), dtype="float32")
    assert rate == (24000 if fmt == "opus" else 22050)
    assert abs(len(audio) / rate - len(want) / 22050) < 0.08  # codec padding only
    if fmt in ("wav", "flac"):
        assert np.abs(audio - want).max() <= S16_TOL


def test_openai_client_file_and_streamed_pcm(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused")
    resp = client.audio.speech.create(model="sine", voice="sine", input=TEXT, response_format="wav")
    audio, rate = sf.read(io.BytesIO(resp.content), dtype="float32")
    assert rate == 22050 and np.abs(audio - expected_audio(TEXT)).max() <= S16_TOL

    pieces = []
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=TEXT, response_format="pcm"
    ) as stream:
        for piece in stream.iter_bytes():
            pieces.append(piece)
    got = np.frombuffer(b"".join(pieces), "<i2") / 32767.0
    # 24 kHz by a streaming libsoxr HQ resampler: equal to a one-shot resample up to its filter state.
    want = soxr.resample(expected_audio(TEXT), 22050, 24000, quality="HQ")
    assert abs(len(got) - len(want)) <= 2
    n = min(len(got), len(want))
    assert np.abs(got[:n] - want[:n]).max() < 2e-3


def test_openai_sse_events(server):
    body = {
        "model": "sine",
        "voice": {"id": "sine"},
        "input": TEXT,
        "response_format": "pcm",
        "stream_format": "sse",
    }
    with httpx.stream("POST", f"{server}/v1/audio/speech", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["usage"]["input_tokens"] == len(TEXT)
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert abs(len(pcm) // 2 - round(len(expected_audio(TEXT)) * 24000 / 22050)) <= 2


def test_openai_names_only_through_aliases(server):
    r = httpx.post(f"{server}/v1/audio/speech", json={"model": "tts-1-hd", "voice": "sine", "input": "hi"})
    assert r.status_code == 404
    assert "tts-1-hd" in r.json()["error"]["message"] and "sine" in r.json()["error"]["message"]
    r = httpx.post(f"{server}/v1/audio/speech", json={"model": "sine", "voice": "nova", "input": "hi"})
    assert r.status_code == 404 and "valid voices: sine" in r.json()["error"]["message"]


def test_openai_aac_is_refused_and_instructions_noted(server):
    r = httpx.post(
        f"{server}/v1/audio/speech",
        json={"model": "sine", "voice": "sine", "input": "hi", "response_format": "aac"},
    )
    assert r.status_code == 400 and "AAC" in r.json()["error"]["message"]
    r = httpx.post(
        f"{server}/v1/audio/speech",
        json={
            "model": "sine",
            "voice": "sine",
            "input": "hi",
            "response_format": "flac",
            "instructions": "whisper",
        },
    )
    assert r.status_code == 200 and "ignored" in r.headers["x-voicehub-note"]


@pytest.mark.parametrize(
    "content,expect",
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (json.dumps({"text": 5}).encode(), "text"),
        (json.dumps({"text": "hi", "speed": 9}).encode(), "speed"),
        (json.dumps({"text": "hi", "colour": "red"}).encode(), "colour"),
        (json.dumps({"text": "   "}).encode(), "empty"),
        (json.dumps({"text": "hi", "format": "ogg"}).encode(), "format"),
        (json.dumps({"text": "hi", "voice": "../etc"}).encode(), "unknown voice"),
    ],
)
def test_bad_requests_get_4xx_with_a_message(server, content, expect):
    r = httpx.post(f"{server}/tts", content=content, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, r.text
    assert expect in r.json()["error"]["message"]


def test_model_errors_and_unknown_params_are_400(server):
    r = httpx.post(f"{server}/tts", json={"text": "say unspeakable things"})
    assert r.status_code == 400 and "unspeakable" in r.json()["error"]["message"]
    r = httpx.post(f"{server}/tts", json={"text": "hi", "params": {"noise": 1}})
    assert r.status_code == 400 and "noise" in r.json()["error"]["message"]


def test_body_over_the_limit_is_413(tmp_path):
    with running_server(sine_config(tmp_path, limits={"max_body_bytes": 1000})) as (url, _):
        r = httpx.post(f"{url}/tts", json={"text": "word " * 500})
        assert r.status_code == 413 and "limit" in r.json()["error"]["message"]


def test_probes_metrics_presets_models_and_request_ids(server):
    assert httpx.get(f"{server}/health").json()["status"] == "ok"
    assert httpx.get(f"{server}/ready").json()["ready"] is True
    assert httpx.get(f"{server}/presets").json()["presets"]["fast"]["sample_steps"] == 4
    ids = [m["id"] for m in httpx.get(f"{server}/v1/models").json()["data"]]
    assert ids == ["sine", "tts-1"]
    r = httpx.post(f"{server}/tts", json={"text": "hi"}, headers={"X-Request-ID": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    r = httpx.post(f"{server}/tts", json={"text": "hi"}, headers={"X-Request-ID": "bad id\x7f"})
    assert len(r.headers["x-request-id"]) == 32
    text = httpx.get(f"{server}/metrics").text
    assert 'voicehub_requests_total{route="/tts",status="200"}' in text
    assert "voicehub_first_audio_seconds_bucket" in text and "voicehub_real_time_factor_count" in text


def test_full_queue_answers_503_then_recovers(tmp_path):
    model = SineModel()
    model.gate = threading.Event()
    config = sine_config(tmp_path, limits={"max_queue": 1, "max_active_streams": 1})
    with running_server(config, model) as (url, app):
        results = {}

        def call(key):
            results[key] = httpx.post(f"{url}/tts", json={"text": "a b"}, timeout=30)

        first = threading.Thread(target=call, args=("first",))
        first.start()
        worker = app.state.voicehub.worker
        deadline = time.monotonic() + 5
        while worker.queue_depth() != 0 or app.state.voicehub.metrics.active_streams._value.get() != 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        second = threading.Thread(target=call, args=("second",))
        second.start()
        while worker.queue_depth() != 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        r = httpx.post(f"{url}/tts", json={"text": "a b"})
        assert r.status_code == 503 and "busy" in r.json()["error"]["message"]
        model.gate.set()
        first.join(10)
        second.join(10)
        assert results["first"].status_code == results["second"].status_code == 200


def test_client_disconnect_cancels_within_a_chunk(tmp_path):
    model = SineModel(delay_s=0.02)
    with running_server(sine_config(tmp_path), model) as (url, app):
        with httpx.stream("POST", f"{url}/tts", json={"text": "word " * 300}) as r:
            next(r.iter_raw())
        time.sleep(0.3)
        made = model.n_chunks_made
        time.sleep(0.3)
        assert model.n_chunks_made == made, "the worker kept making audio for a client that left"
        assert made < 60
        assert app.state.voicehub.metrics.cancelled._value.get() >= 1
        assert httpx.post(f"{url}/tts", json={"text": "still serving"}).status_code == 200


def test_request_timeout_is_504(tmp_path):
    model = SineModel()
    model.gate = threading.Event()
    with running_server(sine_config(tmp_path, limits={"request_timeout_s": 0.3}), model) as (url, _):
        r = httpx.post(f"{url}/tts", json={"text": "a b"}, timeout=10)
        assert r.status_code == 504 and "timeout" in r.json()["error"]["message"]
