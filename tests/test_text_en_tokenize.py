"""The English tokenizer (text/en/tokenize.py) against its oracle, NLTK's TweetTokenizer, on the alphabet of
normalised English text: random strings, structured strings built from tricky words and separators, and
normalised sentences."""

from __future__ import annotations

import random

import pytest

from voicehub.text.en.tokenize import ALPHABET, tokenize

nltk_tokenize = pytest.importorskip("nltk.tokenize").TweetTokenizer().tokenize

CHARS = "abcdezXYZ    '.,?!-"
WORDS = ["a", "I", "ab", "the", "Home", "then", "don't", "well-known", "e", "U", "abcdefghijklmnop",
         "it's", "'tis", "rock'n'roll", "o'clock", "x-ray", "com", "www", "GPU"]  # fmt: skip
SEPARATORS = [" ", ".", "-", "'", ". ", " .", "...", ". . .", ",", "?", "!", "  ", "     ", "--", "''''",
              "-.", ".-", "'.", ". .", "!!!!", "----", ",,,,"]  # fmt: skip
SENTENCES = [
    "Hello world.",
    "I went home.Then I slept.",  # a bare-domain token: home.Then
    "Visit www.example.com or example.org for more.",
    "It's a well-known fact, isn't it? Yes!",
    "Wait . . . what... really?!",
    "rock'n'roll, o'clock and 'quoted' words - with dashes -- here.",
    "A B C D E F G H I",
    "u.s.a. and e.t.c. and a.b.cd and a.bcdefghijklmnopqrstu",
    "-start and end- and -both- and ''double'' quotes",
    "Chat G P T and J S O N are widely used.",
    "",
    "    ",
]


def test_random_strings_match_nltk():
    rng = random.Random(0)
    for _ in range(5000):
        text = "".join(rng.choice(CHARS) for _ in range(rng.randint(0, 30)))
        assert tokenize(text) == nltk_tokenize(text), text


def test_structured_strings_match_nltk():
    rng = random.Random(1)
    for _ in range(3000):
        text = "".join(rng.choice(WORDS) + rng.choice(SEPARATORS) for _ in range(rng.randint(1, 10)))
        text = rng.choice(SEPARATORS) + text if rng.random() < 0.3 else text
        assert tokenize(text) == nltk_tokenize(text), text


@pytest.mark.parametrize("labels", [2, 126, 127, 128, 200])
def test_long_dotted_names_match_nltk(labels):
    text = ".".join(["ab"] * labels) + " x"
    assert tokenize(text) == nltk_tokenize(text)


def test_normalised_sentences_match_nltk():
    g2p = pytest.importorskip("voicehub.text.en.g2p")
    english = g2p.EnglishG2P()
    for sentence in SENTENCES:
        assert tokenize(sentence) == nltk_tokenize(sentence), sentence
        norm = english.normalize(sentence)
        assert ALPHABET.fullmatch(norm) and tokenize(norm) == nltk_tokenize(norm), norm


@pytest.mark.parametrize("text", ["café", "a\tb", "line\nbreak", "3 apples", "a:b", "x@y.com", "#tag"])
def test_text_outside_the_normalised_alphabet_is_refused(text):
    with pytest.raises(ValueError, match="not normalised English text"):
        tokenize(text)
