"""Checks every input text passes before a model sees it."""

from __future__ import annotations

import unicodedata

from voicehub.errors import InvalidTextError

MAX_TEXT_CHARS = 50_000  # ~1 hour of speech; longer texts should be split by the caller


def check_text(text: str, max_chars: int = MAX_TEXT_CHARS) -> str:
    """The text, stripped; raises InvalidTextError if it is empty, has nothing to speak, or is too long."""
    if not isinstance(text, str):
        raise InvalidTextError(f"text must be a str, got {type(text).__name__}")
    stripped = text.strip()
    if not stripped:
        raise InvalidTextError("text is empty; give at least one word to speak")
    if len(stripped) > max_chars:
        raise InvalidTextError(
            f"text has {len(stripped):,} characters, over the limit of {max_chars:,}; "
            "split it into parts, or raise the limit with max_text_chars="
        )
    if not any(unicodedata.category(ch)[0] in "LN" for ch in stripped):
        raise InvalidTextError(
            "text has no letters or digits (only punctuation or symbols); nothing to speak"
        )
    return stripped
