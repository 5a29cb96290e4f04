"""TextFrontend: text -> sentences -> language spans -> phonemes and ids for GPT-SoVITS v2/v3.

Each language's g2p is a small strategy object imported on first use, so `import voicehub.text`
stays light and a missing optional package names its extra.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from voicehub.errors import MissingDependencyError, VoiceHubError
from voicehub.text.cut import cut_text
from voicehub.text.langseg import split_by_language
from voicehub.text.limits import check_text
from voicehub.text.options import CutMethod, Language, parse_cut_method, parse_language
from voicehub.text.symbols import UNKNOWN_SYMBOL, is_symbol, phones_to_ids

MIN_PHONES = 6  # fewer phonemes than this: upstream retries with a leading "."
MIN_ENGLISH_PHONES = 4  # an English span shorter than this gets a leading ","
# Chinese marks that upstream turns into longer silences (cleaner.special).
_SILENCE_MARKS = (("￥", "SP2"), ("^", "SP3"))

# g2p language -> (module, class, extra that installs its packages)
_STRATEGIES = {
    "zh": ("voicehub.text.zh.g2p", "ChineseG2P", "zh"),
    "en": ("voicehub.text.en.g2p", "EnglishG2P", "en"),
    "ja": ("voicehub.text.ja", "JapaneseG2P", "ja"),
    "ko": ("voicehub.text.ko", "KoreanG2P", "ko"),
    "yue": ("voicehub.text.yue", "CantoneseG2P", "yue"),
}


class LanguageNotSupportedError(VoiceHubError, ValueError):
    """This build has no g2p for a language upstream supports."""


class G2P(Protocol):
    language: str

    def normalize(self, text: str) -> str: ...

    def g2p(self, norm_text: str) -> tuple[list[str], list[int] | None]: ...


@dataclass(frozen=True)
class TextSegment:
    """One language span: `word2ph[i]` phonemes belong to `norm_text[i]` (Chinese only, for BERT)."""

    language: str  # zh, ja, en, ko or yue
    norm_text: str
    phones: list[str]
    phone_ids: list[int]
    word2ph: list[int] | None


class TextFrontend:
    """GPT-SoVITS v3 text frontend.

    g2pw_model_dir: a GPT-SoVITS `GPT_SoVITS/text/G2PWModel` folder: Chinese polyphones are then read
    by its ONNX model with upstream's correction dictionary, as upstream's default; without it they come
    from pypinyin (upstream's non-G2PW branch). `polyphone_source` says which is in use.
    bert_dir: the chinese-roberta-wwm-ext-large folder whose tokenizer G2PW reads (G2PW only).
    """

    def __init__(self, g2pw_model_dir: str | Path | None = None, bert_dir: str | Path | None = None):
        self._g2pw_dir = None
        if g2pw_model_dir is not None:
            if bert_dir is None:
                raise ValueError(
                    "g2pw_model_dir needs bert_dir too: the chinese-roberta-wwm-ext-large folder "
                    "(GPT_SoVITS/pretrained_models/chinese-roberta-wwm-ext-large) whose tokenizer G2PW reads"
                )
            from voicehub.text.zh.g2pw import find_g2pw_files

            self._g2pw_dir, _ = find_g2pw_files(g2pw_model_dir)  # a missing file is named here, not later
        self._bert_dir = Path(bert_dir) if bert_dir else None
        self._strategies: dict[str, G2P] = {}  # built on first use, per frontend

    @property
    def polyphone_source(self) -> str:
        """'g2pw' or 'pypinyin': where Chinese polyphone readings come from."""
        return "g2pw" if self._g2pw_dir else "pypinyin"

    def cut(self, text: str, method: str | CutMethod, language: str | Language | None = None) -> list[str]:
        """Sentences synthesised one by one (upstream pre_seg_text); `language` picks 。 or . as filler."""
        cut_method = parse_cut_method(method)
        is_english = language is not None and parse_language(language) == Language.EN
        return cut_text(check_text(text), cut_method, is_english)

    def segments(self, text: str, language: str | Language) -> list[TextSegment]:
        """Language spans of one sentence with phonemes (upstream get_phones_and_bert).

        Fewer than 6 phonemes in all: the text is redone with a leading "." as upstream does.
        Returns [] when nothing speakable is left after normalisation.
        """
        lang = parse_language(language)
        segments = self._segments(text, lang)
        if sum(len(s.phones) for s in segments) < MIN_PHONES:
            segments = self._segments("." + text, lang)
        if not "".join(s.norm_text for s in segments):
            return []
        return segments

    def g2p(self, language: str) -> G2P:
        """The strategy for a g2p language (zh, ja, en, ko, yue), built on first use."""
        if language not in self._strategies:
            self._strategies[language] = self._build(language)
        return self._strategies[language]

    def _build(self, language: str) -> G2P:
        module_name, class_name, extra = _STRATEGIES[language]
        try:
            module = importlib.import_module(module_name)
            if language == "zh" and self._g2pw_dir is not None:
                from voicehub.text.zh.g2pw import G2PWReader, polyphone_corrections

                reader = G2PWReader(self._g2pw_dir, self._bert_dir)
                return module.ChineseG2P(polyphone_model=reader, corrections=polyphone_corrections())
            return getattr(module, class_name)()
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("voicehub"):
                raise LanguageNotSupportedError(f"no g2p for language {language!r} in this build") from exc
            raise MissingDependencyError(
                f'{language} text needs the package {exc.name!r}: pip install "voicehub[{extra}]"'
            ) from exc

    def _segments(self, text: str, language: Language) -> list[TextSegment]:
        return [self._clean(span.text, span.lang) for span in split_by_language(text, language)]

    def _clean(self, text: str, language: str) -> TextSegment:
        """Upstream cleaner.clean_text for one span."""
        g2p = self.g2p(language)
        if language == "zh":
            for mark, symbol in _SILENCE_MARKS:
                if mark in text:
                    norm_text = g2p.normalize(text.replace(mark, ","))
                    phones, word2ph = g2p.g2p(norm_text)
                    phones = [symbol if p == "," else p for p in phones]
                    return TextSegment(language, norm_text, phones, phones_to_ids(phones), word2ph)
        norm_text = g2p.normalize(text)
        phones, word2ph = g2p.g2p(norm_text)
        if language in ("zh", "yue"):
            assert word2ph is not None and len(phones) == sum(word2ph) and len(norm_text) == len(word2ph)
        if language == "en" and len(phones) < MIN_ENGLISH_PHONES:
            phones = [",", *phones]
        phones = [p if is_symbol(p) else UNKNOWN_SYMBOL for p in phones]
        return TextSegment(language, norm_text, phones, phones_to_ids(phones), word2ph)
