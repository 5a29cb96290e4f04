"""`voicehub bench | quality | support` through their parsers, with stand-ins for heavy models."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from voicehub.audio.io import write_audio
from voicehub.bench import cli_commands


def parse(*argv):
    parser = argparse.ArgumentParser(prog="voicehub")
    cli_commands.add_parsers(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_support_lists_every_family(capsys):
    assert cli_commands.run(parse("support")) == 0
    out = capsys.readouterr().out
    assert "gpt-sovits-v3\n" in out and "vits\n" in out and "training: no" in out


def test_support_json_with_an_auto_plan(capsys):
    assert (
        cli_commands.run(parse("support", "vits", "--json", "--device", "cuda", "--gpu-arch", "sm_90")) == 0
    )
    (item,) = json.loads(capsys.readouterr().out)
    assert item["model_type"] == "vits" and item["auto_plan"]["context"]["gpu_arch"] == "sm_90"
    assert all(d["selected"] == "native" for d in item["auto_plan"]["decisions"])


def test_support_unknown_family_raises():
    with pytest.raises(ValueError, match="known"):
        cli_commands.run(parse("support", "tacotron"))


class Heard:
    def __init__(self, size="base"):
        pass

    def transcribe(self, audio, sample_rate, language="en"):
        return "hello there"


class SameSpeaker:
    def similarity(self, a, b, sample_rate):
        return 0.999


def _speech(rate=16000, gain=1.0):
    t = np.arange(2 * rate) / rate
    x = 0.3 * np.sin(2 * np.pi * 220 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    x[: rate // 10] = 0
    return (gain * x).astype(np.float32)


@pytest.mark.parametrize(("gain", "code", "word"), [(1.0, 0, "accepted"), (0.5, 1, "rejected: loudness off")])
def test_quality_command_exit_code_and_report(tmp_path, monkeypatch, capsys, gain, code, word):
    monkeypatch.setattr("voicehub.bench.asr.Transcriber", Heard)
    monkeypatch.setattr("voicehub.bench.quality.SpeakerEncoder", SameSpeaker)
    write_audio(tmp_path / "e.wav", _speech(), 16000)
    write_audio(tmp_path / "c.wav", _speech(gain=gain), 16000)
    args = parse(
        "quality",
        str(tmp_path / "e.wav"),
        str(tmp_path / "c.wav"),
        "--text",
        "hello there",
        "--json",
        str(tmp_path / "r.json"),
    )
    assert cli_commands.run(args) == code
    assert word in capsys.readouterr().out
    assert json.loads((tmp_path / "r.json").read_text())["accepted"] is (code == 0)


def test_quality_command_refuses_different_rates(tmp_path):
    write_audio(tmp_path / "e.wav", _speech(), 16000)
    write_audio(tmp_path / "c.wav", _speech(22050), 22050)
    with pytest.raises(ValueError, match="sample rates differ"):
        cli_commands.run(parse("quality", str(tmp_path / "e.wav"), str(tmp_path / "c.wav"), "--text", "x"))


def test_bench_command_writes_reports(tmp_path, monkeypatch, capsys):
    from voicehub.optimization import OptimizableModelMixin
    from voicehub.types import TTSOutput

    class Sdpa:
        name, feature, technique = "sdpa", "attention", "sdpa"

        def validate(self):
            pass

        def apply(self):
            return lambda: None

    class FakeModel(OptimizableModelMixin):
        model_type, device, dtype, sample_rate = "vits", "cpu", "float32", 1000

        def optimization_targets(self):
            return [Sdpa()]

        def generate(self, text, *, seed=None):
            return TTSOutput(np.full(12_000, 0.1, np.float32), 1000, text)

    loads = []

    def fake_from_pretrained(name=None, model_type=None, device="cpu", dtype=None, **kw):
        loads.append((name, model_type, device, dtype))
        return FakeModel()

    monkeypatch.setattr("voicehub.hub.AutoModelForTextToSpeech.from_pretrained", fake_from_pretrained)
    out = tmp_path / "out"
    args = parse(
        "bench",
        "--model-type",
        "vits",
        "--profiles",
        "attn_implementation=sdpa,kernel_backend=triton",
        "--out",
        str(out),
    )
    assert cli_commands.run(args) == 0
    record = json.loads((out / "bench.json").read_text())
    assert [r["name"] for r in record["profiles"]] == [
        "eager",
        "attn_implementation=sdpa",
        "kernel_backend=triton",
    ]
    assert record["profiles"][2]["status"] == "skipped" and len(loads) == 2
    assert (out / "bench.png").is_file() and "| eager | measured |" in capsys.readouterr().out


def test_bench_command_rejects_unknown_profiles():
    with pytest.raises(ValueError, match="valid: eager"):
        cli_commands.run(parse("bench", "--model-type", "vits", "--profiles", "warp-drive"))
