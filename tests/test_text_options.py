"""Symbol table, language and cut-method enums, and their upstream aliases."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from voicehub.text.options import (
    CUT_METHOD_ALIASES,
    LANGUAGE_ALIASES,
    CutMethod,
    Language,
    parse_cut_method,
    parse_language,
)
from voicehub.text.symbols import N_SYMBOLS_V2, load_symbols, phones_to_ids

DATA = Path(__file__).parent / "data" / "text"


def test_symbol_table_is_upstreams_732_in_order():
    upstream = json.loads((DATA / "upstream_symbols_v2.json").read_text("utf-8"))
    assert upstream["commit"] == "48b1a0169a28582a8984402f82cf438d3bfa6aca"
    symbols = load_symbols()
    assert len(symbols) == N_SYMBOLS_V2 == 732
    assert list(symbols) == upstream["symbols"]


def test_phones_to_ids_round_trips_and_rejects_unknown():
    symbols = load_symbols()
    phones = ["_", "a", "AA", "ㄱ", "Yyun2", "]", "UNK"]
    ids = phones_to_ids(phones)
    assert [symbols[i] for i in ids] == phones
    with pytest.raises(ValueError, match="not-a-phone"):
        phones_to_ids(["a", "not-a-phone"])


# upstream inference_webui.py dict_language_v2, label -> code
UPSTREAM_LANGUAGE_LABELS = {
    "中文": "all_zh",
    "英文": "en",
    "日文": "all_ja",
    "粤语": "all_yue",
    "韩文": "all_ko",
    "中英混合": "zh",
    "日英混合": "ja",
    "粤英混合": "yue",
    "韩英混合": "ko",
    "多语种混合": "auto",
    "多语种混合(粤语)": "auto_yue",
}


@pytest.mark.parametrize("label,code", sorted(UPSTREAM_LANGUAGE_LABELS.items()))
def test_upstream_language_labels_keep_their_meaning(label, code):
    assert parse_language(label) is Language(code)
    assert parse_language(code) is Language(code)


def test_language_codes_are_upstreams():
    upstream_v2 = ["auto", "auto_yue", "en", "zh", "ja", "yue", "ko", "all_zh", "all_ja", "all_yue", "all_ko"]
    assert sorted(lang.value for lang in Language) == sorted(upstream_v2)
    assert set(LANGUAGE_ALIASES.values()) == set(Language)
    assert parse_language(Language.ZH) is Language.ZH and parse_language(" ALL_ZH ") is Language.ALL_ZH


@pytest.mark.parametrize("bad", ["klingon", "", "zh-cn", None, 3])
def test_unknown_language_lists_valid_values(bad):
    with pytest.raises(ValueError, match="all_zh.*auto_yue") as err:
        parse_language(bad)
    assert "中英混合" in str(err.value)


UPSTREAM_CUT_LABELS = {
    "不切": ("cut0", "none"),
    "凑四句一切": ("cut1", "every_4_sentences"),
    "凑50字一切": ("cut2", "every_50_chars"),
    "按中文句号。切": ("cut3", "zh_period"),
    "按英文句号.切": ("cut4", "en_period"),
    "按标点符号切": ("cut5", "punctuation"),
}


@pytest.mark.parametrize("label,names", sorted(UPSTREAM_CUT_LABELS.items()))
def test_cut_labels_and_cutn_names_are_aliases(label, names):
    legacy, name = names
    assert parse_cut_method(label) is parse_cut_method(legacy) is parse_cut_method(name) is CutMethod(name)


def test_cut_method_enum_and_errors():
    assert {m.value for m in CutMethod} == {v for _, v in UPSTREAM_CUT_LABELS.values()}
    assert set(CUT_METHOD_ALIASES.values()) == set(CutMethod)
    assert parse_cut_method(None) is CutMethod.NONE
    with pytest.raises(ValueError, match="none, every_4_sentences.*punctuation") as err:
        parse_cut_method("cut6")
    assert "cut5" in str(err.value)


def test_import_is_light():
    code = (
        "import sys, voicehub.text, voicehub.text.frontend; "
        "heavy = {'jieba', 'pypinyin', 'pyopenjtalk', 'nltk', 'g2p_en', 'cn2an', 'torch'} & set(sys.modules); "
        "print(sorted(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
