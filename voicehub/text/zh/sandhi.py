"""Mandarin tone sandhi on jieba words: 不, 一, neutral tones and third-tone chains.

Behaviour follows GPT-SoVITS tone_sandhi.py (from PaddleSpeech), including its quirks, because the
T2S model was trained on its output. Finals are pypinyin FINALS_TONE3 strings such as 'ao3'.
"""

from __future__ import annotations

import functools
import json
from importlib import resources

import jieba
from pypinyin import Style, lazy_pinyin

_PUNCT = "：，；。？！“”‘’':,;.?!"
Word = list  # [word, pos]: mutable pairs, as the merge passes extend words in place


@functools.cache
def _word_lists() -> tuple[frozenset[str], frozenset[str]]:
    raw = json.loads(resources.files("voicehub.text").joinpath("data/zh_tone_sandhi.json").read_text("utf-8"))
    return frozenset(raw["must_neural_tone_words"]), frozenset(raw["must_not_neural_tone_words"])


def _set_tone(final: str, tone: str) -> str:
    return final[:-1] + tone


def _all_third(finals: list[str]) -> bool:
    return all(f[-1] == "3" for f in finals)


def _finals(word: str) -> list[str]:
    return lazy_pinyin(word, neutral_tone_with_five=True, style=Style.FINALS_TONE3)


def split_word(word: str) -> list[str]:
    """A word split in two around its shortest jieba search-mode sub-word."""
    first = sorted(jieba.cut_for_search(word), key=len)[0]
    if word.find(first) == 0:
        return [first, word[len(first) :]]
    return [word[: -len(first)], first]


def _neutral_sandhi(word: str, pos: str, finals: list[str]) -> list[str]:
    must, must_not = _word_lists()
    for j in range(1, len(word)):  # reduplicated nouns, verbs, adjectives: 奶奶, 试试
        if word[j] == word[j - 1] and pos[0] in "nva" and word not in must_not:
            finals[j] = _set_tone(finals[j], "5")
    ge = word.find("个")
    last = word[-1] if word else ""
    if last and last in "吧呢哈啊呐噻嘛吖嗨呐哦哒额滴哩哟喽啰耶喔诶":
        finals[-1] = _set_tone(finals[-1], "5")
    elif last and last in "的地得":
        finals[-1] = _set_tone(finals[-1], "5")
    elif len(word) == 1 and word in "了着过" and pos in {"ul", "uz", "ug"}:
        finals[-1] = _set_tone(finals[-1], "5")
    elif len(word) > 1 and last in "们子" and pos in {"r", "n"} and word not in must_not:
        finals[-1] = _set_tone(finals[-1], "5")
    elif len(word) > 1 and last in "上下里" and pos in {"s", "l", "f"}:
        finals[-1] = _set_tone(finals[-1], "5")
    elif len(word) > 1 and last in "来去" and word[-2] in "上下进出回过起开":
        finals[-1] = _set_tone(finals[-1], "5")
    elif (ge >= 1 and (word[ge - 1].isnumeric() or word[ge - 1] in "几有两半多各整每做是")) or word == "个":
        finals[ge] = _set_tone(finals[ge], "5")
    elif word in must or word[-2:] in must:
        finals[-1] = _set_tone(finals[-1], "5")
    parts = split_word(word)
    groups = [finals[: len(parts[0])], finals[len(parts[0]) :]]
    for part, group in zip(parts, groups):
        # Upstream writes to group[-1] even when the group is empty only if the word matches; an
        # empty group cannot match because its part is empty.
        if part in must or part[-2:] in must:
            group[-1] = _set_tone(group[-1], "5")
    return groups[0] + groups[1]


def _bu_sandhi(word: str, finals: list[str]) -> list[str]:
    if len(word) == 3 and word[1] == "不":  # 看不懂
        finals[1] = _set_tone(finals[1], "5")
        return finals
    for i, char in enumerate(word[:-1]):
        if char == "不" and finals[i + 1][-1] == "4":  # 不怕
            finals[i] = _set_tone(finals[i], "2")
    return finals


def _yi_sandhi(word: str, finals: list[str]) -> list[str]:
    if "一" in word and all(c.isnumeric() for c in word if c != "一"):
        return finals  # a digit string such as 一零零
    if len(word) == 3 and word[1] == "一" and word[0] == word[-1]:
        finals[1] = _set_tone(finals[1], "5")  # 看一看
    elif word.startswith("第一"):
        finals[1] = _set_tone(finals[1], "1")
    else:
        for i, char in enumerate(word[:-1]):
            if char != "一":
                continue
            if finals[i + 1][-1] == "4":
                finals[i] = _set_tone(finals[i], "2")
            elif word[i + 1] not in _PUNCT:
                finals[i] = _set_tone(finals[i], "4")
    return finals


def _three_sandhi(word: str, finals: list[str]) -> list[str]:
    if len(word) == 2 and _all_third(finals):
        finals[0] = _set_tone(finals[0], "2")
    elif len(word) == 3:
        parts = split_word(word)
        if _all_third(finals):
            if len(parts[0]) == 2:  # 蒙古/包
                finals[0] = _set_tone(finals[0], "2")
                finals[1] = _set_tone(finals[1], "2")
            elif len(parts[0]) == 1:  # 纸/老虎
                finals[1] = _set_tone(finals[1], "2")
        else:
            groups = [finals[: len(parts[0])], finals[len(parts[0]) :]]
            for i, group in enumerate(groups):
                if _all_third(group) and len(group) == 2:  # 所有/人
                    group[0] = _set_tone(group[0], "2")
                elif i == 1 and not _all_third(group) and group[0][-1] == "3" and groups[0][-1][-1] == "3":
                    groups[0][-1] = _set_tone(groups[0][-1], "2")  # 好/喜欢
                finals = groups[0] + groups[1]
    elif len(word) == 4:  # idioms: two words of two
        groups = [finals[:2], finals[2:]]
        for group in groups:
            if _all_third(group):
                group[0] = _set_tone(group[0], "2")
        finals = groups[0] + groups[1]
    return finals


def modify_tones(word: str, pos: str, finals: list[str]) -> list[str]:
    """The word's finals after 不, 一, neutral-tone and third-tone sandhi."""
    finals = _bu_sandhi(word, finals)
    finals = _yi_sandhi(word, finals)
    finals = _neutral_sandhi(word, pos, finals)
    return _three_sandhi(word, finals)


def _merge_bu(seg: list[tuple[str, str]]) -> list[Word]:
    merged, last = [], ""
    for word, pos in seg:
        if last == "不":
            word = last + word
        if word != "不":
            merged.append([word, pos])
        last = word
    if last == "不":
        merged.append([last, "d"])
    return merged


def _merge_yi(seg: list[Word]) -> list[Word]:
    merged, i = [], 0
    while i < len(seg):  # 听 一 听 -> 听一听
        word, pos = seg[i]
        if i >= 1 and word == "一" and i + 1 < len(seg):
            last = merged[-1] if merged else seg[i - 1]
            if last[0] == seg[i + 1][0] and last[1] == "v" and seg[i + 1][1] == "v":
                merged[-1] = [last[0] + "一" + seg[i + 1][0], last[1]]
                i += 2
                continue
        merged.append([word, pos])
        i += 1
    result: list[Word] = []
    for word, pos in merged:  # a lone 一 joins the next word
        if result and result[-1][0] == "一":
            result[-1][0] += word
        else:
            result.append([word, pos])
    return result


def _merge_reduplication(seg: list[Word]) -> list[Word]:
    merged: list[Word] = []
    for word, pos in seg:
        if merged and word == merged[-1][0]:
            merged[-1][0] += word
        else:
            merged.append([word, pos])
    return merged


def _merge_third_tones(seg: list[Word], whole_words: bool) -> list[Word]:
    """Join neighbours that meet in third tones (whole words, or last/first syllable)."""
    finals = [_finals(word) for word, _ in seg]
    merged: list[Word] = []
    joined_prev = False
    for i, (word, pos) in enumerate(seg):
        if whole_words:
            meets = i >= 1 and _all_third(finals[i - 1]) and _all_third(finals[i])
        else:
            meets = i >= 1 and finals[i - 1][-1][-1] == "3" and finals[i][0][-1] == "3"
        prev = seg[i - 1][0] if i >= 1 else ""
        is_redup = len(prev) == 2 and prev[0] == prev[1]
        if meets and not joined_prev and not is_redup and len(prev) + len(word) <= 3:
            merged[-1][0] += word
            joined_prev = True
        else:
            merged.append([word, pos])
            joined_prev = False
    return merged


def _merge_er(seg: list[Word]) -> list[Word]:
    merged: list[Word] = []
    for i, (word, pos) in enumerate(seg):
        if i >= 1 and word == "儿" and seg[i - 1][0] != "#":
            merged[-1][0] += word
        else:
            merged.append([word, pos])
    return merged


def merge_for_sandhi(seg: list[tuple[str, str]]) -> list[Word]:
    """jieba (word, pos) pairs -> the merged words sandhi is applied to."""
    words = _merge_bu(seg)
    words = _merge_yi(words)
    words = _merge_reduplication(words)
    for whole_words in (True, False):
        try:
            words = _merge_third_tones(words, whole_words)
        except IndexError:
            pass  # upstream skips the pass when a word has no pinyin at all
    return _merge_er(words)
