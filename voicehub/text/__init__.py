"""Text frontends: sentence cutting, language spans, g2p into the GPT-SoVITS v2 symbol table.

Importing this package loads no language package; each language's g2p is imported on first use.
"""

from voicehub.text.frontend import TextFrontend, TextSegment
from voicehub.text.options import CutMethod, Language, parse_cut_method, parse_language
from voicehub.text.symbols import load_symbols, phones_to_ids

__all__ = [
    "CutMethod",
    "Language",
    "TextFrontend",
    "TextSegment",
    "load_symbols",
    "parse_cut_method",
    "parse_language",
    "phones_to_ids",
]
