"""`voicehub listening-kit | listening-score` on tiny fake bench folders, through the real entry point."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import soundfile as sf

from voicehub.bench import listening
from voicehub.cli import main

RATE = 8000
PROFILES = ("eager", "compiled_triton", "auto")


def tone(freq):
    t = np.arange(RATE // 4) / RATE
    return (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def fake_bench(folder, base_freq, text, profiles=PROFILES, rate=RATE):
    """What `voicehub bench --save-audio --out folder` leaves: bench.json and audio/<profile>.wav."""
    (folder / "audio").mkdir(parents=True)
    rows = []
    for n, name in enumerate(profiles):
        sf.write(folder / "audio" / f"{name}.wav", tone(base_freq + n), rate, subtype="FLOAT")
        rows.append({"name": name, "status": "measured", "audio_file": f"{name}.wav"})
    rows.append({"name": "sdpa", "status": "skipped", "reason": "not on this GPU"})
    record = {"settings": {"text": text, "model_type": "vits"}, "profiles": rows}
    (folder / "bench.json").write_text(json.dumps(record), encoding="utf-8")
    return folder


@pytest.fixture
def benches(tmp_path):
    return [
        fake_bench(tmp_path / "run1", 200, "first text"),
        fake_bench(tmp_path / "run2", 400, "second text"),
    ]


def fails(capsys, *argv):
    """The command exits 2 with one line naming the problem; returns that line."""
    assert main(list(argv)) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("voicehub: error: ")
    return err


def test_kit_from_bench_runs(tmp_path, benches, capsys):
    kit = tmp_path / "kit"
    assert main(["listening-kit", *map(str, benches), "--out", str(kit), "--seed", "3"]) == 0
    assert "4 pairs" in capsys.readouterr().out
    key_path = tmp_path / "kit-key.json"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kit", "kit-key.json", "run1", "run2"]
    page = (kit / "index.html").read_text()
    data = re.sub(r"<style>.*?</style>", "", page, flags=re.S)  # the fixed stylesheet holds no data (`auto`)
    for name in (*PROFILES, "sdpa", "run1", "run2"):
        assert name not in data
    assert "first text" in page and "second text" in page
    key = json.loads(key_path.read_text())
    assert key["seed"] == 3 and key["reference"] == "eager" and key["kit_id"] in page
    seen = set()
    for pair in key["pairs"]:
        assert "eager" in (pair["A"], pair["B"])
        for side in ("A", "B"):
            audio, rate = sf.read(kit / "audio" / f"{pair['pair']}-{side.lower()}.wav", dtype="float32")
            source = benches[pair["item"]] / "audio" / f"{pair[side]}.wav"
            assert rate == RATE
            np.testing.assert_allclose(audio, sf.read(source, dtype="float32")[0], atol=1e-4)
        seen.add((pair["item"], pair["A"] if pair["B"] == "eager" else pair["B"]))
    assert seen == {(i, p) for i in (0, 1) for p in PROFILES[1:]}
    assert len(list((kit / "audio").iterdir())) == 8


def test_profiles_option_and_default_random_seed(tmp_path, benches, capsys):
    seeds = []
    for n in range(2):
        out = tmp_path / f"kit{n}"
        args = ["listening-kit", str(benches[0]), "--out", str(out), "--profiles", "auto"]
        assert main(args + ["--key", str(tmp_path / "keys" / f"{n}.json")]) == 0
        key = json.loads((tmp_path / "keys" / f"{n}.json").read_text())
        assert {p["A"] for p in key["pairs"]} | {p["B"] for p in key["pairs"]} == {"eager", "auto"}
        seeds.append(key["seed"])
    assert seeds[0] != seeds[1]


def test_same_seed_other_audio_gives_another_kit_id(tmp_path, benches):
    ids = []
    for bench in benches:
        out = tmp_path / f"kit-{bench.name}"
        assert main(["listening-kit", str(bench), "--out", str(out), "--seed", "0"]) == 0
        ids.append(json.loads((tmp_path / f"{out.name}-key.json").read_text())["kit_id"])
    assert ids[0] != ids[1]


def _answers(key, pick):
    return {"kit_id": key["kit_id"], "answers": {p["pair"]: pick(p) for p in key["pairs"]}}


def test_score_sums_listeners(tmp_path, benches, capsys):
    assert main(["listening-kit", *map(str, benches), "--out", str(tmp_path / "kit")]) == 0
    key = json.loads((tmp_path / "kit-key.json").read_text())
    # listener 1 prefers compiled_triton over eager and hears no difference for auto;
    # listener 2 prefers compiled_triton too and prefers eager over auto, one pair unanswered.
    one = _answers(key, lambda p: "same" if "auto" in (p["A"], p["B"]) else
                   ("A" if p["A"] == "compiled_triton" else "B"))  # fmt: skip
    two = _answers(key, lambda p: "A" if p["A"] == ("compiled_triton" if "compiled_triton" in (p["A"], p["B"])
                                                    else "eager") else "B")  # fmt: skip
    dropped = next(p["pair"] for p in key["pairs"] if "auto" in (p["A"], p["B"]))
    del two["answers"][dropped]
    files = []
    for n, answers in enumerate((one, two)):
        files.append(tmp_path / f"answers-{n}.json")
        files[-1].write_text(json.dumps(answers))
    capsys.readouterr()
    assert main(["listening-score", str(tmp_path / "kit-key.json"), *map(str, files), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["n_answers"] == 2
    assert result["profiles"]["compiled_triton"] == {
        "preferred": 4, "reference_preferred": 0, "same": 0, "unanswered": 0, "sign_test_p": 0.125,
    }  # fmt: skip
    assert result["profiles"]["auto"] == {
        "preferred": 0, "reference_preferred": 1, "same": 2, "unanswered": 1, "sign_test_p": 1.0,
    }  # fmt: skip
    assert main(["listening-score", str(tmp_path / "kit-key.json"), *map(str, files)]) == 0
    assert "| compiled_triton | 4 | 0 | 0 | 0 | 0.125 |" in capsys.readouterr().out


def test_sign_test():
    assert listening.sign_test_p(0, 0) is None
    assert listening.sign_test_p(5, 5) == 1.0
    assert listening.sign_test_p(10, 0) == pytest.approx(2 / 1024)
    assert listening.sign_test_p(1, 9) == pytest.approx(2 * 11 / 1024)


def test_kit_errors_leave_nothing_behind(tmp_path, benches, capsys):
    kit = str(tmp_path / "kit")
    assert "does not exist" in fails(capsys, "listening-kit", str(tmp_path / "nowhere"), "--out", kit)
    (tmp_path / "empty").mkdir()
    assert "bench.json" in fails(capsys, "listening-kit", str(tmp_path / "empty"), "--out", kit)
    (benches[1] / "audio" / "compiled_triton.wav").unlink()
    assert "compiled_triton.wav" in fails(capsys, "listening-kit", *map(str, benches), "--out", kit)
    assert "nosuch" in fails(capsys, "listening-kit", str(benches[0]), "--out", kit, "--profiles", "nosuch")
    other = fake_bench(tmp_path / "run3", 300, "t", profiles=("eager", "compiled_triton"), rate=16000)
    assert "16000 Hz" in fails(capsys, "listening-kit", str(benches[0]), str(other), "--out", kit,
                               "--profiles", "compiled_triton")  # fmt: skip
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "bench.json").write_text("{not json")
    assert "not valid JSON" in fails(capsys, "listening-kit", str(tmp_path / "bad"), "--out", kit)
    (tmp_path / "bad" / "bench.json").write_text(json.dumps({"settings": {"text": "t"}, "profiles": [
        {"name": "eager", "status": "measured"}]}))  # fmt: skip
    assert "--save-audio" in fails(capsys, "listening-kit", str(tmp_path / "bad"), "--out", kit)
    assert "inside" in fails(capsys, "listening-kit", str(benches[0]), "--out", kit, "--key", kit + "/k.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad", "empty", "run1", "run2", "run3"]
    (tmp_path / "kit").mkdir()
    assert "exists already" in fails(capsys, "listening-kit", str(benches[0]), "--out", kit)


def test_a_failure_while_writing_leaves_nothing(tmp_path, benches, monkeypatch):
    written = []

    def write_then_fail(path, audio, rate):
        if len(written) == 3:
            raise OSError("disk full")
        written.append(path)
        path.write_bytes(b"x")

    monkeypatch.setattr(listening, "write_audio", write_then_fail)
    assert main(["listening-kit", str(benches[0]), "--out", str(tmp_path / "kit")]) == 2
    assert len(written) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run1", "run2"]


def test_score_errors(tmp_path, benches, capsys):
    assert main(["listening-kit", str(benches[0]), "--out", str(tmp_path / "kit")]) == 0
    key = str(tmp_path / "kit-key.json")
    assert main(["listening-kit", str(benches[1]), "--out", str(tmp_path / "kit2")]) == 0
    other_key = json.loads((tmp_path / "kit2-key.json").read_text())
    (tmp_path / "other.json").write_text(json.dumps(_answers(other_key, lambda p: "A")))
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "list.json").write_text("[1, 2]")
    capsys.readouterr()
    assert "answers are for kit" in fails(capsys, "listening-score", key, str(tmp_path / "other.json"))
    assert "not valid JSON" in fails(capsys, "listening-score", key, str(tmp_path / "broken.json"))
    assert "kit_id, answers" in fails(capsys, "listening-score", key, str(tmp_path / "list.json"))
    assert "does not exist" in fails(capsys, "listening-score", key, str(tmp_path / "none.json"))
    assert "not a listening-kit key" in fails(capsys, "listening-score", str(tmp_path / "list.json"),
                                              str(tmp_path / "other.json"))  # fmt: skip
    bad_choice = _answers(json.loads((tmp_path / "kit-key.json").read_text()), lambda p: "C")
    (tmp_path / "c.json").write_text(json.dumps(bad_choice))
    assert "unknown choice" in fails(capsys, "listening-score", key, str(tmp_path / "c.json"))
