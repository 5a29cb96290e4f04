"""Chinese frontend: normalisation, tone sandhi and pinyin -> v2 symbols (needs the `zh` extra)."""
