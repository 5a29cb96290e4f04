"""Tokens of normalised English text, as NLTK's `TweetTokenizer().tokenize` gives them (upstream's choice).

Why not NLTK itself: `from nltk.tokenize import TweetTokenizer` runs `nltk/__init__`, which imports most
of NLTK and, through nltk.collocations, scipy.stats: 1.3 s of a 6 s English first call on a 2-core CPU
(`python -X importtime`), paid by every process start, for one regular expression. The text reaching the
tokenizer is `EnglishG2P.normalize`'s output, whose only characters are ASCII letters, spaces and
' . , ? ! - (expand_english drops the rest). On that alphabet most of TweetTokenizer's patterns cannot
match (URLs with a scheme or a slash, phone numbers, emoticons, tags, arrows, handles, hashtags, e-mail
addresses, emoji; HTML entities need '&'), and what remains is the four patterns below, tried in the same
order. tests/test_text_en_tokenize.py holds this equal to NLTK's tokenizer on that alphabet (random and
structured strings, and the normalised upstream sentences); text outside it is refused.
"""

from __future__ import annotations

import re

ALPHABET = re.compile(r"[ A-Za-z'.,?!\-]*")  # everything EnglishG2P.normalize can return
# TweetTokenizer first shortens a run of 4+ equal non-letters to 3 (its HANG_RE).
_RUN = re.compile(r"([^A-Za-z])\1{3,}")
_TOKEN = re.compile(
    r"[A-Za-z]+(?:[.\-][A-Za-z]+){0,126}\.[A-Za-z]{2,13}\b"  # a bare domain name: 'home.Then' is one token
    r"|[A-Za-z][A-Za-z'\-]+[A-Za-z]"  # a word with apostrophes or dashes inside
    r"|[A-Za-z]+"  # a word
    r"|\.(?: *\.)+"  # dots, spaced or not: an ellipsis
    r"|\S"  # any other mark on its own
)


def tokenize(norm_text: str) -> list[str]:
    """Tokens of normalised English text (see the module's docstring); other text raises ValueError."""
    if ALPHABET.fullmatch(norm_text) is None:
        raise ValueError(f"not normalised English text (letters, spaces and ' . , ? ! - only): {norm_text!r}")
    return _TOKEN.findall(_RUN.sub(r"\1\1\1", norm_text))
