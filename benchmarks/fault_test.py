"""Fault test: hostile and malformed requests against a VoiceHub server on loopback.

Every request must get a 4xx with a JSON error message; any 5xx, non-JSON error, hang or refused
connection is a failure; the server must still serve a good request at the end.

    python benchmarks/fault_test.py --url http://127.0.0.1:8000 --api-key KEY --rounds 3
    python benchmarks/fault_test.py --self-serve          # starts a sine-model server itself

Loopback only: a non-loopback URL is refused. Prints a JSON summary; exit status 1 on failure.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import numpy as np
import soundfile as sf

LOOPBACK = ("127.0.0.1", "localhost", "::1")
TIMEOUT_S = 20.0


@dataclass
class Case:
    name: str
    method: str
    path: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    auth: bool = True  # send the right key (when there is one)


def _wav(seconds: float, rate: int = 16000) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, np.zeros(int(seconds * rate), np.float32), rate, format="WAV")
    return buf.getvalue()


def _json_cases(voice: str) -> Iterator[Case]:
    bodies = {
        "bad-json": b"{not json",
        "truncated-json": b'{"text": "hi"',
        "json-array": b"[]",
        "json-string": b'"text"',
        "json-null": b"null",
        "nan": b'{"text": "hi", "speed": NaN}',
        "binary": bytes(range(256)),
        "utf16": '{"text": "hi"}'.encode("utf-16"),
        "deep-nesting": b'{"text": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    }
    for path in ("/tts", "/tts/file", "/v1/audio/speech"):
        for name, content in bodies.items():
            yield Case(
                f"{path}:{name}",
                "POST",
                path,
                {"content": content, "headers": {"content-type": "application/json"}},
            )
    wrong = [
        {"text": 5},
        {"text": None},
        {"text": ["a"]},
        {"text": {"a": 1}},
        {"text": ""},
        {"text": "   "},
        {"text": "!!!???"},
        {"text": "x" * 60_000},
        {"text": "hi", "speed": "fast"},
        {"text": "hi", "speed": -1},
        {"text": "hi", "speed": 1e308},
        {"text": "hi", "seed": -5},
        {"text": "hi", "seed": 2**70},
        {"text": "hi", "format": "exe"},
        {"text": "hi", "params": "x"},
        {"text": "hi", "params": {"a": {"b": 1}}},
        {"text": "hi", "params": {f"k{i}": 1 for i in range(100)}},
        {"text": "hi", "unknown_field": 1},
        {"text": "hi", "voice": "nobody"},
        {"text": "hi", "voice": "../../etc/passwd"},
        {"text": "hi", "voice": "x" * 500},
        {"text": "hi", "model": "tts-1"},
        {"text": "hi", "model": "/etc/passwd"},
        {"text": "hi", "voice": voice, "model": "nothing"},
        {"text": "hi", "params": {"no_such_param": 1}},
    ]
    for i, body in enumerate(wrong):
        yield Case(f"/tts:wrong-{i}", "POST", "/tts", {"json": body})
        yield Case(f"/tts/file:wrong-{i}", "POST", "/tts/file", {"json": body})
    speech = [
        {},
        {"input": "hi"},
        {"model": voice, "input": "hi"},
        {"model": voice, "voice": voice},
        {"model": "tts-1", "input": "hi", "voice": "alloy"},
        {"model": voice, "input": "hi", "voice": "alloy"},
        {"model": voice, "input": "hi", "voice": {"id": "../x"}},
        {"model": voice, "input": "hi", "voice": {"name": voice}},
        {"model": voice, "input": "hi", "voice": voice, "response_format": "aac"},
        {"model": voice, "input": "hi", "voice": voice, "response_format": "exe"},
        {"model": voice, "input": "hi", "voice": voice, "speed": 0.1},
        {"model": voice, "input": "hi", "voice": voice, "speed": 5},
        {"model": voice, "input": "hi", "voice": voice, "stream_format": "ws"},
        {"model": voice, "input": "", "voice": voice},
        {"model": voice, "input": "x" * 60_000, "voice": voice},
        {"model": voice, "input": 42, "voice": voice},
        {"model": ["a"], "input": "hi", "voice": voice},
    ]
    for i, body in enumerate(speech):
        yield Case(f"/v1/audio/speech:wrong-{i}", "POST", "/v1/audio/speech", {"json": body})


def _voice_cases() -> Iterator[Case]:
    names = ["../evil", "..", "a/b", "%2e%2e", ".hidden", "x" * 100, "a b", "名字", "", "CON\x00"]
    for i, name in enumerate(names):
        files = {"audio": ("r.wav", _wav(4.0), "audio/wav")}
        yield Case(
            f"/voices:bad-name-{i}",
            "POST",
            "/voices",
            {"data": {"name": name, "family": "gpt_sovits"}, "files": files},
        )
    audio = {
        "garbage": b"\x00\x01garbage" * 500,
        "empty": b"",
        "short": _wav(1.0),
        "long": _wav(12.0, 8000),
        "truncated-wav": _wav(4.0)[:200],
        "text-file": b"hello world\n" * 100,
        "huge": b"\x00" * 11_000_000,
    }
    for name, data in audio.items():
        form = {"name": "faultvoice", "family": "gpt_sovits", "transcript": "hi", "language": "en"}
        yield Case(
            f"/voices:audio-{name}",
            "POST",
            "/voices",
            {"data": form, "files": {"audio": ("r.wav", data, "audio/wav")}},
        )
    form = {"name": "faultvoice", "family": "gpt_sovits", "transcript": "hi", "language": "en"}
    yield Case(
        "/voices:two-files",
        "POST",
        "/voices",
        {"data": form, "files": [("audio", ("a.wav", _wav(4.0))), ("extra", ("b.wav", _wav(4.0)))]},
    )
    yield Case(
        "/voices:language",
        "POST",
        "/voices",
        {"data": {**form, "language": "klingon"}, "files": {"audio": ("r.wav", _wav(4.0))}},
    )
    yield Case(
        "/voices:no-transcript",
        "POST",
        "/voices",
        {"data": {**form, "transcript": ""}, "files": {"audio": ("r.wav", _wav(4.0))}},
    )
    yield Case(
        "/voices:model-files",
        "POST",
        "/voices",
        {"json": {**form, "model_files": {"gpt_path": "/etc/passwd"}}},
    )
    yield Case("/voices:server-path", "POST", "/voices", {"json": {**form, "reference_audio": "/etc/passwd"}})
    yield Case("/voices:bad-family", "POST", "/voices", {"json": {**form, "family": "../x"}})
    yield Case(
        "/voices:params-not-json",
        "POST",
        "/voices",
        {"data": {**form, "params": "{"}, "files": {"audio": ("r.wav", _wav(4.0))}},
    )
    yield Case("/voices:put-model", "PUT", "/voices/sine", {"json": {"transcript": "x"}})
    yield Case("/voices:delete-model", "DELETE", "/voices/sine")
    for i, body in enumerate(
        [{}, {"family": "gpt_sovits"}, {"name": "v1"}, {"name": 5, "family": "vits"}, {"name": "v1", "family": "vits", "transcript": []},
         {"name": "v1", "family": "vits", "params": []}, {"name": "v1", "family": "vits", "params": "x"},
         {"name": "v1", "family": "gpt_sovits"}, {"name": "v1", "family": 3}]
    ):  # fmt: skip
        yield Case(f"/voices:json-{i}", "POST", "/voices", {"json": body})
    for name in ("nobody", "..%2F..%2Fetc", "x" * 100):
        yield Case(f"/voices:get-{name[:10]}", "GET", f"/voices/{name}")
        yield Case(f"/voices:delete-{name[:10]}", "DELETE", f"/voices/{name}")
        yield Case(f"/voices:put-{name[:10]}", "PUT", f"/voices/{name}", {"json": {"transcript": "x"}})


def _shape_cases(voice: str) -> Iterator[Case]:
    """Wrong content types, query strings, and each OpenAI field given each wrong type."""
    for path in ("/tts", "/tts/file", "/v1/audio/speech"):
        for ctype, body in [
            ("text/plain", b"hello"),
            ("application/x-www-form-urlencoded", b"text=hello&voice=../x&speed=abc"),
            ("multipart/form-data; boundary=zz", b"--zz\r\nContent-Disposition: form-data\r\n\r\njunk"),
        ]:
            yield Case(
                f"{path}:ctype-{ctype[:10]}",
                "POST",
                path,
                {"content": body, "headers": {"content-type": ctype}},
            )
    for i, query in enumerate(
        ["", "text=", "text=%00", "text=hi&speed=x", "text=hi&seed=abc", "text=hi&format=../x",
         "text=hi&voice=..%2F..%2Fetc", "text=hi&params=x", "voice=sine", "text=hi&text=" + "x" * 60000]
    ):  # fmt: skip
        yield Case(f"/tts:query-{i}", "POST", f"/tts?{query}")
    good = {"model": voice, "input": "hi", "voice": voice}
    for key in ("model", "input", "voice", "response_format", "speed", "instructions", "stream_format"):
        for j, bad in enumerate([[], {"x": 1}, None, True]):
            if key == "instructions" and bad is None:
                continue  # null instructions are valid
            yield Case(
                f"/v1/audio/speech:{key}-type-{j}", "POST", "/v1/audio/speech", {"json": {**good, key: bad}}
            )


def _misc_cases(voice: str) -> Iterator[Case]:
    yield Case("no-route", "GET", "/nothing/here")
    yield Case("wrong-method", "GET", "/tts")
    yield Case("wrong-method-2", "DELETE", "/v1/models")
    yield Case("query-on-openai", "POST", "/v1/audio/speech?input=hi", {"json": {"model": voice}})
    yield Case(
        "huge-body",
        "POST",
        "/tts",
        {"content": b"{" + b" " * 13_000_000 + b"}", "headers": {"content-type": "application/json"}},
    )
    for i, key in enumerate(["", "wrong", "Bearer", "Bearer x", "Bearer x" * 100, "Basic dXNlcjpwYXNz"]):
        headers = {"Authorization": key} if key else {}
        yield Case(f"wrong-key-{i}", "POST", "/tts", {"json": {"text": "hi"}, "headers": headers}, auth=False)
        yield Case(f"wrong-key-ws-route-{i}", "GET", "/voices", {"headers": headers}, auth=False)


def all_cases(voice: str, has_key: bool) -> list[Case]:
    cases = [*_json_cases(voice), *_shape_cases(voice), *_voice_cases(), *_misc_cases(voice)]
    return [c for c in cases if c.auth or has_key]


def run_faults(url: str, api_key: str | None, voice: str, rounds: int = 1, every: int = 1) -> dict[str, Any]:
    """Send every `every`-th case `rounds` times; returns counts and the failures (status, body) per case."""
    if urlparse(url).hostname not in LOOPBACK:
        raise SystemExit(f"refusing to send hostile requests to {url}: loopback addresses only")
    cases = all_cases(voice, api_key is not None)[::every]
    failures, statuses = [], {}
    auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(base_url=url, timeout=TIMEOUT_S) as client:
        for _ in range(rounds):
            for case in cases:
                kwargs = dict(case.kwargs)
                headers = {**(auth if case.auth else {}), **kwargs.pop("headers", {})}
                try:
                    r = client.request(case.method, case.path, headers=headers, **kwargs)
                    message = (
                        r.json().get("error", {}).get("message")
                        if r.headers.get("content-type", "").startswith("application/json")
                        else None
                    )
                except (httpx.HTTPError, json.JSONDecodeError) as exc:
                    failures.append({"case": case.name, "error": f"{type(exc).__name__}: {exc}"})
                    continue
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                if not 400 <= r.status_code < 500 or not message:
                    failures.append({"case": case.name, "status": r.status_code, "body": r.text[:300]})
        good = client.post("/tts", json={"text": "still serving", "voice": voice}, headers=auth)
    return {
        "n_requests": sum(statuses.values()) + len([f for f in failures if "error" in f]),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "n_5xx": sum(v for k, v in statuses.items() if k >= 500),
        "failures": failures,
        "still_serving": good.status_code == 200 and len(good.content) > 0,
    }


def _self_serve(rounds: int) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from test_server_helpers import API_KEY, running_server, sine_config  # the tests' loopback server

    with tempfile.TemporaryDirectory() as data:
        config = sine_config(Path(data), api_keys=(API_KEY,))
        with running_server(config) as (url, _):
            return run_faults(url, API_KEY, "sine", rounds)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--voice", default="en_US-joe-medium", help="a valid voice on the server")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--self-serve", action="store_true", help="start a sine-model server on loopback")
    args = parser.parse_args()
    result = (
        _self_serve(args.rounds)
        if args.self_serve
        else run_faults(args.url, args.api_key, args.voice, args.rounds)
    )
    print(json.dumps(result, indent=2))
    return 0 if not result["failures"] and result["still_serving"] else 1


if __name__ == "__main__":
    sys.exit(main())
