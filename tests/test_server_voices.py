"""/voices over HTTP: multipart upload, list, show, update, delete, and using a registry voice."""

from __future__ import annotations

import json

import httpx
import pytest
from test_server_helpers import running_server, sine_config, wav_bytes

from voicehub.voices import VoiceRegistry


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    config = sine_config(
        tmp_path_factory.mktemp("data"),
        voices={"fixed": {"family": "sine", "transcript": "from the config"}},
        limits={"max_upload_bytes": 400_000},
    )
    with running_server(config) as (url, app):
        yield url, app


def _add(url: str, name: str, audio: bytes | None = None, **fields) -> httpx.Response:
    data = {"name": name, "family": "sine", **fields}
    files = {"audio": ("ref.wav", audio, "audio/wav")} if audio is not None else None
    return httpx.post(f"{url}/voices", data=data, files=files)


def test_upload_list_show_update_use_delete(server):
    url, app = server
    r = _add(
        url, "alice", wav_bytes(4.0, 22050, channels=2), transcript="hello", params=json.dumps({"speed": 1.5})
    )
    assert r.status_code == 201, r.text
    assert r.json()["has_reference_audio"] and abs(r.json()["duration_s"] - 4.0) < 1e-3
    assert "reference_audio" not in r.json()  # the server's paths stay private
    stored = app.state.voicehub.registry.get("alice").reference_audio
    assert stored.parent == app.state.voicehub.registry.audio_dir

    listed = {v["name"]: v["source"] for v in httpx.get(f"{url}/voices").json()["voices"]}
    assert listed == {"sine": "model", "fixed": "config", "alice": "registry"}
    assert httpx.get(f"{url}/voices/alice").json()["transcript"] == "hello"

    r = httpx.put(f"{url}/voices/alice", json={"transcript": "changed"})
    assert (
        r.status_code == 200 and r.json()["transcript"] == "changed" and r.json()["params"] == {"speed": 1.5}
    )

    # A registry voice runs on the configured model of its family, with its default params.
    r = httpx.post(f"{url}/tts", json={"text": "one two", "voice": "alice"})
    assert r.status_code == 200 and r.headers["x-voice"] == "alice"
    assert len(r.content) == 4 * 2 * int(22050 * 0.1 / 1.5)

    assert httpx.delete(f"{url}/voices/alice").status_code == 204
    assert httpx.get(f"{url}/voices/alice").status_code == 404
    assert not stored.exists()


@pytest.mark.parametrize(
    "name,audio,status,message",
    [
        ("../../etc/passwd", wav_bytes(4.0), 400, "invalid voice name"),
        ("ok-name", b"not audio at all" * 100, 400, "cannot be decoded"),
        ("ok-name", wav_bytes(1.0), 400, "3-10 s"),
        ("ok-name", wav_bytes(9.0, 48000), 413, "upload limit"),
        ("ok-name", b"", 400, "empty"),
        ("fixed", wav_bytes(4.0), 409, "server config"),
    ],
    ids=["traversal", "garbage", "short", "too-big", "empty", "config-voice"],
)
def test_bad_uploads_are_refused_and_store_nothing(server, name, audio, status, message):
    url, app = server
    r = _add(url, name, audio)
    assert r.status_code == status and message in r.json()["error"]["message"], r.text
    registry: VoiceRegistry = app.state.voicehub.registry
    assert "ok-name" not in registry.names()
    assert not [p for p in registry.audio_dir.iterdir() if p.name.startswith("ok-name")]


def test_fields_that_name_server_paths_are_refused(server):
    url, _ = server
    r = httpx.post(
        f"{url}/voices", json={"name": "x", "family": "sine", "model_files": {"gpt_path": "/etc/passwd"}}
    )
    assert r.status_code == 400 and "model_files cannot be set over HTTP" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/voices", json={"name": "x", "family": "sine", "reference_audio": "/etc/passwd"})
    assert r.status_code == 400 and "unknown field" in r.json()["error"]["message"]
    assert httpx.delete(f"{url}/voices/fixed").status_code == 409
    assert httpx.put(f"{url}/voices/nobody", json={"transcript": "x"}).status_code == 404
