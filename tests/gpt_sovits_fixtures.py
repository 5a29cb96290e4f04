"""Shared GPT-SoVITS v3 test inputs: one tiny `make-checkpoint` set and one real-speech reference per session.

Both are written under pytest's session base folder and reused when present, so every test module
that imports these fixtures gets the same files, built once.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

REFERENCE_TEXT = "The quick brown fox jumps over the lazy dog, and then it runs away into the forest."
SET_SEED = 0


def _once(base: Path, name: str, build) -> Path:
    folder = base / name
    done = folder / ".complete"
    if not done.exists():
        build(folder)
        done.touch()
    return folder


@pytest.fixture(scope="session")
def tiny_set(tmp_path_factory) -> Path:
    """OUT of `make-checkpoint gpt-sovits-v3 --size tiny --seed 0` (gpt.ckpt, sovits.pth, lora/, pretrained_models/)."""
    from voicehub.models.gpt_sovits.make_checkpoint import make_checkpoint_set

    def build(folder: Path) -> None:
        make_checkpoint_set(folder, "tiny", seed=SET_SEED, margin_tokens=0)

    return _once(tmp_path_factory.getbasetemp(), "gpt-sovits-tiny", build)


@pytest.fixture(scope="session")
def reference_wav(tmp_path_factory) -> Path:
    """About 4.7 s of real English speech from the embedded Piper voice (22.05 kHz wav), saying REFERENCE_TEXT."""

    def build(folder: Path) -> None:
        from voicehub import AutoModelForTextToSpeech

        folder.mkdir(parents=True, exist_ok=True)
        out = AutoModelForTextToSpeech.from_pretrained("en_US-joe-medium").generate(REFERENCE_TEXT, seed=0)
        assert 4.0 <= out.duration <= 6.0, out.duration
        sf.write(folder / "ref.wav", out.audio, out.sample_rate)

    return _once(tmp_path_factory.getbasetemp(), "gpt-sovits-ref", build) / "ref.wav"


def write_signal(path: Path, seconds: float, sample_rate: int = 24000) -> Path:
    """A deterministic voiced-like signal (harmonics of 140 Hz with a slow envelope) of `seconds`."""
    t = np.arange(int(round(seconds * sample_rate))) / sample_rate
    audio = sum(np.sin(2 * np.pi * 140 * k * t) / k for k in range(1, 6)) * (
        0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)
    )
    sf.write(path, (0.2 * audio).astype(np.float32), sample_rate)
    return path
