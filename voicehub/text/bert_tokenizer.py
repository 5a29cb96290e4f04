"""The BERT WordPiece tokenizer of a chinese-roberta-wwm-ext-large folder, as transformers reads it.

GPT-SoVITS's BERT features (models/gpt_sovits/bert.py) and G2PW (text/zh/g2pw.py) both tokenise with the
folder's tokenizer through `AutoTokenizer` upstream; this builds the same pipeline from the `tokenizers`
library without importing transformers. `tests/test_bert.py` checks the ids against transformers'.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from voicehub.errors import CheckpointError

# tokenizer_config.json keys transformers' BertTokenizerFast reads, with its defaults
TOKENIZER_DEFAULTS = {
    "do_lower_case": True, "tokenize_chinese_chars": True, "strip_accents": None,
    "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "mask_token": "[MASK]",
}  # fmt: skip
SPECIAL_KEYS = ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file holding an object; an unreadable or other file raises CheckpointError naming it."""
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read {str(path)!r}: {exc}") from exc
    if not isinstance(values, dict):
        raise CheckpointError(f"{str(path)!r} holds a {type(values).__name__}, not a JSON object")
    return values


def _token_setting(config: dict, key: str) -> str | bool | None:
    value = config.get(key, TOKENIZER_DEFAULTS[key])
    # special tokens may be saved as AddedToken dicts ({"content": "[CLS]", ...})
    return value.get("content") if isinstance(value, dict) else value


class BertTokenizer:
    """Text -> token ids [CLS] ... [SEP], as transformers' BertTokenizerFast: the folder's vocabulary
    (tokenizer.json's WordPiece vocab, else vocab.txt), BERT's normaliser with the folder's
    tokenizer_config.json settings (transformers' defaults: lower case, Chinese characters split, accents
    as lower case says), BERT's pre-tokeniser, WordPiece with `##` continuations, the special tokens
    ([UNK], [SEP], [PAD], [CLS], [MASK]) kept whole where the text writes them. No truncation."""

    def __init__(self, folder: Path):
        from tokenizers import Tokenizer, normalizers, pre_tokenizers
        from tokenizers.models import WordPiece

        settings = {}
        if (folder / "tokenizer_config.json").is_file():
            settings = read_json_object(folder / "tokenizer_config.json")
        unk = _token_setting(settings, "unk_token")
        vocab = self._read_vocab(folder)
        self._tokenizer = Tokenizer(WordPiece(vocab, unk_token=unk, continuing_subword_prefix="##"))
        self._tokenizer.normalizer = normalizers.BertNormalizer(
            clean_text=True,
            handle_chinese_chars=_token_setting(settings, "tokenize_chinese_chars"),
            strip_accents=_token_setting(settings, "strip_accents"),
            lowercase=_token_setting(settings, "do_lower_case"),
        )
        self._tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        # as transformers registers them: a special token written in the text is that token, not its letters
        named = [_token_setting(settings, key) for key in SPECIAL_KEYS]
        self._tokenizer.add_special_tokens([token for token in named if token in vocab])
        special = [_token_setting(settings, key) for key in ("cls_token", "sep_token", "unk_token")]
        missing = [token for token in special if token not in vocab]
        if missing:
            raise CheckpointError(f"the BERT vocabulary in {str(folder)!r} lacks {missing}")
        self.cls_id, self.sep_id, self.unk_id = (vocab[token] for token in special)
        self._vocab = vocab

    def __len__(self) -> int:
        return len(self._vocab)

    @staticmethod
    def _read_vocab(folder: Path) -> dict[str, int]:
        if (folder / "tokenizer.json").is_file():
            model = read_json_object(folder / "tokenizer.json").get("model", {})
            if model.get("type") != "WordPiece" or not isinstance(model.get("vocab"), dict):
                raise CheckpointError(f"{str(folder / 'tokenizer.json')!r} holds no WordPiece vocabulary")
            return model["vocab"]
        try:
            lines = (folder / "vocab.txt").read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"cannot read {str(folder / 'vocab.txt')!r}: {exc}") from exc
        return {token: i for i, token in enumerate(lines)}  # one token a line; its line number is its id

    def __call__(self, text: str) -> list[int]:
        """Token ids of `text` between [CLS] and [SEP]."""
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        return [self.cls_id, *ids, self.sep_id]

    def tokenize(self, text: str) -> list[str]:
        """The WordPiece tokens of `text`, without [CLS]/[SEP] (transformers' `tokenize`)."""
        return self._tokenizer.encode(text, add_special_tokens=False).tokens

    def convert_tokens_to_ids(self, tokens: list[str]) -> list[int]:
        """Vocabulary ids; a token not in it gets [UNK]'s."""
        return [self._vocab.get(token, self.unk_id) for token in tokens]
