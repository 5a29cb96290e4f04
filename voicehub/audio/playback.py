"""Play audio on the default output device as chunks arrive (optional `playback` extra)."""

from __future__ import annotations

import numpy as np

from voicehub.errors import MissingDependencyError


class Player:
    """`with Player(sample_rate) as p: p.play(chunk)`: blocking writes to the default output device."""

    def __init__(self, sample_rate: int):
        try:
            import sounddevice
        except (ImportError, OSError) as exc:  # OSError: PortAudio library missing
            raise MissingDependencyError(
                f'--play needs sounddevice and PortAudio ({exc}); run pip install "voicehub[playback]" '
                "(and apt-get install libportaudio2 on Debian/Ubuntu)"
            ) from exc
        self._stream = sounddevice.OutputStream(samplerate=sample_rate, channels=1, dtype="float32")

    def __enter__(self) -> Player:
        self._stream.start()
        return self

    def play(self, audio: np.ndarray) -> None:
        self._stream.write(np.ascontiguousarray(audio, dtype=np.float32).reshape(-1, 1))

    def __exit__(self, *exc: object) -> None:
        self._stream.stop()
        self._stream.close()
