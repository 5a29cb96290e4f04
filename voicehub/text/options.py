"""Language codes and sentence-cut methods, with upstream GPT-SoVITS labels accepted as aliases."""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

from voicehub.choices import choice_error

E = TypeVar("E", bound=StrEnum)


class Language(StrEnum):
    """How a text's languages are found; the values are upstream GPT-SoVITS's codes, same meanings."""

    ALL_ZH = "all_zh"  # all Chinese (English letters inside are still read as English)
    ALL_JA = "all_ja"  # all Japanese
    EN = "en"  # all English
    ZH = "zh"  # Chinese-English mixed
    JA = "ja"  # Japanese-English mixed
    ALL_KO = "all_ko"  # all Korean
    KO = "ko"  # Korean-English mixed
    ALL_YUE = "all_yue"  # all Cantonese
    YUE = "yue"  # Cantonese-English mixed
    AUTO = "auto"  # multilingual: each span's language is detected
    AUTO_YUE = "auto_yue"  # multilingual, Chinese spans read as Cantonese


class CutMethod(StrEnum):
    """How a long text is cut into sentences before synthesis (upstream cut0..cut5)."""

    NONE = "none"  # cut0: keep the text whole
    EVERY_4_SENTENCES = "every_4_sentences"  # cut1
    EVERY_50_CHARS = "every_50_chars"  # cut2
    ZH_PERIOD = "zh_period"  # cut3: at 。
    EN_PERIOD = "en_period"  # cut4: at . (not between digits)
    PUNCTUATION = "punctuation"  # cut5: at every punctuation mark


# Upstream webui labels (dict_language_v2 in inference_webui.py) and their en_US i18n strings.
LANGUAGE_ALIASES: dict[str, Language] = {
    "中文": Language.ALL_ZH,
    "英文": Language.EN,
    "日文": Language.ALL_JA,
    "粤语": Language.ALL_YUE,
    "韩文": Language.ALL_KO,
    "中英混合": Language.ZH,
    "日英混合": Language.JA,
    "粤英混合": Language.YUE,
    "韩英混合": Language.KO,
    "多语种混合": Language.AUTO,
    "多语种混合(粤语)": Language.AUTO_YUE,
    "Chinese": Language.ALL_ZH,
    "English": Language.EN,
    "Japanese": Language.ALL_JA,
    "Yue": Language.ALL_YUE,
    "Korean": Language.ALL_KO,
    "Chinese-English Mixed": Language.ZH,
    "Japanese-English Mixed": Language.JA,
    "Yue-English Mixed": Language.YUE,
    "Korean-English Mixed": Language.KO,
    "Multilingual Mixed": Language.AUTO,
    "Multilingual Mixed(Yue)": Language.AUTO_YUE,
}

# Upstream webui labels (how_to_cut), their en_US i18n strings, and the TTS.py names cut0..cut5.
CUT_METHOD_ALIASES: dict[str, CutMethod] = {
    "不切": CutMethod.NONE,
    "凑四句一切": CutMethod.EVERY_4_SENTENCES,
    "凑50字一切": CutMethod.EVERY_50_CHARS,
    "按中文句号。切": CutMethod.ZH_PERIOD,
    "按英文句号.切": CutMethod.EN_PERIOD,
    "按标点符号切": CutMethod.PUNCTUATION,
    "No slice": CutMethod.NONE,
    "Slice once every 4 sentences": CutMethod.EVERY_4_SENTENCES,
    "Slice per 50 characters": CutMethod.EVERY_50_CHARS,
    "Slice by Chinese punct": CutMethod.ZH_PERIOD,
    "Slice by English punct": CutMethod.EN_PERIOD,
    "Slice by every punct": CutMethod.PUNCTUATION,
    "cut0": CutMethod.NONE,
    "cut1": CutMethod.EVERY_4_SENTENCES,
    "cut2": CutMethod.EVERY_50_CHARS,
    "cut3": CutMethod.ZH_PERIOD,
    "cut4": CutMethod.EN_PERIOD,
    "cut5": CutMethod.PUNCTUATION,
}


def _parse_labelled(enum_cls: type[E], labels: dict[str, E], value: object, what: str) -> E:
    # A member, its value (any case, spaces around ignored) or an upstream label (exact, spaces ignored).
    if isinstance(value, enum_cls):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text in labels:
            return labels[text]
        if text.lower() in {member.value for member in enum_cls}:
            return enum_cls(text.lower())
    error = choice_error(enum_cls, value, what)
    raise ValueError(f"{error} (or an upstream label: {', '.join(labels)})")


def parse_language(value: str | Language) -> Language:
    """A Language from its code or an upstream label; raises ValueError listing the valid values."""
    return _parse_labelled(Language, LANGUAGE_ALIASES, value, "language")


def parse_cut_method(value: str | CutMethod | None) -> CutMethod:
    """A CutMethod from its name, an upstream label or cut0-cut5; None means `none`."""
    if value is None:
        return CutMethod.NONE
    return _parse_labelled(CutMethod, CUT_METHOD_ALIASES, value, "cut method")
