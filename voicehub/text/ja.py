"""Japanese frontend: pyopenjtalk-plus phonemes with accent marks (upstream japanese.py, v2 variant).

Only pyopenjtalk-plus: it ships its dictionary. Plain pyopenjtalk downloads one at first use.
Upstream's user dictionary (ja_userdic/userdict.csv) is empty at the pinned commit, so none is loaded.
"""

from __future__ import annotations

import re

from voicehub.errors import MissingDependencyError
from voicehub.text.symbols import PUNCTUATION

_JA_CHARS = r"A-Za-z\d\u3005\u3040-\u30ff\u4e00-\u9fff\uff11-\uff19\uff21-\uff3a\uff41-\uff5a\uff66-\uff9d"
_JAPANESE = re.compile(f"[{_JA_CHARS}]")
_NOT_JAPANESE = re.compile(f"[^{_JA_CHARS}]")
_MARK_MAP = {
    "：": ",",
    "；": ",",
    "，": ",",
    "。": ".",
    "！": "!",
    "？": "?",
    "\n": ".",
    "·": ",",
    "、": ",",
    "...": "…",
}
_MARKS = "".join(re.escape(p) for p in PUNCTUATION)
_REPEATED_MARKS = re.compile(f"([{_MARKS}])([{_MARKS}])+")


def _feature(pattern: str, label: str) -> int:
    match = re.search(pattern, label)
    return -50 if match is None else int(match.group(1))


def prosody_phones(labels: list[str]) -> list[str]:
    """Full-context labels -> phonemes with ^ $ ? _ # [ ] prosody marks (ESPnet's rule, as upstream)."""
    phones: list[str] = []
    for n, label in enumerate(labels):
        p3 = re.search(r"\-(.*?)\+", label).group(1)
        if p3 in "AEIOU":  # unvoiced vowels are read as normal vowels
            p3 = p3.lower()
        if p3 == "sil":
            assert n in (0, len(labels) - 1)
            if n == 0:
                phones.append("^")
            elif (e3 := _feature(r"!(\d+)_", label)) in (0, 1):
                phones.append("$" if e3 == 0 else "?")  # a question ends in ?
            continue
        if p3 == "pau":
            phones.append("_")
            continue
        phones.append(p3)
        a1 = _feature(r"/A:([0-9\-]+)\+", label)
        a2 = _feature(r"\+(\d+)\+", label)
        a3 = _feature(r"\+(\d+)/", label)
        f1 = _feature(r"/F:(\d+)_", label)
        a2_next = _feature(r"\+(\d+)\+", labels[n + 1])
        if a3 == 1 and a2_next == 1 and p3 in "aeiouAEIOUNcl":
            phones.append("#")  # accent phrase border
        elif a1 == 0 and a2_next == a2 + 1 and a2 != f1:
            phones.append("]")  # pitch falls
        elif a2 == 1 and a2_next == 2:
            phones.append("[")  # pitch rises
    return phones


class JapaneseG2P:
    """Japanese frontend; `#` (accent phrase border) is not a v2 symbol and becomes UNK, as upstream."""

    language = "ja"

    def __init__(self):
        try:
            import pyopenjtalk
        except ImportError as exc:
            raise MissingDependencyError(
                'Japanese needs pyopenjtalk-plus: pip install "voicehub[ja]" (not plain pyopenjtalk, which downloads)'
            ) from exc
        self._jtalk = pyopenjtalk

    def normalize(self, text: str) -> str:
        return _REPEATED_MARKS.sub(r"\1", text)

    def g2p(self, norm_text: str) -> tuple[list[str], None]:
        text = norm_text.replace("％", "パーセント").lower()
        pieces = _NOT_JAPANESE.split(text)
        marks = _NOT_JAPANESE.findall(text)
        phones: list[str] = []
        for i, piece in enumerate(pieces):
            if _JAPANESE.match(piece):
                labels = self._jtalk.make_label(self._jtalk.run_frontend(piece))
                phones += prosody_phones(labels)[1:-1]
            if i < len(marks) and marks[i] != " ":
                phones.append(marks[i].replace(" ", ""))
        return [_MARK_MAP.get(p, p) for p in phones], None
