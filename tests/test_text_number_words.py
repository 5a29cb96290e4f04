"""Our English number words (number_words.py) against inflect, which upstream's normaliser calls."""

import random

import pytest

from voicehub.text.en import normalize
from voicehub.text.en import number_words as words
from voicehub.text.en.normalize import expand_english

inflect = pytest.importorskip("inflect")
ENGINE = inflect.engine()
_RNG = random.Random(0)
EVERY = [*range(20_000), *(_RNG.randrange(20_000, 10**7) for _ in range(3_000))]
LARGE = [_RNG.randrange(10**k, 10 ** (k + 1)) for k in range(7, 36) for _ in range(40)]
# round numbers and zeros inside: the "and" and empty-group cases
SHAPES = [
    int(s) for s in ("1000001", "1000050", "1050000", "100000000", "1000000000001", "20000000000000000019")
]


@pytest.mark.parametrize("andword", ["and", ""])
def test_cardinals_equal_inflect(andword):
    for n in [*EVERY, *LARGE, *SHAPES]:
        assert words.cardinal(n, andword) == ENGINE.number_to_words(n, andword=andword), n


def test_cardinal_of_digits_with_leading_zeros_equals_inflect_on_the_string():
    for digits in ("0", "00", "007", "0100", "000123456"):
        assert words.cardinal(digits) == ENGINE.number_to_words(digits), digits


def test_ordinals_equal_inflect():
    for n in [*range(0, 5_000), *LARGE[::7], *SHAPES]:
        digits = str(n)
        assert words.ordinal_digits(digits) == ENGINE.ordinal(digits), n
        assert words.ordinal(digits) == ENGINE.number_to_words(ENGINE.ordinal(digits)), n
        assert words.ordinal_words(words.cardinal(n)) == ENGINE.ordinal(ENGINE.number_to_words(n)), n


def test_years_equal_inflect_in_pairs():
    for n in range(1000, 10_000):
        want = ENGINE.number_to_words(n, andword="", zero="oh", group=2).replace(", ", " ")
        assert words.year(n) == want, n


def test_beyond_the_scale_words_digits_are_read_one_by_one():
    n = "1" + "0" * 36
    with pytest.raises(inflect.NumOutOfRangeError):
        ENGINE.number_to_words(n)
    assert words.cardinal(n) == " ".join(["one"] + ["zero"] * 36)


@pytest.mark.parametrize("bad", ["-1", "1.5", "", "12a", "²"])
def test_cardinal_refuses_what_is_not_a_non_negative_integer(bad):
    with pytest.raises(ValueError, match="non-negative integer"):
        words.cardinal(bad)


class InflectWords:
    """The normaliser's number readings made by inflect, as upstream makes them."""

    cardinal = staticmethod(lambda n, andword="and": ENGINE.number_to_words(n, andword=andword))
    ordinal_digits = staticmethod(ENGINE.ordinal)
    ordinal = staticmethod(lambda n: ENGINE.number_to_words(ENGINE.ordinal(str(n))))
    year = staticmethod(
        lambda n: ENGINE.number_to_words(n, andword="", zero="oh", group=2).replace(", ", " ")
    )


TEXTS = [
    "I have 1001 cats and 1,234,567 dogs.",
    "In 1984 and 1905, then 2007, 2000, 1800 and 2999.",
    "The 21st and 3rd, at 7:05 and 13:00; the 111th time.",
    "Take 3/4 of 1/2, 5/1 or 2/3.",
    "1. First 2. second, 1000000000001 ants, 12 km, 3.14 and $6.24.",
]


def test_the_normaliser_reads_numbers_as_with_inflect(monkeypatch):
    ours = [expand_english(text) for text in TEXTS]
    monkeypatch.setattr(normalize, "numwords", InflectWords)
    assert ours == [expand_english(text) for text in TEXTS]
    assert "ten oh one cats" in ours[0] and "nineteen oh five" in ours[1]  # 1001-2999: years
