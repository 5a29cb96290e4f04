"""Sentence cutting, with upstream GPT-SoVITS's cut0..cut5 semantics and its pre-segmentation rules."""

from __future__ import annotations

import re
from collections.abc import Callable

from voicehub.text.options import CutMethod

# Marks that end a sentence piece (upstream `splits`).
SPLITS = frozenset("，。？！,.?!~:：—…")
# A piece made only of these is dropped by cut1-cut4 (upstream text_segmentation_method `punctuation`).
_DROP_IF_ONLY = frozenset("!?…,.- ")
# cut5's marks.
_CUT5_MARKS = frozenset(",.;?!、，。？！;：…")
# Runs of these collapse to their first mark before cutting (upstream TextPreprocessor `punctuation`).
_COLLAPSE_RE = re.compile(r"([!?…,.\-])([!?…,.\-])+")
MAX_PIECE_CHARS = 510  # the Chinese BERT's limit; longer pieces are split at punctuation
MIN_PIECE_CHARS = 5  # shorter pieces are merged into the previous one


def _is_only(piece: str, marks: frozenset[str]) -> bool:
    return set(piece) <= marks


def _sentences(text: str) -> list[str]:
    """Pieces each ending at a SPLITS mark (the last one gets a 。 if it has none)."""
    text = text.replace("……", "。").replace("——", "，")
    if text[-1] not in SPLITS:
        text += "。"
    pieces, start = [], 0
    for end, char in enumerate(text, start=1):
        if char in SPLITS:
            pieces.append(text[start:end])
            start = end
    return pieces


def _keep(pieces: list[str]) -> str:
    return "\n".join(p for p in pieces if not _is_only(p, _DROP_IF_ONLY))


def _cut_none(text: str) -> str:
    return "\n" if _is_only(text, _DROP_IF_ONLY) else text


def _cut_every_4_sentences(text: str) -> str:
    text = text.strip("\n")
    sentences = _sentences(text)
    # Groups start every 4 sentences, but the last start is dropped, so the tail group holds 4-7.
    bounds = list(range(0, len(sentences), 4))[:-1] + [len(sentences)]
    if len(bounds) < 2:  # up to 4 sentences: upstream keeps the input as it was (no added 。)
        return _keep([text])
    return _keep(["".join(sentences[a:b]) for a, b in zip(bounds, bounds[1:])])


def _cut_every_50_chars(text: str) -> str:
    text = text.strip("\n")
    sentences = _sentences(text)
    if len(sentences) < 2:
        return text
    groups, current = [], ""
    for sentence in sentences:
        current += sentence
        if len(current) > 50:
            groups.append(current)
            current = ""
    if current:
        groups.append(current)
    if len(groups) > 1 and len(groups[-1]) < 50:  # a short tail joins the group before it
        groups[-2:] = [groups[-2] + groups[-1]]
    return _keep(groups)


def _cut_zh_period(text: str) -> str:
    return _keep(text.strip("\n").strip("。").split("。"))


def _cut_en_period(text: str) -> str:
    return _keep(re.split(r"(?<!\d)\.(?!\d)", text.strip("\n").strip(".")))


def _cut_punctuation(text: str) -> str:
    text = text.strip("\n")
    pieces, current = [], []
    for i, char in enumerate(text):
        current.append(char)
        is_decimal_point = (
            char == "." and 0 < i < len(text) - 1 and text[i - 1].isdigit() and text[i + 1].isdigit()
        )
        if char in _CUT5_MARKS and not is_decimal_point:
            pieces.append("".join(current))
            current = []
    if current:
        pieces.append("".join(current))
    return "\n".join(p for p in pieces if not _is_only(p, _CUT5_MARKS))


_CUTTERS: dict[CutMethod, Callable[[str], str]] = {
    CutMethod.NONE: _cut_none,
    CutMethod.EVERY_4_SENTENCES: _cut_every_4_sentences,
    CutMethod.EVERY_50_CHARS: _cut_every_50_chars,
    CutMethod.ZH_PERIOD: _cut_zh_period,
    CutMethod.EN_PERIOD: _cut_en_period,
    CutMethod.PUNCTUATION: _cut_punctuation,
}


def apply_cut(text: str, method: CutMethod) -> str:
    """Upstream's cutN(text): the pieces joined by newlines (text must be non-empty)."""
    return _CUTTERS[method](text)


def split_long_piece(text: str, max_chars: int = MAX_PIECE_CHARS) -> list[str]:
    """Split a piece over `max_chars` at punctuation (upstream split_big_text)."""
    parts = re.split("([" + "".join(sorted(SPLITS)) + "])", text)
    pieces, current = [], ""
    for part in parts:
        if len(current + part) > max_chars:
            pieces.append(current)
            current = part
        else:
            current += part
    if current:
        pieces.append(current)
    return pieces


def _merge_short(pieces: list[str], threshold: int) -> list[str]:
    if len(pieces) < 2:
        return pieces
    merged, current = [], ""
    for piece in pieces:
        current += piece
        if len(current) >= threshold:
            merged.append(current)
            current = ""
    if current:
        if merged:
            merged[-1] += current
        else:
            merged.append(current)
    return merged


def _first_sentence(text: str) -> str:
    return re.split("[" + re.escape("".join(sorted(SPLITS))) + "]", text)[0].strip()


def cut_text(text: str, method: CutMethod, is_english: bool) -> list[str]:
    """Text -> the pieces synthesised one by one, as upstream TextPreprocessor.pre_seg_text does.

    Runs of ASCII punctuation collapse, a short first sentence gets a leading 。 (or . for English),
    pieces of punctuation only are dropped, short pieces merge, each piece ends with a mark, and
    pieces over 510 characters are split. Returns [] for empty text.
    """
    text = _COLLAPSE_RE.sub(r"\1", text).strip("\n")
    if not text:
        return []
    period = "." if is_english else "。"
    if text[0] not in SPLITS and len(_first_sentence(text)) < 4:
        text = period + text
    text = apply_cut(text, method)
    while "\n\n" in text:
        text = text.replace("\n\n", "\n")
    pieces = text.split("\n")
    if all(p in ("", " ", "\n") for p in pieces):
        return []  # upstream raises "请输入有效文本" here; callers check the text first
    pieces = _merge_short([p for p in pieces if p not in ("", " ")], MIN_PIECE_CHARS)
    result = []
    for piece in pieces:
        if not piece.strip() or not re.sub(r"\W+", "", piece):
            continue  # blank or punctuation only
        if piece[-1] not in SPLITS:
            piece += period
        result.extend(split_long_piece(piece) if len(piece) > MAX_PIECE_CHARS else [piece])
    return result
