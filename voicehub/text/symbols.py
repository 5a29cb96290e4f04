"""The GPT-SoVITS v2 phoneme table (732 symbols, also used by v3) and phoneme -> id lookup."""

from __future__ import annotations

import functools
import json
from importlib import resources

# Punctuation kept as phonemes by every language frontend (upstream `symbols2.punctuation`).
PUNCTUATION: tuple[str, ...] = ("!", "?", "…", ",", ".", "-")
N_SYMBOLS_V2 = 732  # the T2S phoneme embedding has this many rows
UNKNOWN_SYMBOL = "UNK"


@functools.cache
def load_symbols() -> tuple[str, ...]:
    """The ordered v2 symbol table; a symbol's index is its embedding row in the T2S model."""
    raw = resources.files("voicehub.text").joinpath("data/symbols_v2.json").read_text("utf-8")
    symbols = tuple(json.loads(raw)["symbols"])
    # The embedding rows depend on this order; a damaged data file must not load quietly.
    assert len(symbols) == N_SYMBOLS_V2 and len(set(symbols)) == N_SYMBOLS_V2, "symbols_v2.json is damaged"
    return symbols


@functools.cache
def symbol_to_id() -> dict[str, int]:
    """Symbol -> embedding row. Callers must not mutate the returned dict."""
    return {symbol: index for index, symbol in enumerate(load_symbols())}


def is_symbol(phone: str) -> bool:
    """Whether `phone` is in the v2 table."""
    return phone in symbol_to_id()


def phones_to_ids(phones: list[str]) -> list[int]:
    """Phoneme ids for the T2S embedding; raises ValueError naming any phoneme outside the table."""
    table = symbol_to_id()
    unknown = sorted({p for p in phones if p not in table})
    if unknown:
        raise ValueError(
            f"phonemes not in the GPT-SoVITS v2 symbol table: {unknown}; "
            f"map them to {UNKNOWN_SYMBOL!r} first (the frontends do this)"
        )
    return [table[p] for p in phones]
