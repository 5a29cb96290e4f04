"""Chinese normalised text -> v2 phonemes and word2ph (phonemes per character, for BERT features)."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from importlib import resources

import jieba
import jieba.posseg as posseg
from pypinyin import Style, lazy_pinyin
from pypinyin.contrib.tone_convert import to_finals_tone3, to_initials

from voicehub.text.symbols import PUNCTUATION
from voicehub.text.zh.normalize import normalize_chinese
from voicehub.text.zh.sandhi import merge_for_sandhi, modify_tones

# 儿 read as its own syllable in these words, or always merged in these (upstream chinese2).
_MUST_ERHUA = frozenset({"小院儿", "胡同儿", "范儿", "老汉儿", "撒欢儿", "寻老礼儿", "妥妥儿", "媳妇儿"})
_NOT_ERHUA = frozenset(
    "虐儿 为儿 护儿 瞒儿 救儿 替儿 有儿 一儿 我儿 俺儿 妻儿 拐儿 聋儿 乞儿 患儿 幼儿 孤儿 婴儿 婴幼儿 连体儿 脑瘫儿 "
    "流浪儿 体弱儿 混血儿 蜜雪儿 舫儿 祖儿 美儿 应采儿 可儿 侄儿 孙儿 侄孙儿 女儿 男儿 红孩儿 花儿 虫儿 马儿 鸟儿 猪儿 "
    "猫儿 狗儿 少儿".split()
)
_SENTENCE_SPLIT = re.compile(r"(?<=[" + "".join(PUNCTUATION) + r"])\s*")
# pypinyin spellings -> the opencpop spellings the symbol map is keyed by.
_FINAL_FIXES = {"uei": "ui", "iou": "iu", "uen": "un"}
_ZERO_INITIAL_WHOLE = {"ing": "ying", "i": "yi", "in": "yin", "u": "wu"}
_ZERO_INITIAL_FIRST = {"v": "yu", "e": "e", "i": "y", "u": "w"}

# Per-sentence pinyin for every character (None where the model has no answer), e.g. G2PW.
PolyphoneModel = Callable[[list[str]], list[list[str | None]]]


@functools.cache
def pinyin_to_symbols() -> dict[str, tuple[str, str]]:
    """opencpop-strict.txt: toneless pinyin -> (initial symbol, final symbol without tone)."""
    table = {}
    text = resources.files("voicehub.text").joinpath("data/opencpop-strict.txt").read_text("utf-8")
    for line in text.splitlines():
        pinyin, symbols = line.split("\t")
        initial, final = symbols.strip().split(" ")
        table[pinyin] = (initial, final)
    return table


def _merge_erhua(initials: list[str], finals: list[str], word: str, pos: str) -> tuple[list[str], list[str]]:
    for i, final in enumerate(finals):  # a final 儿 in er1 is er2
        if i == len(finals) - 1 and word[i] == "儿" and final == "er1":
            finals[i] = "er2"
    if word not in _MUST_ERHUA and (word in _NOT_ERHUA or pos in {"a", "j", "nr"}):
        return initials, finals
    if len(finals) != len(word):
        return initials, finals
    new_finals: list[str] = []
    for i, final in enumerate(finals):
        if (
            i == len(finals) - 1
            and word[i] == "儿"
            and final in {"er2", "er5"}
            and word[-2:] not in _NOT_ERHUA
            and new_finals
        ):
            final = "er" + new_finals[-1][-1]  # 儿 takes the tone of the syllable before it
        new_finals.append(final)
    return list(initials), new_finals


def _symbols_for(initial: str, final: str) -> list[str]:
    """One syllable (pypinyin initial, FINALS_TONE3 final) -> its two v2 symbols, or a mark."""
    if initial == final:
        assert initial in PUNCTUATION, (initial, final)
        return [initial]
    toneless, tone = final[:-1], final[-1]
    assert tone in "12345", final
    pinyin = initial + toneless
    if initial:
        pinyin = initial + _FINAL_FIXES.get(toneless, toneless)
    elif pinyin in _ZERO_INITIAL_WHOLE:
        pinyin = _ZERO_INITIAL_WHOLE[pinyin]
    elif pinyin[0] in _ZERO_INITIAL_FIRST:
        pinyin = _ZERO_INITIAL_FIRST[pinyin[0]] + pinyin[1:]
    new_initial, new_final = pinyin_to_symbols()[pinyin]
    return [new_initial, new_final + tone]


class ChineseG2P:
    """Mandarin frontend. Polyphones come from `polyphone_model` (G2PW) when given, else pypinyin."""

    language = "zh"

    def __init__(self, polyphone_model: PolyphoneModel | None = None, corrections: dict | None = None):
        self._model = polyphone_model
        self._corrections = corrections or {}
        jieba.setLogLevel(60)  # jieba logs its dictionary load at INFO; keep callers' logs clean
        self.polyphone_source = "g2pw" if polyphone_model is not None else "pypinyin"

    def normalize(self, text: str) -> str:
        return normalize_chinese(text)

    def g2p(self, norm_text: str) -> tuple[list[str], list[int]]:
        """Phonemes and word2ph (len(word2ph) == len(norm_text), sum(word2ph) == len(phones))."""
        sentences = [s for s in _SENTENCE_SPLIT.split(norm_text) if s.strip()]
        sentences = [re.sub("[a-zA-Z]+", "", s) for s in sentences]
        model_pinyins = iter(
            self._model([s for s in sentences if s]) if self._model and any(sentences) else []
        )
        phones: list[str] = []
        word2ph: list[int] = []
        for sentence in sentences:
            pinyins = next(model_pinyins) if self._model and sentence else None
            for initial, final in self._syllables(sentence, pinyins):
                syllable = _symbols_for(initial, final)
                phones += syllable
                word2ph.append(len(syllable))
        return phones, word2ph

    def _syllables(self, sentence: str, pinyins: list[str | None] | None) -> list[tuple[str, str]]:
        words = merge_for_sandhi(posseg.lcut(sentence))
        initials: list[str] = []
        finals: list[str] = []
        offset = 0
        for word, pos in words:
            start, offset = offset, offset + len(word)
            if pos == "eng":
                continue
            if pinyins is None:
                sub_initials = lazy_pinyin(word, neutral_tone_with_five=True, style=Style.INITIALS)
                sub_finals = lazy_pinyin(word, neutral_tone_with_five=True, style=Style.FINALS_TONE3)
            else:
                sub_initials, sub_finals = self._split_model_pinyins(word, pinyins[start:offset])
            sub_finals = modify_tones(word, pos, sub_finals)
            sub_initials, sub_finals = _merge_erhua(sub_initials, sub_finals, word, pos)
            initials += sub_initials
            finals += sub_finals
        return list(zip(initials, finals))

    def _split_model_pinyins(self, word: str, pinyins: list) -> tuple[list[str], list[str]]:
        pinyins = self._correct(word, list(pinyins))
        initials, finals = [], []
        for pinyin in pinyins:
            if pinyin[0].isalpha():
                initials.append(to_initials(pinyin))
                finals.append(to_finals_tone3(pinyin, neutral_tone_with_five=True))
            else:  # punctuation passes through as both parts
                initials.append(pinyin)
                finals.append(pinyin)
        return initials, finals

    def _correct(self, word: str, pinyins: list) -> list:
        """Upstream's polyphone dictionary: a whole-word entry wins, else per-character entries."""
        if word in self._corrections:
            return list(self._corrections[word])
        for i, char in enumerate(word):
            if char in self._corrections:
                pinyins[i] = self._corrections[char][0]
        return pinyins
