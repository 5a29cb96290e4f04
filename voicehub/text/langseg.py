"""Split text into spans of one language each, following upstream GPT-SoVITS's LangSegmenter rules.

Upstream splits with the split-lang package and fastText's 'full' model (a download). Here spans
come from Unicode script runs: Latin -> en, kana -> ja, Hangul -> ko, Han -> zh, digits resolved
by upstream's neighbour rules. In `auto` mode a Han-only span next to no kana is read as Chinese;
upstream's fastText may call some of those Japanese. Everything else matches upstream's rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from voicehub.text.options import Language

_FULL_EN = re.compile(r"^(?=.*[A-Za-z])[A-Za-z0-9\s\u0020-\u007E\u2000-\u206F\u3000-\u303F\uFF00-\uFFEF]+$")
_SENTENCE_MARKS = (",", ".", "!", "?", "，", "。", "！", "？")


@dataclass
class Span:
    """A piece of text and the language it is read in (zh, ja, en, ko, yue; 'digit'/'x' internally)."""

    lang: str
    text: str


def _script(char: str) -> str | None:
    """The raw language a character starts a run of, or None for marks/spaces (they join the run)."""
    code = ord(char)
    if "A" <= char <= "Z" or "a" <= char <= "z" or 0xFF21 <= code <= 0xFF3A or 0xFF41 <= code <= 0xFF5A:
        return "en"
    if char.isdigit() and code < 0x2000 or 0xFF10 <= code <= 0xFF19:
        return "digit"
    if (
        0x3041 <= code <= 0x309F
        or 0x30A0 <= code <= 0x30FF
        or 0x31F0 <= code <= 0x31FF
        or 0xFF66 <= code <= 0xFF9D
    ):
        return "ja"
    if 0x1100 <= code <= 0x11FF or 0x3130 <= code <= 0x318F or 0xAC00 <= code <= 0xD7AF:
        return "ko"
    if 0x4E00 <= code <= 0x9FFF or 0x3400 <= code <= 0x4DBF or 0x20000 <= code <= 0x323AF or char in "々〇":
        return "zh"
    if char.isalpha():
        return "x"
    return None


def _runs(text: str) -> list[Span]:
    """Script runs; marks and spaces join the run before them, Latin words join across spaces."""
    spans: list[Span] = []
    for i, char in enumerate(text):
        script = _script(char)
        if script == "digit" and spans and spans[-1].lang == "digit":
            spans[-1].text += char
        elif script is None:
            if (
                char == "."
                and spans
                and spans[-1].lang == "digit"
                and i + 1 < len(text)
                and text[i + 1].isdigit()
            ):
                spans[-1].text += char  # decimal point stays inside the number
            elif spans:
                spans[-1].text += char
            else:
                spans.append(Span("x", char))
        elif spans and (
            spans[-1].lang == script or (spans[-1].lang == "x" and not spans[-1].text.strip(" "))
        ):
            if spans[-1].lang == script and script == "en" and re.search(r"[^\sA-Za-z'\-]$", spans[-1].text):
                spans.append(Span(script, char))  # punctuation ended the previous English span
            else:
                spans[-1].lang = script
                spans[-1].text += char
        else:
            spans.append(Span(script, char))
    return _kanji_with_kana(spans)


def _kanji_with_kana(spans: list[Span]) -> list[Span]:
    """Han runs touching kana in one clause are Japanese (漢字 + かな), as fastText would say."""
    for i, span in enumerate(spans):
        if span.lang != "zh":
            continue
        neighbours = [spans[j] for j in (i - 1, i + 1) if 0 <= j < len(spans)]
        touching = [n for n in neighbours if n.lang == "ja"]
        ends_clause = span.text.rstrip()[-1:] in "，。！？、,.!?"
        if touching and not (ends_clause and spans[i - 1 : i] != touching[:1]):
            span.lang = "ja"
    return spans


def _merge(spans: list[Span], item: Span) -> None:
    if spans and spans[-1].lang == item.lang:
        spans[-1].text += item.text
    else:
        spans.append(Span(item.lang, item.text))


def _resolve_digits(spans: list[Span]) -> list[Span]:
    """Upstream's rules for a number between two languages (with no language forced)."""
    result: list[Span] = []
    for i, span in enumerate(spans):
        if span.lang == "digit":
            after = spans[i + 1] if i + 1 < len(spans) else None
            if result and after is None:
                span.lang = result[-1].lang
            elif not result and after is not None:
                span.lang = spans[1].lang
            elif result and after is not None:
                if result[-1].lang == after.lang:
                    span.lang = result[-1].lang
                elif result[-1].text[-1] in _SENTENCE_MARKS:
                    span.lang = after.lang
                elif after.text[0] in _SENTENCE_MARKS:
                    span.lang = result[-1].lang
                elif span.text[-1] in ("。", "."):
                    span.lang = result[-1].lang
                elif len(result[-1].text) >= len(after.text):
                    span.lang = result[-1].lang
                else:
                    span.lang = after.lang
            else:
                span.lang = "zh"
        _merge(result, span)
    return result


def detect_spans(text: str, default_lang: str = "") -> list[Span]:
    """Upstream LangSegmenter.getTexts: spans with lang in zh/ja/ko/en (default_lang forces non-English)."""
    merged: list[Span] = []
    has_digits = False
    for span in _runs(text):
        if span.lang == "digit":
            if default_lang:
                span.lang = default_lang
            else:
                has_digits = True
        elif _FULL_EN.match(span.text):
            span.lang = "en"
        elif default_lang:
            span.lang = default_lang
        _merge(merged, span)
    if has_digits:
        merged = _resolve_digits(merged)
    result: list[Span] = []
    for span in merged:  # unknown scripts take a neighbour's language
        if span.lang == "x":
            span.lang = result[-1].lang if result else (merged[1].lang if len(merged) > 1 else "zh")
        _merge(result, span)
    return result


def split_by_language(text: str, language: Language) -> list[Span]:
    """Spans with the g2p language of each (zh, ja, en, ko, yue), as upstream get_phones_and_bert."""
    text = re.sub(r" {2,}", " ", text)
    if language == Language.EN:
        return [Span("en", text)]
    forced = {Language.ALL_ZH: "zh", Language.ALL_YUE: "zh", Language.ALL_JA: "ja", Language.ALL_KO: "ko"}
    if language in forced or language in (Language.AUTO, Language.AUTO_YUE):
        spans = detect_spans(text, forced.get(language, ""))
        if language in (Language.ALL_YUE, Language.AUTO_YUE):
            spans = [Span("yue" if s.lang == "zh" else s.lang, s.text) for s in spans]
        return spans
    # Mixed modes (zh, ja, ko, yue): Han cannot tell zh/ja/ko apart, so the user's language wins.
    result: list[Span] = []
    for span in detect_spans(text):
        lang = "en" if span.lang == "en" else language.value
        if result and (lang == "en") == (result[-1].lang == "en"):
            result[-1].text += span.text
        else:
            result.append(Span(lang, span.text))
    return result
