"""Sentence cutting against upstream GPT-SoVITS's own cut0..cut5 and pre_seg_text outputs."""

import json
from pathlib import Path

import pytest

from voicehub.errors import InvalidTextError
from voicehub.text import CutMethod, TextFrontend, parse_cut_method
from voicehub.text.cut import apply_cut, cut_text, split_long_piece

# Produced by upstream at the pinned commit; the file records the commit and command.
UPSTREAM = json.loads((Path(__file__).parent / "data/text/upstream_frontend.json").read_text("utf-8"))


@pytest.mark.parametrize("case", UPSTREAM["cuts"], ids=lambda c: f"{c['method']}:{c['text'][:12]}")
def test_cut_methods_match_upstream(case):
    assert apply_cut(case["text"], parse_cut_method(case["method"])) == case["output"]


@pytest.mark.parametrize(
    "case",
    [c for c in UPSTREAM["pre_segmentation"] if isinstance(c["pieces"], list)],
    ids=lambda c: f"{c['method']}:{c['language']}:{c['text'][:12]}",
)
def test_pre_segmentation_matches_upstream(case):
    got = cut_text(case["text"], parse_cut_method(case["method"]), is_english=case["language"] == "en")
    assert got == case["pieces"]


def test_cut_semantics_by_hand():
    text = "一。二。三。四。五。六。七。八。九。"
    assert apply_cut(text, CutMethod.EVERY_4_SENTENCES).split("\n") == [
        "一。二。三。四。",
        "五。六。七。八。九。",
    ]
    assert apply_cut("It is 3.14 now. Next.", CutMethod.EN_PERIOD).split("\n") == ["It is 3.14 now", " Next"]
    # upstream does not cut at a "." right after a digit either
    assert apply_cut("Pi is 3.14. Next.", CutMethod.EN_PERIOD) == "Pi is 3.14. Next"
    assert apply_cut("价格是3.5元，好。", CutMethod.PUNCTUATION).split("\n") == ["价格是3.5元，", "好。"]
    assert apply_cut("甲。乙。", CutMethod.ZH_PERIOD).split("\n") == ["甲", "乙"]
    assert apply_cut("不要切我，好吗？", CutMethod.NONE) == "不要切我，好吗？"


def test_long_piece_split_at_punctuation():
    piece = "长" * 300 + "，" + "句" * 300 + "。"
    parts = split_long_piece(piece)
    assert "".join(parts) == piece and all(len(p) <= 510 for p in parts) and len(parts) == 2


def test_frontend_cut_checks_text():
    frontend = TextFrontend()
    assert frontend.cut("Hello there. Fine.", "cut5", "en") == ["Hello there.", " Fine."]
    assert frontend.cut("你好", "不切") == ["。你好。"]  # short first sentence: upstream adds a leading 。
    with pytest.raises(InvalidTextError):
        frontend.cut("   ", "cut1")
    with pytest.raises(ValueError, match="every_4_sentences"):
        frontend.cut("你好", "cut9")
