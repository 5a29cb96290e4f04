"""Cantonese frontend: Chinese normalisation, ToJyutping readings, jyutping -> Y-prefixed v2 symbols.

As upstream cantonese.py: the text goes through the same number/date normaliser as Mandarin (which also
turns traditional characters into simplified ones), its own punctuation map, then each character's
jyutping is split into an initial and a toned final, both written with a leading "Y" so they never
collide with Mandarin symbols ("nei5" -> "Yn", "Yei5").
"""

from __future__ import annotations

import re

from voicehub.errors import InvalidTextError, MissingDependencyError
from voicehub.text.symbols import PUNCTUATION

# The Mandarin normaliser's sentence split and verbaliser are exactly upstream's TextNormalizer, which
# cantonese.py reuses; only the punctuation step after it differs.
from voicehub.text.zh.normalize import _split_sentences, _verbalize

# Cantonese punctuation map (upstream cantonese.rep_map): quotes and brackets become ' and are then
# dropped with every other character that is not Han or a phoneme mark.
_PUNCT_MAP = {
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
    "$": ".",
    "“": "'",
    "”": "'",
    '"': "'",
    "‘": "'",
    "’": "'",
    "（": "'",
    "）": "'",
    "(": "'",
    ")": "'",
    "《": "'",
    "》": "'",
    "【": "'",
    "】": "'",
    "[": "'",
    "]": "'",
    "—": "-",
    "～": "-",
    "~": "-",
    "「": "'",
    "」": "'",
}
_PUNCT_RE = re.compile("|".join(re.escape(p) for p in _PUNCT_MAP))
_NOT_HAN_OR_MARK = re.compile(r"[^\u4e00-\u9fa5" + "".join(PUNCTUATION) + r"]+")
_JYUTPING = re.compile(r"^([a-z]+[1-6]+[ ]?)+$")
# Onsets tried in this order, first prefix wins (upstream cantonese.INITIALS); some are whole rimes
# ("aa", "ong") so that a syllable with no consonant still splits in two.
_INITIALS = (
    "aa aai aak aap aat aau ai au ap at ak a p b e ts t dz d kw k gw g f h l m ng n s y w c z j "
    "ong on ou oi ok o uk ung sp spl spn sil"
).split()
_SILENCE = "_"


def normalize_cantonese(text: str) -> str:
    """Text -> simplified Han characters and phoneme marks (upstream cantonese.text_normalize)."""
    sentences = (_verbalize(sentence) for sentence in _split_sentences(text))
    return "".join(
        _NOT_HAN_OR_MARK.sub("", _PUNCT_RE.sub(lambda m: _PUNCT_MAP[m.group()], s)) for s in sentences
    )


def syllable_phones(syllable: str) -> list[str]:
    """One jyutping syllable ("hoeng1") -> its two symbols ("Yh", "Yoeng1"); [] if no onset matches."""
    if syllable[-1].isdigit():
        tone, bare = syllable[-1], syllable[:-1]
    else:
        tone, bare = "", syllable
    for initial in _INITIALS:
        if bare.startswith(initial):
            if bare.startswith("nga"):  # "nga..." is ng + a..., not the n onset
                initial = bare[:2]
            final = bare[len(initial) :] or initial[-1]  # a syllabic nasal ("m4") repeats its onset
            return ["Y" + initial, "Y" + final + (tone if tone not in ("", "0") else "")]
    return []


class CantoneseG2P:
    """Cantonese frontend (upstream cantonese.py); word2ph counts 2 per character, 1 per mark."""

    language = "yue"

    def __init__(self):
        try:
            import ToJyutping
        except ImportError as exc:
            raise MissingDependencyError(
                'Cantonese text needs the package "ToJyutping": pip install "voicehub[yue]"'
            ) from exc
        self._jyutping = ToJyutping.get_jyutping_list

    def normalize(self, text: str) -> str:
        return normalize_cantonese(text)

    def g2p(self, norm_text: str) -> tuple[list[str], list[int]]:
        """Phonemes and word2ph (len(word2ph) == len(norm_text), sum(word2ph) == len(phones))."""
        phones: list[str] = []
        word2ph: list[int] = []
        for unit in self._syllables(norm_text):
            if unit in PUNCTUATION or unit == _SILENCE:
                unit_phones = [unit if unit in PUNCTUATION else "Y" + unit]
            else:
                unit_phones = syllable_phones(unit)
                if not unit_phones:
                    raise InvalidTextError(f"jyutping {unit!r} has no onset upstream can split off")
            phones += unit_phones
            word2ph.append(len(unit_phones))
        return phones, word2ph

    def _syllables(self, text: str) -> list[str]:
        """Jyutping per character; marks pass through one by one (upstream get_jyutping)."""
        units: list[str] = []
        for char, reading in self._jyutping(text):
            if all(c in PUNCTUATION for c in char):
                units += list(char)
            elif reading is None or not _JYUTPING.search(reading):
                raise InvalidTextError(f"no Cantonese reading for {char!r} (ToJyutping gives {reading!r})")
            else:
                units.append(reading)
        return units
