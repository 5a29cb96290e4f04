"""VoiceRegistry: round trips, validation, atomic writes under failures, and kill -9 during writes."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest
import soundfile as sf
from test_server_helpers import wav_bytes

from voicehub.errors import AudioFormatError
from voicehub.server import cli_commands
from voicehub.voices import VoiceError, VoiceExistsError, VoiceNotFoundError, VoiceRegistry

GS = dict(transcript="Some call me nature.", language="en")


def _files(registry: VoiceRegistry) -> set[str]:
    return {p.name for p in registry.audio_dir.iterdir()}


def test_add_get_update_delete_round_trip(tmp_path):
    reg = VoiceRegistry(tmp_path)
    v = reg.add(
        "narrator",
        "gpt-sovits-v3",
        reference_audio=wav_bytes(4.0, 44100, channels=2),
        **GS,
        params={"top_k": 5},
    )
    assert v.reference_audio.is_file() and v.reference_audio.parent == reg.audio_dir
    audio, rate = sf.read(v.reference_audio)
    assert audio.ndim == 1 and rate == 44100  # mixed to mono, GPT-SoVITS resamples itself
    assert abs(v.duration_s - 4.0) < 1e-3 and v.params == {"top_k": 5}
    assert [x.name for x in VoiceRegistry(tmp_path).list()] == ["narrator"]  # persisted

    old_file = v.reference_audio
    v2 = reg.update("narrator", transcript="Others call me Mother Nature.", reference_audio=wav_bytes(5.0))
    assert v2.transcript.startswith("Others") and v2.language == "en" and abs(v2.duration_s - 5.0) < 1e-3
    assert not old_file.exists() and _files(reg) == {v2.reference_audio.name}
    with pytest.raises(VoiceExistsError):
        reg.add("narrator", "gpt-sovits-v3", reference_audio=wav_bytes(4.0), **GS)
    reg.delete("narrator")
    assert reg.list() == [] and _files(reg) == set()
    with pytest.raises(VoiceNotFoundError, match="no voice named 'narrator'"):
        reg.get("narrator")


@pytest.mark.parametrize("name", ["../evil", "a/b", "", ".hidden", "x" * 65, "a b", "..", "C:\\x", None, "é"])
def test_unsafe_names_are_refused(tmp_path, name):
    reg = VoiceRegistry(tmp_path)
    with pytest.raises(VoiceError, match="invalid voice name"):
        reg.add(name, "gpt-sovits-v3", reference_audio=wav_bytes(4.0), **GS)
    assert _files(reg) == set()


@pytest.mark.parametrize(
    "audio,error",
    [
        (wav_bytes(2.0), "2.00 s long"),
        (wav_bytes(10.5), "10.50 s long"),
        (b"RIFF\x00\x00garbage" * 10, "cannot be decoded"),
        (b"", "cannot be decoded"),
    ],
    ids=["short", "long", "garbage", "empty"],
)
def test_bad_reference_audio_stores_nothing(tmp_path, audio, error):
    reg = VoiceRegistry(tmp_path)
    with pytest.raises((VoiceError, AudioFormatError), match=error):
        reg.add("v", "gpt-sovits-v3", reference_audio=audio, **GS)
    assert reg.list() == [] and _files(reg) == set()


def test_gpt_sovits_voice_needs_transcript_language_audio(tmp_path):
    reg = VoiceRegistry(tmp_path)
    with pytest.raises(VoiceError, match="needs reference audio"):
        reg.add("v", "gpt-sovits-v3", **GS)
    with pytest.raises(VoiceError, match="transcript"):
        reg.add("v", "gpt-sovits-v3", reference_audio=wav_bytes(4.0), language="en")
    with pytest.raises(VoiceError, match="unknown language .klingon"):
        reg.add("v", "gpt-sovits-v3", reference_audio=wav_bytes(4.0), transcript="hi", language="klingon")
    assert (
        reg.add(
            "v", "gpt-sovits-v3", reference_audio=wav_bytes(4.0), transcript="hi", language="English"
        ).language
        == "en"
    )


def test_legacy_family_name_is_translated_at_the_registry_edge(tmp_path):
    reg = VoiceRegistry(tmp_path)
    assert reg.add("new", "gpt_sovits", reference_audio=wav_bytes(4.0), **GS).family == "gpt-sovits-v3"
    reg.add("stored", "gpt-sovits-v3", reference_audio=wav_bytes(4.0), **GS)
    with sqlite3.connect(reg.db_path) as db:  # a row as an older registry wrote it
        db.execute("UPDATE voices SET family = 'gpt_sovits' WHERE name = 'stored'")
    assert [v.family for v in VoiceRegistry(tmp_path).list()] == ["gpt-sovits-v3"] * 2
    with pytest.raises(VoiceError, match="invalid family"):
        reg.add("bad", "GPT SoVITS", reference_audio=wav_bytes(4.0), **GS)


def test_failed_commit_leaves_neither_file_nor_row(tmp_path, monkeypatch):
    reg = VoiceRegistry(tmp_path)
    real = reg._transaction

    def failing():
        raise sqlite3.OperationalError("disk I/O error (simulated)")

    monkeypatch.setattr(reg, "_transaction", failing)
    with pytest.raises(sqlite3.OperationalError):
        reg.add("v", "gpt-sovits-v3", reference_audio=wav_bytes(4.0), **GS)
    assert _files(reg) == set()
    monkeypatch.setattr(reg, "_transaction", real)
    assert reg.list() == []


def test_failed_update_keeps_the_old_voice_whole(tmp_path, monkeypatch):
    reg = VoiceRegistry(tmp_path)
    old = reg.add("v", "gpt-sovits-v3", reference_audio=wav_bytes(4.0), **GS)
    monkeypatch.setattr(reg, "_transaction", lambda: (_ for _ in ()).throw(OSError("simulated crash")))
    with pytest.raises(OSError):
        reg.update("v", reference_audio=wav_bytes(6.0), transcript="new")
    monkeypatch.undo()
    now = reg.get("v")
    assert now == old and _files(reg) == {old.reference_audio.name}


def test_failed_audio_write_leaves_no_partial_file(tmp_path, monkeypatch):
    reg = VoiceRegistry(tmp_path)
    real_write = sf.write

    def half_write(fh, *args, **kwargs):
        fh.write(b"RIFF partial")
        raise OSError("no space left on device (simulated)")

    monkeypatch.setattr(sf, "write", half_write)
    with pytest.raises(OSError, match="no space"):
        reg.add("v", "gpt-sovits-v3", reference_audio=wav_bytes(4.0), **GS)
    monkeypatch.setattr(sf, "write", real_write)
    assert _files(reg) == set() and reg.list() == []


WRITER = textwrap.dedent(
    """
    import itertools, sys
    from voicehub.voices import VoiceRegistry
    sys.path.insert(0, {tests!r})
    from test_server_helpers import wav_bytes
    reg = VoiceRegistry({data!r})
    audio = [wav_bytes(3.0 + i * 0.5) for i in range(4)]
    print("ready", flush=True)
    for i in itertools.count():
        name = f"v{{i % 5}}"
        if name in reg and i % 3 == 0:
            reg.delete(name)
        elif name in reg:
            reg.update(name, reference_audio=audio[i % 4], transcript=f"take {{i}}")
        else:
            reg.add(name, "gpt-sovits-v3", reference_audio=audio[i % 4], transcript=f"take {{i}}", language="en")
    """
)


def test_kill_9_during_writes_leaves_a_consistent_registry(tmp_path):
    data = tmp_path / "data"
    code = WRITER.format(tests=os.path.dirname(__file__), data=str(data))
    for run in range(3):
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
        assert proc.stdout.readline().strip() == b"ready"
        time.sleep(0.4 + 0.3 * run)  # land the kill at different points of the write loop
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        with sqlite3.connect(data / "voices.sqlite3") as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        reg = VoiceRegistry(data)
        voices = reg.list()
        for v in voices:  # every row points at a whole, decodable file
            audio, rate = sf.read(v.reference_audio)
            assert abs(len(audio) / rate - v.duration_s) < 1e-6
        reg.sweep(min_age_s=0)  # what a later open does to a crash's leftovers once they are old
        assert _files(reg) == {v.reference_audio.name for v in voices}


def test_cli_voices_add_list_show_remove(tmp_path, capsys):
    import argparse

    parser = argparse.ArgumentParser()
    cli_commands.add_parsers(parser.add_subparsers(dest="command"))
    ref = tmp_path / "ref.flac"
    ref.write_bytes(wav_bytes(4.0, fmt="FLAC"))
    base = ["voices", "--data-dir", str(tmp_path / "d")]

    def run(*argv: str) -> str:
        cli_commands.run(parser.parse_args([*base, *argv]))
        return capsys.readouterr().out

    run("add", "hero", "--audio", str(ref), "--transcript", "Hello there.", "--language", "en", "--param", "top_k=5",
        "--model-file", "gpt_path=s1.ckpt")  # fmt: skip
    assert run("list").split("\t")[:3] == ["hero", "gpt-sovits-v3", "en"]
    shown = run("show", "hero")
    assert '"top_k": 5' in shown and "s1.ckpt" in shown
    run("remove", "hero")
    assert run("list") == ""
