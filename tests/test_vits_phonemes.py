"""Phonemes for Piper voices: id layout, clause splitting, and the two espeak-ng backends agreeing."""

from __future__ import annotations

import builtins
import shutil

import pytest

from voicehub.errors import MissingDependencyError
from voicehub.models.vits import phonemes as ph

ID_MAP = {"_": [0], "^": [1], "$": [2], "a": [14], "b": [15], ".": [10]}
PROSE = (
    "Hello world. How are you? I'm fine, thanks!",
    "Mr. Smith went to Washington; he said: hi",
    "The quick brown fox jumps over the lazy dog.",
    'He said "stop." Then left.',
    "Paragraph one\n\nParagraph two",
)


def test_phoneme_ids_layout():
    assert ph.phoneme_ids(["a", "b", "."], ID_MAP) == [1, 0, 14, 0, 15, 0, 10, 0, 2]


def test_unknown_phonemes_are_skipped_with_a_warning(caplog):
    assert ph.phoneme_ids(["a", "Z"], ID_MAP) == [1, 0, 14, 0, 2]
    assert "Z" in caplog.text


def test_split_sentences():
    got = ph.split_sentences("Hi, there. Wait... what?! 3.5 is fine\n\nNew part")
    assert got == [
        ("Hi, there.", [("Hi", ","), ("there", ".")]),
        ("Wait... what?!", [("Wait... what", "?")]),
        ("3.5 is fine", [("3.5 is fine", "")]),
        ("New part", [("New part", "")]),
    ]


def test_piper_spans_follow_espeak_sentences():
    """espeak decides the sentences; each gets the input span that ends with its closing mark."""
    pytest.importorskip("piper.phonemize_espeak", reason="the piper extra bundles espeak-ng")
    text = "Dr. Jones sat. e.g. this one. And 3.5 apples."
    phonemizer = ph.PiperEspeakPhonemizer("en-us")
    sentences = list(phonemizer.sentences(text))
    assert [s.phonemes for s in sentences] == [tuple(g) for g in phonemizer._espeak.phonemize("en-us", text)]
    assert " ".join(s.text for s in sentences) == text
    assert sentences[0].text == "Dr." and sentences[-1].text == "And 3.5 apples."
    assert all(s.text[-1] == s.phonemes[-1] for s in sentences)  # "e.g." never ends a span early


@pytest.mark.parametrize("text", PROSE)
def test_espeak_program_matches_piper_library(text):
    pytest.importorskip("piper.phonemize_espeak", reason="the piper extra bundles espeak-ng")
    if not shutil.which("espeak-ng"):
        pytest.skip("the espeak-ng program is not installed")
    lib = list(ph.PiperEspeakPhonemizer("en-us").sentences(text))
    prog = list(ph.EspeakProgramPhonemizer("en-us").sentences(text))
    assert [(s.text, s.phonemes) for s in prog] == [(s.text, s.phonemes) for s in lib]


def test_no_phonemizer_says_how_to_get_one(monkeypatch):
    real_import = builtins.__import__

    def no_piper(name, *args, **kwargs):
        if name.startswith("piper"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_piper)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(MissingDependencyError, match=r"voicehub\[piper\]"):
        ph.make_phonemizer("en-us")


def test_unknown_backend_and_phoneme_type():
    with pytest.raises(ValueError, match="espeak_ng"):
        ph.make_phonemizer("en-us", backend="festival")
    with pytest.raises(ValueError, match="pinyin"):
        ph.make_phonemizer("zh", phoneme_type="pinyin")
    assert list(ph.make_phonemizer("x", phoneme_type="text").sentences("ab")) == [
        ph.Sentence("ab", ("a", "b"))
    ]
