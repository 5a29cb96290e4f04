"""G2PW model inputs: BERT tokens for a sentence and, per polyphonic character, its query tensors.

Follows upstream GPT-SoVITS text/g2pw/dataset.py and utils.py (from g2pW by GitYCC, via PaddleSpeech):
Latin/digit runs are one word, every other character its own word; each word is tokenised alone so a
character maps to exactly the token that holds it; texts over 510 tokens are cut around the query.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

MAX_TOKENS = 512  # BERT positions, [CLS] and [SEP] included
_SPACES = re.compile(r"^ +")
_LATIN_WORD = re.compile(r"^[a-zA-Z0-9]+")


@dataclass
class TokenMap:
    """Tokens of a text, token index per text position, (start, end) text span per token."""

    tokens: list[str]
    text_to_token: list[int | None]
    token_to_text: list[tuple[int, int]]


def split_words(text: str) -> tuple[list[str], list[int | None], list[tuple[int, int]]]:
    """Words, word index per character (None for spaces), (start, end) per word (upstream wordize_and_map)."""
    words: list[str] = []
    text_to_word: list[int | None] = []
    word_to_text: list[tuple[int, int]] = []
    position = 0
    while position < len(text):
        rest = text[position:]
        if match := _SPACES.match(rest):
            text_to_word += [None] * len(match.group(0))
            position += len(match.group(0))
            continue
        word = match.group(0) if (match := _LATIN_WORD.match(rest)) else rest[0]
        word_to_text.append((position, position + len(word)))
        text_to_word += [len(words)] * len(word)
        words.append(word)
        position += len(word)
    return words, text_to_word, word_to_text


def tokenize_and_map(tokenizer, text: str) -> TokenMap:
    """Tokenise word by word and map text positions to tokens (upstream tokenize_and_map)."""
    words, text_to_token, word_to_text = split_words(text)
    tokens: list[str] = []
    token_to_text: list[tuple[int, int]] = []
    for word, (start, end) in zip(words, word_to_text):
        word_tokens = tokenizer.tokenize(word)
        if not word_tokens or word_tokens == ["[UNK]"]:
            token_to_text.append((start, end))
            tokens.append("[UNK]")
            continue
        for token in word_tokens:
            length = len(token[2:] if token.startswith("##") else token)
            token_to_text.append((start, start + length))
            start += length
            tokens.append(token)
    # Positions a token covers point at it; any others keep their word index, as upstream leaves them.
    for index, (start, end) in enumerate(token_to_text):
        for position in range(start, end):
            text_to_token[position] = index
    return TokenMap(tokens, text_to_token, token_to_text)


def _window(mapped: TokenMap, text: str, query: int) -> tuple[str, int, TokenMap]:
    """Cut a text of over 510 tokens to 510 tokens centred on the query (upstream _truncate)."""
    limit = MAX_TOKENS - 2
    centre = mapped.text_to_token[query]
    token_start = centre - limit // 2
    token_end = token_start + limit
    if token_start < 0:
        token_start, token_end = 0, limit
    elif token_end > len(mapped.tokens):
        token_start, token_end = len(mapped.tokens) - limit, len(mapped.tokens)
    start = mapped.token_to_text[token_start][0]
    end = mapped.token_to_text[token_end - 1][1]
    window = TokenMap(
        mapped.tokens[token_start:token_end],
        [i - token_start if i is not None else None for i in mapped.text_to_token[start:end]],
        [(s - start, e - start) for s, e in mapped.token_to_text[token_start:token_end]],
    )
    return text[start:end], query - start, window


def encode_queries(
    tokenizer,
    texts: list[str],
    query_ids: list[int],
    char_ids: dict[str, int],
    phoneme_masks: dict[str, np.ndarray],
) -> dict[str, np.ndarray]:
    """The six g2pW.onnx inputs for one query per text (upstream prepare_onnx_input, no window).

    Returns input_ids, token_type_ids, attention_mask: [N, T] int64 (zero-padded to the longest);
    phoneme_mask: [N, n_labels] float32; char_ids, position_ids: [N] int64.
    """
    rows: dict[str, list] = {name: [] for name in ("input_ids", "phoneme_mask", "char_ids", "position_ids")}
    cache: dict[str, TokenMap] = {}
    for raw_text, query in zip(texts, query_ids):
        text = raw_text.lower()
        if text not in cache:
            cache[text] = tokenize_and_map(tokenizer, text)
        mapped = cache[text]
        if len(mapped.tokens) > MAX_TOKENS - 2:
            text, query, mapped = _window(mapped, text, query)
        char = text[query]
        rows["input_ids"].append(tokenizer.convert_tokens_to_ids(["[CLS]", *mapped.tokens, "[SEP]"]))
        rows["phoneme_mask"].append(phoneme_masks[char])
        rows["char_ids"].append(char_ids[char])
        rows["position_ids"].append(mapped.text_to_token[query] + 1)  # +1: [CLS] comes first
    width = max(len(ids) for ids in rows["input_ids"])
    input_ids = np.zeros((len(texts), width), dtype=np.int64)
    attention_mask = np.zeros((len(texts), width), dtype=np.int64)
    for row, ids in enumerate(rows["input_ids"]):
        input_ids[row, : len(ids)] = ids
        attention_mask[row, : len(ids)] = 1
    return {
        "input_ids": input_ids,
        "token_type_ids": np.zeros_like(input_ids),
        "attention_mask": attention_mask,
        "phoneme_mask": np.asarray(rows["phoneme_mask"], dtype=np.float32),
        "char_ids": np.asarray(rows["char_ids"], dtype=np.int64),
        "position_ids": np.asarray(rows["position_ids"], dtype=np.int64),
    }
