"""Where VoiceHub keeps files it writes for itself (assembled weights, corpora other packages read)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "VOICEHUB_CACHE"


def cache_dir() -> Path:
    """VoiceHub's cache folder: $VOICEHUB_CACHE, else ~/.cache/voicehub. Not created here."""
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "voicehub"))
