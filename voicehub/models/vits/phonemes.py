"""Text -> sentences of Piper phonemes -> phoneme ids.

Two espeak-ng backends, one strategy interface (`Phonemizer.sentences`):
- `piper`: piper-tts's bundled espeak-ng (the `piper` extra, GPL-3.0, imported only when used);
  sentences are exactly espeak's split, as Piper makes them.
- `espeak_ng`: the `espeak-ng` program on PATH. It prints IPA clause by clause but not the
  punctuation Piper feeds the voice, so clauses are cut here at , ; : . ! ? and paragraph breaks
  and each is phonemized alone; phonemes match the `piper` backend on ordinary prose.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import threading
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from voicehub.choices import parse_choice
from voicehub.errors import MissingDependencyError
from voicehub.models.vits.config import BOS, EOS, PAD

log = logging.getLogger(__name__)

INSTALL_HINT = 'pip install "voicehub[piper]" (bundles espeak-ng), or install the espeak-ng program (apt-get install espeak-ng)'
ESPEAK_TIMEOUT_S = 60
SUPPORTED_PHONEME_TYPES = ("espeak", "text")
# A clause ends at , ; : or a run of . ! ? followed by space or the end; "..." and "…" do not end one
# (espeak joins across them). Paragraph breaks end a sentence.
_CLAUSE_END = re.compile(r"(?<!\.)([,;:]|[!?]+|\.(?!\.)[!?]*)[\"'”’)\]]*(?=\s|$)|\n[ \t]*\n")
_LANG_FLAG = re.compile(r"\([^)]+\)")  # espeak marks words from other languages as (fr)...(en)


class PhonemizerBackend(StrEnum):
    AUTO = "auto"
    PIPER = "piper"
    ESPEAK_NG = "espeak_ng"


@dataclass(frozen=True)
class Sentence:
    """One sentence: the span of input text it speaks and its phonemes (NFD code points)."""

    text: str
    phonemes: tuple[str, ...]

    @property
    def phoneme_str(self) -> str:
        return "".join(self.phonemes)


def phoneme_ids(phonemes: Sequence[str], id_map: Mapping[str, Sequence[int]]) -> list[int]:
    """Piper's id layout: BOS, PAD, then each phoneme followed by PAD, then EOS."""
    ids = [*id_map[BOS], *id_map[PAD]]
    missing = []
    for p in phonemes:
        if p not in id_map:
            missing.append(p)
            continue
        ids.extend(id_map[p])
        ids.extend(id_map[PAD])
    if missing:  # Piper skips these too; say so rather than drop them unseen
        log.warning(
            "phonemes not in the voice's phoneme_id_map were skipped: %s", "".join(sorted(set(missing)))
        )
    ids.extend(id_map[EOS])
    return ids


class PiperEspeakPhonemizer:
    """espeak-ng through piper-tts's bundled library: Piper's own sentence split and phonemes."""

    name = PhonemizerBackend.PIPER.value

    def __init__(self, voice: str) -> None:
        try:
            from piper.phonemize_espeak import EspeakPhonemizer
        except ImportError as exc:
            raise MissingDependencyError(f"piper-tts is not installed; {INSTALL_HINT}") from exc
        self.voice = voice
        self._espeak = EspeakPhonemizer()
        self._lock = threading.Lock()  # the bridge keeps one global espeak state

    def sentences(self, text: str) -> Iterator[Sentence]:
        with self._lock:
            groups = [g for g in self._espeak.phonemize(self.voice, text) if g]
        spans = _align_spans(text, groups)
        for span, group in zip(spans, groups):
            yield Sentence(span, tuple(group))


class EspeakProgramPhonemizer:
    """espeak-ng through the `espeak-ng` program (one call per clause, sentence by sentence)."""

    name = PhonemizerBackend.ESPEAK_NG.value

    def __init__(self, voice: str, program: str | None = None) -> None:
        found = program or shutil.which("espeak-ng")
        if not found:
            raise MissingDependencyError(f"the espeak-ng program is not on PATH; {INSTALL_HINT}")
        self.voice = voice
        self.program = found

    def _ipa(self, clause: str) -> str:
        run = subprocess.run(
            [self.program, "-q", "--ipa", "-v", self.voice, "-b", "1", "--stdin"],
            input=clause.encode("utf-8"),
            capture_output=True,
            timeout=ESPEAK_TIMEOUT_S,
            check=False,
        )
        if run.returncode != 0:
            raise RuntimeError(
                f"espeak-ng failed (exit {run.returncode}): {run.stderr.decode(errors='replace')}"
            )
        lines = [ln.strip() for ln in run.stdout.decode("utf-8").splitlines() if ln.strip()]
        # Clause breaks espeak finds inside (e.g. at "...") carry no punctuation; Piper joins them bare.
        return _LANG_FLAG.sub("", "".join(lines))

    def sentences(self, text: str) -> Iterator[Sentence]:
        for span, clauses in split_sentences(text):
            phonemes: list[str] = []
            for clause, terminator in clauses:
                ipa = self._ipa(clause) + terminator + (" " if terminator in (",", ":", ";") else "")
                phonemes.extend(unicodedata.normalize("NFD", ipa))
            if any(p.strip() for p in phonemes):
                yield Sentence(span, tuple(phonemes))


class CodepointPhonemizer:
    """For voices with phoneme_type "text": the phonemes are the text's NFD code points."""

    name = "text"

    def sentences(self, text: str) -> Iterator[Sentence]:
        yield Sentence(text, tuple(unicodedata.normalize("NFD", text)))


def split_sentences(text: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """Sentences as (span, [(clause text, terminator), ...]); a terminator is ',', '.', '?', ... or ''."""
    sentences: list[tuple[str, list[tuple[str, str]]]] = []
    clauses: list[tuple[str, str]] = []
    start = sent_start = 0
    for m in _CLAUSE_END.finditer(text):
        mark = m.group(1) or ""
        if text[start : m.start()].strip():
            clauses.append((text[start : m.start()].strip(), mark[:1]))
        start = m.end()
        if mark[:1] not in (",", ";", ":"):  # . ! ? or a paragraph break ends the sentence
            if clauses:
                sentences.append((text[sent_start : m.end()].strip(), clauses))
            clauses, sent_start = [], m.end()
    if text[start:].strip():
        clauses.append((text[start:].strip(), ""))
    if clauses:
        sentences.append((text[sent_start:].strip(), clauses))
    return sentences


def _align_spans(text: str, groups: list[list[str]]) -> list[str]:
    """Best-effort input span of each of espeak's sentences.

    espeak does not say where in the text a sentence ends, so each one is matched to a sentence
    end found here (same closing mark) whose share of the text is nearest its share of the
    phonemes; this keeps abbreviations such as "e.g." from cutting a span short.
    """
    ends = [
        (m.end(), (m.group(1) or "")[:1])
        for m in _CLAUSE_END.finditer(text)
        if (m.group(1) or ".")[0] in ".!?"
    ]
    total_ph = sum(len(g) for g in groups) or 1
    spans, cursor, done_ph = [], 0, 0
    for i, group in enumerate(groups):
        done_ph += len(group)
        if i == len(groups) - 1:
            spans.append(text[cursor:].strip())
            break
        last = group[-1] if group[-1] in ".!?" else ""
        options = [end for end, mark in ends if end > cursor and mark == last]
        target = len(text) * done_ph / total_ph
        end = min(options, key=lambda e: abs(e - target)) if options else len(text)
        spans.append(text[cursor:end].strip())
        cursor = end
    return spans


def make_phonemizer(
    voice: str, phoneme_type: str = "espeak", backend: PhonemizerBackend | str = PhonemizerBackend.AUTO
) -> PiperEspeakPhonemizer | EspeakProgramPhonemizer | CodepointPhonemizer:
    """The phonemizer for a voice; `auto` prefers piper-tts's bundled espeak-ng, then the program."""
    backend = parse_choice(PhonemizerBackend, backend, "phonemizer")
    if phoneme_type == "text":
        return CodepointPhonemizer()
    if phoneme_type not in SUPPORTED_PHONEME_TYPES:
        raise ValueError(
            f"phoneme_type {phoneme_type!r} is not supported; supported: {', '.join(SUPPORTED_PHONEME_TYPES)}"
        )
    if backend is PhonemizerBackend.PIPER:
        return PiperEspeakPhonemizer(voice)
    if backend is PhonemizerBackend.ESPEAK_NG:
        return EspeakProgramPhonemizer(voice)
    try:
        return PiperEspeakPhonemizer(voice)
    except MissingDependencyError:
        pass
    try:
        return EspeakProgramPhonemizer(voice)
    except MissingDependencyError:
        raise MissingDependencyError(f"no espeak-ng phonemizer found; {INSTALL_HINT}") from None
