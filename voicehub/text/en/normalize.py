"""English text normalisation: numbers, money, times, units, fractions (upstream en_normalization).

Numbers are read as upstream reads them with inflect, by number_words.py (inflect's import costs ~2.4 s).
"""

from __future__ import annotations

import re
import unicodedata

from voicehub.text.en import number_words as numwords

_UNITS = {
    "m": ("meter", "meters"),
    "km": ("kilometer", "kilometers"),
    "km/h": ("kilometer per hour", "kilometers per hour"),
    "ft": ("feet", "feet"),
    "L": ("liter", "liters"),
    "tbsp": ("tablespoon", "tablespoons"),
    "tsp": ("teaspoon", "teaspoons"),
    "h": ("hour", "hours"),
    "min": ("minute", "minutes"),
    "s": ("second", "seconds"),
    "°C": ("degree celsius", "degrees celsius"),
    "°F": ("degree fahrenheit", "degrees fahrenheit"),
}
_ORDINAL_LIST_RE = re.compile(r"\b([0-9]+)\. ")
_COMMA_NUMBER_RE = re.compile(r"([0-9][0-9\,]+[0-9])")
_TIME_RE = re.compile(r"\b([01]?[0-9]|2[0-3]):([0-5][0-9])\b")
_MEASURE_RE = re.compile(r"\b([0-9]+(\.[0-9]+)?(m|km|km/h|ft|L|tbsp|tsp|h|min|s|°C|°F))\b")
_POUNDS_BEFORE_RE = re.compile(r"£([0-9\.\,]*[0-9]+)")
_POUNDS_AFTER_RE = re.compile(r"([0-9\.\,]*[0-9]+)£")
_DOLLARS_BEFORE_RE = re.compile(r"\$([0-9\.\,]*[0-9]+)")
_DOLLARS_AFTER_RE = re.compile(r"([(0-9\.\,]*[0-9]+)\$")
_DECIMAL_RE = re.compile(r"([0-9]+\.\s*[0-9]+)")
_FRACTION_RE = re.compile(r"([0-9]+/[0-9]+)")
_ORDINAL_RE = re.compile(r"[0-9]+(st|nd|rd|th)")
_NUMBER_RE = re.compile(r"[0-9]+")
_POW = "[⁰¹²³⁴⁵⁶⁷⁸⁹ˣʸⁿ]"
_OPERAND = rf"((-?)((\d+)(\.\d+)?{_POW}*)|(\.\d+{_POW}*)|([A-Za-z]{_POW}*))"
_ASMD_RE = re.compile(_OPERAND + r"\s+([\+\-\×÷=])\s+" + _OPERAND)
_ASMD_WORDS = {"+": " plus ", "-": " minus ", "×": " times ", "÷": " divided by ", "=": " Equals "}
_NEGATIVE_RE = re.compile(r"(?:^|\s+)(-)(\d+)")


def _currency(amount: str, units: tuple[str, str, str, str], default_unit: str) -> str:
    """'6.24' with (dollar, dollars, cent, cents) -> '6 dollars and 24 cents' (digits read later)."""
    one, many, sub_one, sub_many = units
    parts = amount.split(".")
    if len(parts) > 2:
        return amount + " " + default_unit
    whole = int(parts[0]) if parts[0] else 0
    cents = int(parts[1].ljust(2, "0")) if len(parts) > 1 and parts[1] else 0
    words = []
    if whole:
        words.append(f"{whole} {one if whole == 1 else many}")
    if cents:
        words.append(f"{cents} {sub_one if cents == 1 else sub_many}")
    return " and ".join(words) if words else f"zero {many}"


def _dollars(m: re.Match) -> str:
    return _currency(m.group(1), ("dollar", "dollars", "cent", "cents"), "dollars")


def _pounds(m: re.Match) -> str:
    return _currency(m.group(1), ("pound", "pounds", "penny", "pence"), "pounds")


def _time(m: re.Match) -> str:
    hours, minutes = int(m.group(1)), int(m.group(2))
    period = "a.m." if hours < 12 else "p.m."
    hours = hours - 12 if hours > 12 else hours
    hour_word = numwords.cardinal(hours)
    if minutes == 0:
        return f"{hour_word} o'clock {period}"
    return f"{hour_word} {numwords.cardinal(minutes)} {period}"


def _measure(m: re.Match) -> str:
    unit = m.group(3)
    number = int(m.group(1).replace(unit, "").replace(".", ""))
    plural = not (m.group(2) is None and number == 1)
    return m.group(1).replace(unit, " " + _UNITS[unit][plural])


def _decimal(m: re.Match) -> str:
    whole, fraction = m.group(1).split(".")
    return whole + " point " + " ".join(fraction)


def _fraction(m: re.Match) -> str:
    numerator, denominator = map(int, m.group(0).split("/"))
    top = numwords.cardinal(numerator)
    if denominator == 2:
        return f"{top} {'half' if numerator == 1 else 'halves'}"
    if denominator == 1:
        return top
    bottom = numwords.ordinal(denominator)
    return f"{top} {bottom}{'s' if numerator > 1 else ''}"


def _number(m: re.Match) -> str:
    num = int(m.group(0))
    if not 1000 < num < 3000:
        return numwords.cardinal(m.group(0), andword="")
    if num == 2000:
        return "two thousand"
    if 2000 < num < 2010:
        return "two thousand " + numwords.cardinal(num % 100)
    if num % 100 == 0:
        return numwords.cardinal(num // 100) + " hundred"
    return numwords.year(num)


def expand_english(text: str) -> str:
    """Numbers and symbols -> words; keeps only letters, spaces and ' . , ? ! -; splits CamelCase."""
    text = _ORDINAL_LIST_RE.sub(lambda m: numwords.ordinal_digits(m.group(1)) + ", ", text)
    while _ASMD_RE.search(text):
        text = _ASMD_RE.sub(lambda m: m.group(1) + _ASMD_WORDS[m.group(8)] + m.group(9), text)
    text = _NEGATIVE_RE.sub(lambda m: f"negative {m.group(2)}", text)
    text = _COMMA_NUMBER_RE.sub(lambda m: m.group(1).replace(",", ""), text)
    text = _TIME_RE.sub(_time, text)
    text = _MEASURE_RE.sub(_measure, text)
    text = _POUNDS_BEFORE_RE.sub(_pounds, text)
    text = _POUNDS_AFTER_RE.sub(_pounds, text)
    text = _DOLLARS_BEFORE_RE.sub(_dollars, text)
    text = _DOLLARS_AFTER_RE.sub(_dollars, text)
    text = _DECIMAL_RE.sub(_decimal, text)
    text = _FRACTION_RE.sub(_fraction, text)
    text = _ORDINAL_RE.sub(lambda m: numwords.ordinal(m.group(0)[:-2]), text)
    text = _NUMBER_RE.sub(_number, text)
    text = "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")
    text = text.replace("%", " percent")
    text = re.sub(r"[^ A-Za-z'.,?!\-]", "", text)
    text = re.sub(r"(?i)i\.e\.", "that is", text)
    text = re.sub(r"(?i)e\.g\.", "for example", text)
    return re.sub(r"(?<!^)(?<![\s])([A-Z])", r" \1", text)  # GPU -> G P U, ChatGPT -> Chat G P T
