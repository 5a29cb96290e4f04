"""The blinded listening kit: no system names on the page, a key that decodes the answers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf

from voicehub.bench.listening import make_listening_kit, score_answers

RATE = 8000


def tone(freq):
    t = np.arange(RATE // 2) / RATE
    return (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


SAMPLES = {
    "eager": [tone(200), tone(300), tone(400)],
    "compiled_triton": [tone(201), tone(301), tone(401)],
    "fewsteps_cache": [tone(202), tone(302), tone(402)],
}


def test_kit_is_blind_and_the_key_maps_every_file(tmp_path):
    kit = make_listening_kit(tmp_path / "kit", SAMPLES, RATE, texts=["one", "two", "three"], seed=1)
    page = kit.page.read_text()
    assert kit.n_pairs == 6 and page.count('class="pair"') == 6
    for system in SAMPLES:
        assert system not in page
    assert not kit.key.is_relative_to(kit.folder)
    assert not any("key" in p.name for p in kit.folder.rglob("*"))
    key = json.loads(kit.key.read_text())
    seen = set()
    for pair in key["pairs"]:
        assert "eager" in (pair["A"], pair["B"]) and pair["A"] != pair["B"]
        for side in ("A", "B"):
            audio, rate = sf.read(
                kit.folder / "audio" / f"{pair['pair']}-{side.lower()}.wav", dtype="float32"
            )
            assert rate == RATE
            np.testing.assert_allclose(audio, SAMPLES[pair[side]][pair["item"]], atol=1e-4)  # 16-bit WAV
        seen.add((pair["item"], pair["B"] if pair["A"] == "eager" else pair["A"]))
    assert len(seen) == 6
    assert "download" in page and "Blob" in page and key["kit_id"] in page


def test_order_is_randomised_but_reproducible(tmp_path):
    sides = []
    for seed in (1, 1, 2):
        kit = make_listening_kit(tmp_path / f"k{seed}-{len(sides)}", SAMPLES, RATE, seed=seed)
        sides.append([(p["item"], p["A"]) for p in json.loads(kit.key.read_text())["pairs"]])
    assert sides[0] == sides[1] and sides[0] != sides[2]
    many = make_listening_kit(
        tmp_path / "many", {"eager": [tone(200)] * 40, "x": [tone(300)] * 40}, RATE, seed=0
    )
    first = [p["A"] for p in json.loads(many.key.read_text())["pairs"]]
    assert 10 <= first.count("eager") <= 30  # the reference is not always on one side


def test_answers_are_scored_with_the_key(tmp_path):
    kit = make_listening_kit(tmp_path / "kit", SAMPLES, RATE, seed=4)
    key = json.loads(kit.key.read_text())
    # a listener who always prefers eager
    answers = {p["pair"]: ("A" if p["A"] == "eager" else "B") for p in key["pairs"]}
    answers.pop(key["pairs"][0]["pair"])
    tally = score_answers(key, {"kit_id": key["kit_id"], "answers": answers})
    assert sum(t["reference_preferred"] for t in tally.values()) == 5
    assert sum(t["unanswered"] for t in tally.values()) == 1
    assert all(t["preferred"] == 0 for t in tally.values())
    with pytest.raises(ValueError, match="kit"):
        score_answers(key, {"kit_id": "other", "answers": {}})


def test_bad_inputs_raise(tmp_path):
    with pytest.raises(ValueError, match="reference"):
        make_listening_kit(tmp_path / "k", {"x": [tone(1)]}, RATE)
    with pytest.raises(ValueError, match="same"):
        make_listening_kit(tmp_path / "k", {"eager": [tone(1)], "x": []}, RATE)
    with pytest.raises(ValueError, match="inside"):
        make_listening_kit(tmp_path / "k", SAMPLES, RATE, key_path=tmp_path / "k" / "key.json")
