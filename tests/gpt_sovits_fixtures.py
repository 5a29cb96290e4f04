"""Shared GPT-SoVITS v3 test inputs: one tiny `make-checkpoint` set and one reference wav per session.

Both are written under pytest's session base folder and reused when present, so every test module
that imports these fixtures gets the same files, built once. The reference is real speech where
an espeak-ng phonemizer exists for the Piper voice, else a synthetic voiced signal (see
`reference_wav`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

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
    """The reference clip for REFERENCE_TEXT: about 4.7 s of real English speech from the embedded
    Piper voice (22.05 kHz wav) where an espeak-ng phonemizer is available (piper-tts or the
    `espeak-ng` program); without one (the GPU machine has neither) a synthetic voiced signal
    (`write_synthetic_voice`: 5 s at 24 kHz, gliding pitch, syllable-like envelope) stands in, so
    tests that only need a well-formed reference still run. The transcript then does not match
    the audio, which tiny random-weight models cannot tell."""

    def build(folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        if not has_phonemizer():
            write_synthetic_voice(folder / "ref.wav")
            return
        from voicehub import AutoModelForTextToSpeech

        out = AutoModelForTextToSpeech.from_pretrained("en_US-joe-medium").generate(REFERENCE_TEXT, seed=0)
        assert 4.0 <= out.duration <= 6.0, out.duration
        sf.write(folder / "ref.wav", out.audio, out.sample_rate)

    return _once(tmp_path_factory.getbasetemp(), "gpt-sovits-ref", build) / "ref.wav"


def has_phonemizer() -> bool:
    """Whether the Piper voice can phonemize English here (piper-tts's espeak-ng or the program)."""
    from voicehub.errors import MissingDependencyError
    from voicehub.models.vits.phonemes import make_phonemizer

    try:
        make_phonemizer("en-us")
    except MissingDependencyError:
        return False
    return True


def write_synthetic_voice(path: Path, seconds: float = 5.0, sample_rate: int = 24000) -> Path:
    """A deterministic speech-like signal: harmonics (1/k, 8 of them) of a pitch gliding between
    about 95 and 175 Hz, gated into ~4 syllables per second with two short pauses; peak 0.5."""
    t = np.arange(int(round(seconds * sample_rate))) / sample_rate
    f0 = 130 + 30 * np.sin(2 * np.pi * 0.35 * t) + 15 * np.sin(2 * np.pi * 1.7 * t + 1.0)  # Hz
    phase = 2 * np.pi * np.cumsum(f0) / sample_rate  # integrate the pitch: no phase jumps
    voiced = sum(np.sin(k * phase) / k for k in range(1, 9))
    syllables = np.clip(np.sin(2 * np.pi * 4.1 * t) + 0.3, 0.0, None) ** 0.7
    pauses = (np.abs(t - 1.6) > 0.15) & (np.abs(t - 3.4) > 0.2)  # gaps between "phrases"
    envelope = syllables * pauses * np.minimum(1.0, np.minimum(t, seconds - t) / 0.05)
    audio = voiced * envelope
    sf.write(path, (0.5 * audio / np.abs(audio).max()).astype(np.float32), sample_rate)
    return path


def write_signal(path: Path, seconds: float, sample_rate: int = 24000) -> Path:
    """A deterministic voiced-like signal (harmonics of 140 Hz with a slow envelope) of `seconds`."""
    t = np.arange(int(round(seconds * sample_rate))) / sample_rate
    audio = sum(np.sin(2 * np.pi * 140 * k * t) / k for k in range(1, 6)) * (
        0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)
    )
    sf.write(path, (0.2 * audio).astype(np.float32), sample_rate)
    return path


def random_reference(model, n_tokens: int = 40):
    """`encode_reference` of random inputs for a SoVITS v3 `model` (seeded): n_tokens prompt tokens,
    18 phonemes, a 60-frame spectrogram, floor(3.75 * n_tokens) + 3 mel frames."""
    from voicehub.models.gpt_sovits.sovits import encode_reference

    g = torch.Generator().manual_seed(7)
    codes = torch.randint(0, model.arch.n_bins, (1, 1, n_tokens), generator=g)
    phones = torch.randint(1, model.arch.n_symbols, (1, 18), generator=g)
    spec = torch.rand(1, 1025, 60, generator=g)
    mel = torch.randn(1, 100, int(n_tokens * 3.75) + 3, generator=g) - 6
    return encode_reference(model, codes, phones, spec, mel)


def random_target(model, n_tokens: int, seed: int = 11) -> tuple[torch.Tensor, torch.Tensor]:
    """Random semantic tokens [1, 1, n_tokens] and 25 phoneme ids [1, 25] for `model` (seeded)."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, model.arch.n_bins, (1, 1, n_tokens), generator=g)
    phones = torch.randint(1, model.arch.n_symbols, (1, 25), generator=g)
    return codes, phones
