"""The `voicehub` command: outputs, formats, and one-line errors that leave no partial file."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest
import soundfile as sf

from voicehub.cli import main

SENTENCE = "Hello there."


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("ext, container", [("wav", "WAV"), ("flac", "FLAC"), ("mp3", "MP3"), ("ogg", "OGG")])
def test_say_writes_each_format(tmp_path, capsys, ext, container):
    out = tmp_path / f"x.{ext}"
    code, _, err = _run(capsys, "say", SENTENCE, "-o", str(out), "--seed", "0")
    assert code == 0, err
    info = sf.info(out)
    assert info.format == container and info.samplerate == 22050 and info.duration > 0.3
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary file left beside it


def test_say_raw_pcm_to_stdout_equals_the_file(tmp_path, capsys, monkeypatch):
    wav = tmp_path / "x.wav"
    assert _run(capsys, "say", SENTENCE, "-o", str(wav), "--seed", "3")[0] == 0
    buffer = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(buffer))
    assert main(["say", SENTENCE, "-o", "-", "--seed", "3"]) == 0
    pcm = np.frombuffer(buffer.getvalue(), dtype="<i2")
    expected, _ = sf.read(wav, dtype="int16")
    assert pcm.shape == expected.shape  # libsndfile scales by 32768, we by 32767: 1 LSB apart at most
    assert np.abs(pcm.astype(np.int32) - expected).max() <= 1


def test_speed_makes_speech_shorter(tmp_path, capsys):
    slow, fast = tmp_path / "slow.wav", tmp_path / "fast.wav"
    _run(capsys, "say", SENTENCE, "-o", str(slow), "--seed", "0")
    _run(capsys, "say", SENTENCE, "-o", str(fast), "--seed", "0", "--speed", "1.5")
    assert sf.info(fast).frames < 0.8 * sf.info(slow).frames


def test_text_from_file(tmp_path, capsys):
    text = tmp_path / "in.txt"
    text.write_text("One sentence. And another one.", encoding="utf-8")
    code, _, err = _run(capsys, "say", "-f", str(text), "-o", str(tmp_path / "x.wav"))
    assert code == 0, err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["say", "", "-o", "{tmp}/x.wav"], "text is empty"),
        (["say", "?!...", "-o", "{tmp}/x.wav"], "no letters or digits"),
        (["say", "Hi.", "-o", "{tmp}/x.wav", "--model", "no-such-voice"], "no model named 'no-such-voice'"),
        (["say", "Hi.", "-o", "{tmp}/x.xyz"], "unknown audio format"),
        (["say", "Hi.", "-o", "{tmp}/missing-dir/x.wav"], "does not exist"),
        (["say", "Hi.", "-o", "{tmp}/x.wav", "--speed", "0"], "speed must be > 0"),
        (["say", "Hi.", "-o", "-", "--format", "mp3"], "raw PCM"),
        (["say", "Hi."], "needs -o FILE"),
        (["say", "-f", "{tmp}/absent.txt", "-o", "{tmp}/x.wav"], "cannot read text file"),
    ],
)
def test_errors_are_one_line_with_no_partial_file(tmp_path, capsys, argv, message):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code, _, err = _run(capsys, *argv)
    assert code == 2
    assert err.startswith("voicehub: error: ") and message in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_huge_text_is_refused_before_any_work(tmp_path, capsys):
    code, _, err = _run(capsys, "say", "word " * 20_000, "-o", str(tmp_path / "x.wav"))
    assert code == 2 and "over the limit" in err
    assert list(tmp_path.iterdir()) == []


def test_unwritable_output_is_one_clear_line(capsys):
    # /proc refuses new files even to root, so this holds for every user (CI runs as root)
    code, _, err = _run(capsys, "say", "Hi.", "-o", "/proc/voicehub-test.wav")
    assert code == 2 and "cannot write '/proc/voicehub-test.wav'" in err and err.count("\n") == 1


def test_models_lists_families_and_the_embedded_voice(capsys):
    code, out, _ = _run(capsys, "models")
    assert code == 0
    assert "vits:" in out and "en_US-joe-medium" in out and "gpt-sovits-v3:" in out


def test_talk_writes_one_file_per_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("First line.\n\nSecond line.\n"))
    code, _, err = _run(capsys, "talk", "--out-dir", str(tmp_path), "--seed", "0")
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["line-0.wav", "line-2.wav"]
