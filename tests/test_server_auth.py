"""API keys: 401 without saying which part was wrong, public probes, WebSocket, refusing public binds."""

from __future__ import annotations

import argparse
import json

import httpx
import pytest
from test_server_helpers import API_KEY, running_server, sine_config
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from voicehub.server import cli_commands
from voicehub.server.config import ConfigError, load_config


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(
        sine_config(tmp_path_factory.mktemp("data"), api_keys=("other-key-abcdefgh", API_KEY))
    ) as (
        url,
        _,
    ):
        yield url


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-key-000000"},
        {"Authorization": API_KEY},
        {"X-API-Key": API_KEY[:-1]},
    ],
    ids=["none", "wrong", "no-bearer", "prefix"],
)
def test_missing_and_wrong_keys_get_the_same_401(server, headers):
    r = httpx.post(f"{server}/tts", json={"text": "hi"}, headers=headers)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert (
        r.json()["error"]["message"] == "missing or invalid API key; send it as 'Authorization: Bearer <key>'"
    )


def test_right_key_in_either_header_is_accepted(server):
    for headers in ({"Authorization": f"Bearer {API_KEY}"}, {"X-API-Key": "other-key-abcdefgh"}):
        assert httpx.post(f"{server}/tts", json={"text": "hi"}, headers=headers).status_code == 200
    for path in ("/health", "/ready", "/"):  # probes and the page are open
        assert httpx.get(f"{server}{path}").status_code == 200
    assert httpx.get(f"{server}/metrics").status_code == 401
    assert httpx.get(f"{server}/voices").status_code == 401


def test_openai_client_with_and_without_the_key(server):
    openai = pytest.importorskip("openai")
    good = openai.OpenAI(base_url=f"{server}/v1", api_key=API_KEY)
    assert (
        len(good.audio.speech.create(model="sine", voice="sine", input="hi", response_format="wav").content)
        > 44
    )
    bad = openai.OpenAI(base_url=f"{server}/v1", api_key="sk-not-it", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.audio.speech.create(model="sine", voice="sine", input="hi")


def test_websocket_needs_the_key(server):
    url = server.replace("http://", "ws://") + "/v1/audio/speech/stream"
    with pytest.raises(InvalidStatus) as info:
        with connect(url):
            pass
    assert info.value.response.status_code == 403
    with connect(url, additional_headers={"Authorization": f"Bearer {API_KEY}"}) as ws:
        assert json.loads(ws.recv(timeout=5))["type"] == "session.created"


def test_public_bind_without_a_key_refuses_to_start(tmp_path, monkeypatch):
    monkeypatch.delenv("VOICEHUB_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="refusing to listen on 0.0.0.0 without an API key"):
        load_config(None, host="0.0.0.0", data_dir=tmp_path)
    parser = argparse.ArgumentParser()
    cli_commands.add_parsers(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "--host", "0.0.0.0", "--data-dir", str(tmp_path)])
    with pytest.raises(ConfigError, match="refusing"):
        cli_commands.run(args)
    monkeypatch.setenv("VOICEHUB_API_KEY", API_KEY)
    assert load_config(None, host="0.0.0.0", data_dir=tmp_path).api_keys == (API_KEY,)


def test_config_file_is_read_and_typos_are_named(tmp_path):
    good = tmp_path / "server.toml"
    good.write_text(
        """
        [server]
        port = 9000
        default_voice = "sine"
        [limits]
        max_queue = 4
        [models.sine]
        factory = "voicehub.server.fake:SineModel"
        options = { delay_s = 0.01 }
        [aliases.models]
        "tts-1" = "sine"
        [aliases.voices]
        alloy = "sine"
        """
    )
    config = load_config(good, data_dir=tmp_path)
    assert (config.port, config.limits.max_queue, config.model_aliases) == (9000, 4, {"tts-1": "sine"})
    assert config.models["sine"].options == {"delay_s": 0.01}
    bad = tmp_path / "bad.toml"
    bad.write_text("[limits]\nmax_qeue = 4\n")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['max_qeue'\] in \[limits\]"):
        load_config(bad)
    bad.write_text('[aliases.models]\n"tts-1" = "nothing"\n')
    with pytest.raises(ConfigError, match="not a configured model"):
        load_config(bad)
