"""Chinese text normalisation into the characters and punctuation the pinyin stage reads."""

from __future__ import annotations

import functools
import json
import re
import string
from importlib import resources

from voicehub.text.symbols import PUNCTUATION
from voicehub.text.zh import numbers as num

_SENTENCE_END = re.compile(r"([：、，；。？！,;?!][”’]?)")
_FULLWIDTH = {ord(c) + 65248: ord(c) for c in string.ascii_letters + string.digits} | {0x3000: " "}
_GREEK_AND_SYMBOLS = (
    ("/", "每"),
    *zip("①②③④⑤⑥⑦⑧⑨⑩", "一二三四五六七八九十", strict=True),
    ("α", "阿尔法"),
    ("β", "贝塔"),
    ("γ", "伽玛"),
    ("Γ", "伽玛"),
    ("δ", "德尔塔"),
    ("Δ", "德尔塔"),
    ("ε", "艾普西龙"),
    ("ζ", "捷塔"),
    ("η", "依塔"),
    ("θ", "西塔"),
    ("Θ", "西塔"),
    ("ι", "艾欧塔"),
    ("κ", "喀帕"),
    ("λ", "拉姆达"),
    ("Λ", "拉姆达"),
    ("μ", "缪"),
    ("ν", "拗"),
    ("ξ", "克西"),
    ("Ξ", "克西"),
    ("ο", "欧米克伦"),
    ("π", "派"),
    ("Π", "派"),
    ("ρ", "肉"),
    ("ς", "西格玛"),
    ("Σ", "西格玛"),
    ("σ", "西格玛"),
    ("τ", "套"),
    ("υ", "宇普西龙"),
    ("φ", "服艾"),
    ("Φ", "服艾"),
    ("χ", "器"),
    ("ψ", "普赛"),
    ("Ψ", "普赛"),
    ("ω", "欧米伽"),
    ("Ω", "欧米伽"),
    ("+", "加"),
    ("-", "减"),
    ("×", "乘"),
    ("÷", "除"),
    ("=", "等"),
)
# Punctuation mapped onto the six phoneme marks (upstream chinese2.rep_map).
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
    "/": ",",
    "—": "-",
    "~": "…",
    "～": "…",
}
_PUNCT_RE = re.compile("|".join(re.escape(p) for p in _PUNCT_MAP))
_PUNCT_CLASS = "".join(re.escape(p) for p in PUNCTUATION)
_NOT_HAN_OR_MARK = re.compile(r"[^\u4e00-\u9fa5" + "".join(PUNCTUATION) + r"]+")
_REPEATED_MARKS = re.compile(f"([{_PUNCT_CLASS}])([{_PUNCT_CLASS}])+")


@functools.cache
def _traditional_to_simplified() -> dict[int, str]:
    raw = json.loads(resources.files("voicehub.text").joinpath("data/zh_t2s.json").read_text("utf-8"))
    return {ord(t): s for t, s in zip(raw["traditional"], raw["simplified"], strict=True)}


def to_simplified(text: str) -> str:
    """Traditional characters -> simplified, one for one (upstream's PaddleSpeech table)."""
    return text.translate(_traditional_to_simplified())


def _split_sentences(text: str) -> list[str]:
    text = text.replace(" ", "")
    text = re.sub(r"[——《》【】<>{}()（）#&@“”^_|\\]", "", text)
    text = _SENTENCE_END.sub(r"\1\n", text).strip()
    return [s.strip() for s in re.split(r"\n+", text)]


def _verbalize(sentence: str) -> str:
    """Numbers, dates, times, units and symbols -> Chinese words (PaddleSpeech rule order)."""
    sentence = to_simplified(sentence).translate(_FULLWIDTH)
    sentence = num.RE_DATE.sub(num.replace_date, sentence)
    sentence = num.RE_DATE2.sub(num.replace_date2, sentence)
    sentence = num.RE_TIME_RANGE.sub(num.replace_time, sentence)
    sentence = num.RE_TIME.sub(num.replace_time, sentence)
    sentence = num.RE_TO_RANGE.sub(num.replace_to_range, sentence)
    sentence = num.RE_TEMPERATURE.sub(num.replace_temperature, sentence)
    sentence = num.replace_measures(sentence)
    while num.RE_ASMD.search(sentence):
        sentence = num.RE_ASMD.sub(num.replace_asmd, sentence)
    sentence = num.RE_POWER.sub(num.replace_power, sentence)
    sentence = num.RE_FRAC.sub(num.replace_frac, sentence)
    sentence = num.RE_PERCENTAGE.sub(num.replace_percentage, sentence)
    sentence = num.RE_MOBILE_PHONE.sub(num.replace_mobile, sentence)
    sentence = num.RE_TELEPHONE.sub(num.replace_phone, sentence)
    sentence = num.RE_NATIONAL_UNIFORM_NUMBER.sub(num.replace_phone, sentence)
    sentence = num.RE_RANGE.sub(num.replace_range, sentence)
    sentence = num.RE_NEGATIVE.sub(num.replace_negative, sentence)
    sentence = num.RE_VERSION_NUM.sub(num.replace_version, sentence)
    sentence = num.RE_DECIMAL_NUM.sub(num.replace_number, sentence)
    sentence = num.RE_POSITIVE_QUANTIFIERS.sub(num.replace_quantifier, sentence)
    sentence = num.RE_DEFAULT_NUM.sub(num.replace_default_number, sentence)
    sentence = num.RE_NUMBER.sub(num.replace_number, sentence)
    for symbol, reading in _GREEK_AND_SYMBOLS:
        sentence = sentence.replace(symbol, reading)
    return re.sub(r"[-——《》【】<=>{}()（）#&@“”^_|\\]", "", sentence)


def _map_punctuation(text: str) -> str:
    text = text.replace("嗯", "恩").replace("呣", "母")
    text = _PUNCT_RE.sub(lambda m: _PUNCT_MAP[m.group()], text)
    return _NOT_HAN_OR_MARK.sub("", text)


def normalize_chinese(text: str) -> str:
    """Text -> simplified Han characters and the marks in PUNCTUATION (everything else dropped)."""
    normalized = "".join(_map_punctuation(_verbalize(s)) for s in _split_sentences(text))
    # Collapsing repeated marks keeps the reference transcript's pauses from leaking (upstream note).
    return _REPEATED_MARKS.sub(r"\1", normalized)
