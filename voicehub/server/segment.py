"""Cutting text that arrives in pieces (an LLM writing) into speakable sentences as soon as each ends.

A Latin sentence ends at . ! ? ; or … followed by whitespace (the whitespace proves the next piece
is not '5' after '3.'); a CJK sentence ends right after 。！？；. A run longer than `max_chars`
without an end is cut at its last comma or space, so a client that never punctuates still hears
audio while it writes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_END_RE = re.compile(r"[.!?;…]+[\"')\]”’]*\s+|[。！？；]+[」』”’）]*")
_SOFT_CUT_RE = re.compile(r"[,，、:：]\s*|\s+")
MAX_PIECE_CHARS = 250  # a sentence longer than this is cut early at a comma or space


@dataclass(frozen=True)
class Piece:
    """A speakable span: its text and where it lies in the session's whole input, in characters."""

    text: str
    start: int
    end: int


class Segmenter:
    """Holds the unspoken tail of the input; `feed` and `flush` return the pieces ready to speak."""

    def __init__(self, max_chars: int = MAX_PIECE_CHARS):
        self.max_chars = max_chars
        self.buffer = ""
        self.offset = 0  # characters of input before the buffer

    def feed(self, text: str) -> list[Piece]:
        self.buffer += text
        pieces = []
        while True:
            match = _END_RE.search(self.buffer)
            if match is not None and match.end() <= self.max_chars:
                pieces.append(self._take(match.end()))
            elif len(self.buffer) > self.max_chars:
                pieces.append(self._take(self._soft_cut()))
            else:
                return [p for p in pieces if p.text]

    def flush(self) -> list[Piece]:
        """Everything buffered, as one piece (none when only whitespace is left)."""
        piece = self._take(len(self.buffer))
        return [piece] if piece.text else []

    def clear(self) -> None:
        self.offset += len(self.buffer)
        self.buffer = ""

    def _soft_cut(self) -> int:
        cut = 0
        for m in _SOFT_CUT_RE.finditer(self.buffer, 0, self.max_chars):
            cut = m.end()
        return cut or self.max_chars  # no comma or space at all: cut hard at the limit

    def _take(self, n: int) -> Piece:
        raw, self.buffer = self.buffer[:n], self.buffer[n:]
        lead = len(raw) - len(raw.lstrip())
        text = raw.strip()
        piece = Piece(text, self.offset + lead, self.offset + lead + len(text))
        self.offset += n
        return piece
