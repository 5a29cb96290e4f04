"""WebSocket /v1/audio/speech/stream over a real socket, and the sentence segmenter it uses."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from test_server_helpers import expected_audio, running_server, sine_config
from websockets.sync.client import connect

from voicehub.server.fake import SineModel
from voicehub.server.segment import Segmenter


def _ws_url(url: str) -> str:
    return url.replace("http://", "ws://") + "/v1/audio/speech/stream"


def _read_until(ws, kind: str, timeout: float = 10.0) -> list[tuple[dict, bytes | None]]:
    """Messages up to and including the first of type `kind`; each audio.chunk paired with its frame."""
    out = []
    while True:
        msg = json.loads(ws.recv(timeout=timeout))
        audio = ws.recv(timeout=timeout) if msg["type"] == "audio.chunk" else None
        out.append((msg, audio))
        if msg["type"] == kind:
            return out


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(sine_config(tmp_path_factory.mktemp("data"))) as (url, _):
        yield url


def test_text_in_pieces_gives_audio_per_sentence_with_spans(server):
    pieces = ["Hello there. How", " are you", "? Fine thanks"]
    full = "".join(pieces)
    with connect(_ws_url(server)) as ws:
        assert json.loads(ws.recv(timeout=5))["type"] == "session.created"
        ws.send(json.dumps({"type": "session.config", "voice": "sine", "format": "s16le"}))
        assert json.loads(ws.recv(timeout=5))["type"] == "session.configured"
        for p in pieces:
            ws.send(json.dumps({"type": "input.text", "text": p}))
        ws.send(json.dumps({"type": "input.done"}))
        messages = _read_until(ws, "session.done")
    chunks = [(m, a) for m, a in messages if m["type"] == "audio.chunk"]
    segments = [m["text"] for m, _ in messages if m["type"] == "segment.done"]
    assert segments == ["Hello there.", "How are you?", "Fine thanks"]
    assert [m["index"] for m, _ in chunks] == list(range(len(chunks)))
    for m, audio in chunks:
        assert full[m["text_start"] : m["text_end"]] == m["text"]  # spans point into the whole input
        assert m["format"] == "s16le" and m["sample_rate"] == 22050 and len(audio) == 2 * m["n_samples"]
    for seg in range(3):
        got = np.concatenate([np.frombuffer(a, "<i2") for m, a in chunks if m["segment"] == seg]) / 32767.0
        assert np.abs(got - expected_audio(segments[seg])).max() <= 1 / 32767 + 1e-6


def test_audio_leaves_before_the_input_ends(server):
    with connect(_ws_url(server)) as ws:
        ws.recv(timeout=5)
        ws.send(json.dumps({"type": "input.text", "text": "First sentence here. And the sec"}))
        first = _read_until(ws, "audio.chunk")[-1][0]  # no input.done, no flush: the sentence end suffices
        assert first["segment"] == 0 and first["text"] == "First"
        ws.send(json.dumps({"type": "input.text", "text": "ond one"}))
        ws.send(json.dumps({"type": "input.flush"}))
        done = [m for m, _ in _read_until(ws, "segment.done") if m["type"] == "segment.done"]
        assert done[-1]["text"] == "First sentence here."
        done = [m for m, _ in _read_until(ws, "segment.done") if m["type"] == "segment.done"]
        assert done[-1]["text"] == "And the second one"


def test_bad_messages_get_errors_and_the_session_goes_on(server):
    with connect(_ws_url(server)) as ws:
        ws.recv(timeout=5)
        for bad, code in [
            ("{nope", "invalid_request"),
            (json.dumps({"type": "input.shout"}), "invalid_request"),
            (json.dumps({"type": "input.text", "text": 3}), "invalid_request"),
            (json.dumps({"type": "session.config", "voice": "../../etc/passwd"}), "not_found"),
            (json.dumps({"type": "session.config", "speed": 100}), "invalid_request"),
        ]:
            ws.send(bad)
            msg = json.loads(ws.recv(timeout=5))
            assert msg["type"] == "error" and msg["code"] == code and msg["message"], msg
        ws.send(json.dumps({"type": "input.text", "text": "still here."}))
        ws.send(json.dumps({"type": "input.done"}))
        assert _read_until(ws, "session.done")[-1][0]["n_segments"] == 1


def test_cancel_stops_the_work_and_the_session_continues(tmp_path):
    model = SineModel(delay_s=0.02)
    with running_server(sine_config(tmp_path), model) as (url, _):
        with connect(_ws_url(url)) as ws:
            ws.recv(timeout=5)
            ws.send(json.dumps({"type": "input.text", "text": "word " * 200 + ". "}))
            _read_until(ws, "audio.chunk")
            ws.send(json.dumps({"type": "session.cancel"}))
            _read_until(ws, "session.cancelled")
            time.sleep(0.2)
            made = model.n_chunks_made
            time.sleep(0.3)
            assert model.n_chunks_made == made and made < 100
            ws.send(json.dumps({"type": "input.text", "text": "after cancel."}))
            ws.send(json.dumps({"type": "input.done"}))
            segs = [m["text"] for m, _ in _read_until(ws, "session.done") if m["type"] == "segment.done"]
            assert segs == ["after cancel."]


def test_disconnect_mid_stream_stops_the_work(tmp_path):
    model = SineModel(delay_s=0.02)
    with running_server(sine_config(tmp_path), model) as (url, app):
        with connect(_ws_url(url)) as ws:
            ws.recv(timeout=5)
            ws.send(json.dumps({"type": "input.text", "text": "word " * 200 + ". "}))
            _read_until(ws, "audio.chunk")
        time.sleep(0.3)
        made = model.n_chunks_made
        time.sleep(0.3)
        assert model.n_chunks_made == made and made < 100
        assert app.state.voicehub.metrics.active_streams._value.get() == 0


def test_segmenter_cuts_at_sentence_ends_and_long_runs():
    seg = Segmenter(max_chars=30)
    assert seg.feed("Pi is 3.") == []  # '3.' may go on as '3.14'
    assert [p.text for p in seg.feed("14 exactly. Next")] == ["Pi is 3.14 exactly."]
    assert [p.text for p in seg.feed("! 你好。世界")] == ["Next!", "你好。"]
    full = "Pi is 3.14 exactly. Next! 你好。世界"
    assert [(p.text, p.start, p.end) for p in seg.flush()] == [("世界", full.index("世界"), len(full))]
    long = seg.feed("a" * 10 + ", " + "b" * 25)
    assert [p.text for p in long] == ["a" * 10 + ","] and seg.buffer == "b" * 25
