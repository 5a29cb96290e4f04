"""English number words, as upstream's normaliser gets them from inflect's `number_to_words` / `ordinal`.

Why not inflect itself: importing it takes ~2.4 s (typeguard's @typechecked recompiles its methods from
source), and during a model load that import, run beside the weight reads, made the load ~2.9 s slower on
the GPU machine (`benchmarks/results/e2e_startup_h200.json`, `warm_pre_inflect`). Only the forms the
normaliser uses are here: cardinals of non-negative integers (with or without "and"), ordinals of
digits ("21" -> "21st") and of words ("twenty-one" -> "twenty-first"), and years read in pairs of digits.
`tests/test_text_number_words.py` checks each against inflect over every integer below 20,000 and
random larger ones up to 36 digits.

Numbers of more digits than the scale words cover (10**36 and up; inflect raises there) are read digit by
digit.
"""

from __future__ import annotations

import re

UNITS = ("", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
TEENS = ("ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen")  # fmt: skip
TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
SCALES = ("", "thousand", "million", "billion", "trillion", "quadrillion", "quintillion", "sextillion",
          "septillion", "octillion", "nonillion", "decillion")  # fmt: skip
DIGIT_SUFFIX = {1: "st", 2: "nd", 3: "rd"}  # every other last digit, and 11-13, take "th"
# a word ending -> its ordinal ending (inflect's table, tried in this order)
ORDINAL_ENDINGS = {"ty": "tieth", "one": "first", "two": "second", "three": "third", "five": "fifth",
                   "eight": "eighth", "nine": "ninth", "twelve": "twelfth"}  # fmt: skip
_ORDINAL_ENDING_RE = re.compile(f"({'|'.join(ORDINAL_ENDINGS)})$")
_DIGIT_WORDS = ("zero", *UNITS[1:])
_DIGITS_RE = re.compile("[0-9]+")


def _tens(tens: int, units: int) -> str:
    """0-99 without the zero: "", "seven", "fifteen", "forty", "forty-two"."""
    if tens == 1:
        return TEENS[units]
    return "-".join(word for word in (TENS[tens], UNITS[units]) if word)


def _three(digits: str, andword: str) -> str:
    """One group of up to three digits (no scale word), "" for zeros."""
    value = int(digits)
    hundreds, rest = divmod(value, 100)
    below = _tens(*divmod(rest, 10))
    if not hundreds or len(digits) < 3:
        return below
    joiner = f" {andword} " if andword and below else " "
    return f"{UNITS[hundreds]} hundred{joiner}{below}".rstrip()


def cardinal(number: int | str, andword: str = "and") -> str:
    """A non-negative integer (or its digits, leading zeros allowed) in words: 1234 -> "one thousand, two
    hundred and thirty-four"; a last group below one hundred after a larger one takes `andword` ("one
    thousand and one"); `andword=""` leaves it out everywhere."""
    if not _DIGITS_RE.fullmatch(str(number)):
        raise ValueError(f"not a non-negative integer: {number!r}")
    digits = str(number).lstrip("0")
    if len(digits) > 3 * len(SCALES):
        return " ".join(_DIGIT_WORDS[int(d)] for d in digits)
    if len(digits) <= 1:
        return "zero" if not digits else UNITS[int(digits)]
    head = len(digits) % 3 or 3
    groups = [digits[:head]] + [digits[i : i + 3] for i in range(head, len(digits), 3)]
    parts = []
    for index, group in enumerate(groups):
        words = _three(group, andword)
        scale = SCALES[len(groups) - 1 - index]
        if words:
            parts.append(f"{words} {scale}".rstrip())
    last = parts[-1]
    if len(parts) > 1 and " " not in last:  # one word after a comma: "one thousand and one"
        parts[-2:] = [f"{parts[-2]} {andword} {last}" if andword else f"{parts[-2]} {last}"]
    return ", ".join(parts)


def ordinal_digits(digits: str) -> str:
    """Digits with their ordinal suffix: "1" -> "1st", "12" -> "12th", "23" -> "23rd" (digits kept as given)."""
    value = int(digits)
    suffix = "th" if 11 <= value % 100 <= 13 else DIGIT_SUFFIX.get(value % 10, "th")
    return f"{digits}{suffix}"


def ordinal_words(words: str) -> str:
    """Number words as an ordinal: "twenty" -> "twentieth", "twenty-one" -> "twenty-first", "eleven" ->
    "eleventh"."""
    new = _ORDINAL_ENDING_RE.sub(lambda m: ORDINAL_ENDINGS[m.group(1)], words)
    return new if new != words else words + "th"


def ordinal(digits: int | str) -> str:
    """Digits read as an ordinal: "21" -> "twenty-first", "1001" -> "one thousand and first"."""
    return ordinal_words(cardinal(digits))


def year(number: int) -> str:
    """A four-digit year read in pairs: 1984 -> "nineteen eighty-four", 1905 -> "nineteen oh five"."""
    high, low = divmod(number, 100)
    if not 1000 <= number <= 9999:
        raise ValueError(f"a year reading needs four digits, got {number}")

    def pair(value: int) -> str:
        return _tens(*divmod(value, 10)) if value >= 10 else f"oh {UNITS[value] or 'oh'}"

    return f"{pair(high)} {pair(low)}"
