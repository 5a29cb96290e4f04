"""Chinese BERT features for the T2S decoder (chinese-roberta-wwm-ext-large), from the user's local folder only.

Upstream (TTS_infer_pack/TextPreprocessor.py `get_bert_feature` / `get_bert_inf`): tokenize the normalised
text, run `AutoModelForMaskedLM` with output_hidden_states, take hidden_states[-3] (the third-from-last
layer), drop [CLS]/[SEP], repeat each character's vector `word2ph[i]` times -> [1024, n_phones]. Segments
whose language is not Chinese (`zh` / `all_zh`) get zeros. We run the encoder (`BertModel`) without the
masked-LM head: hidden states are identical and the 21128-way logits upstream computes are never used.
The encoder is our own module (bert_model.py) on transformers' tensor names, the tokenizer a `tokenizers`
WordPiece pipeline built as transformers' `BertTokenizerFast` builds it (text/bert_tokenizer.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from voicehub.errors import ModelNotFoundError
from voicehub.models.checkpoints import check_state_dict
from voicehub.models.gpt_sovits import bert_model
from voicehub.models.gpt_sovits.sizes import Size, parse_size
from voicehub.models.gpt_sovits.ssl import CONFIG_MODEL, find_weights, load_module, read_config, read_weights
from voicehub.models.gpt_sovits.weights import meta_device
from voicehub.text.bert_tokenizer import BertTokenizer

BERT_FOLDER = "chinese-roberta-wwm-ext-large"  # its name inside upstream's pretrained_models/
BERT_FEATURE_DIM = 1024  # hidden size of chinese-roberta-wwm-ext-large; the T2S bert_proj input
BERT_LAYER = -3  # upstream: hidden_states[-3:-2]
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")
# The published file is a BertForPreTraining/MaskedLM dump: heads and the pooler are not part of the encoder;
# older transformers also saved position_ids / token_type_ids buffers (an arange and zeros: computed here).
IGNORED_PREFIXES = ("cls.", "bert.pooler.", "pooler.")
IGNORED_KEYS = ("embeddings.position_ids", "embeddings.token_type_ids")
# transformers' BertConfig defaults, for keys a config.json leaves out
CONFIG_DEFAULTS = {
    "vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
    "intermediate_size": 3072, "hidden_act": "gelu", "max_position_embeddings": 512, "type_vocab_size": 2,
    "layer_norm_eps": 1e-12, "pad_token_id": 0, "position_embedding_type": "absolute",
}  # fmt: skip


def is_bert_language(language: str) -> bool:
    """Whether upstream computes BERT features for a segment of this language (`zh`, `all_zh`)."""
    return str(language).replace("all_", "") == "zh"


def check_bert_folder(folder: str | Path) -> Path:
    """The folder, after checking it holds config.json, a tokenizer and weights."""
    folder = Path(folder)
    fix = (
        f"put upstream's {BERT_FOLDER} folder (config.json, pytorch_model.bin, tokenizer.json) at "
        f"{str(folder)!r}, e.g. copy GPT_SoVITS/pretrained_models/{BERT_FOLDER} from a GPT-SoVITS install"
    )
    if not folder.is_dir():
        raise ModelNotFoundError(f"BERT folder {str(folder)!r} does not exist: {fix}")
    if not (folder / "config.json").is_file():
        raise ModelNotFoundError(f"BERT folder {str(folder)!r} has no config.json: {fix}")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ModelNotFoundError(f"BERT folder {str(folder)!r} has no tokenizer.json or vocab.txt: {fix}")
    find_weights(folder)
    return folder


def encoder_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The encoder's tensors of a BertForMaskedLM / BertForPreTraining file (`bert.*`) or a bare BertModel
    file (no prefix): heads, pooler and computed buffers dropped, the prefix stripped."""
    out = {}
    for key, value in state.items():
        if key.startswith(IGNORED_PREFIXES):
            continue
        key = key[len("bert.") :] if key.startswith("bert.") else key
        if key not in IGNORED_KEYS:
            out[key] = value
    return out


class BertFeatureExtractor(torch.nn.Module):
    """Character-level BERT features of Chinese text, expanded to phone level with `word2ph`."""

    def __init__(self, model: bert_model.BertModel, tokenizer: BertTokenizer, folder: Path):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.folder = folder

    @classmethod
    def from_folder(
        cls, folder: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
    ) -> BertFeatureExtractor:
        """Load a chinese-roberta-wwm-ext-large folder (architecture from config.json), strictly, in eval mode."""
        return cls.prepare(folder)(torch.device(device), dtype)

    @classmethod
    def prepare(cls, folder: str | Path) -> Callable[[torch.device, torch.dtype], BertFeatureExtractor]:
        """`from_folder` in two steps: the folder read, checked and its model built on the meta device now
        (no device touched), then the returned function's call puts the weights on a device in a dtype."""
        folder = check_bert_folder(folder)
        config = read_config(folder / "config.json", CONFIG_DEFAULTS)
        bert_model.check_config(config, str(folder / "config.json"))
        with meta_device():
            model = bert_model.BertModel(config)
        weights = find_weights(folder)
        state = encoder_state(read_weights(weights))
        # every layer the file holds is checked; those past hidden_states[-3] are not kept (never run)
        expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
        check_state_dict(expected, state, str(weights), model=CONFIG_MODEL)
        model.keep_layers(BERT_LAYER)
        kept = model.state_dict()
        state = {name: tensor for name, tensor in state.items() if name in kept}
        tokenizer = BertTokenizer(folder)

        def finish(device: torch.device, dtype: torch.dtype) -> BertFeatureExtractor:
            return cls(load_module(model, state, weights, device, dtype, (), {}), tokenizer, folder)

        return finish

    @torch.inference_mode()
    def char_features(self, text: str) -> torch.Tensor:
        """[len(text), hidden] features, one per character (hidden_states[-3] without [CLS]/[SEP])."""
        ids = self.tokenizer(text)
        if len(ids) > self.model.max_tokens:
            raise ValueError(
                f"{len(ids)} BERT tokens for a text of {len(text)} characters: at most "
                f"{self.model.max_tokens} fit (split the text into shorter sentences)"
            )
        device = next(self.model.parameters()).device
        hidden = self.model(torch.tensor([ids], device=device), BERT_LAYER)[0, 1:-1]  # [n_tok, H]
        if hidden.shape[0] != len(text):
            raise ValueError(
                f"the BERT tokenizer split {text!r} into {hidden.shape[0]} tokens for {len(text)} characters; "
                "BERT features need one token per character: pass the Chinese frontend's normalised text"
            )
        return hidden

    def forward(self, norm_text: str, word2ph: Sequence[int]) -> torch.Tensor:
        """Phone-level features [hidden, sum(word2ph)]: character i's vector repeated word2ph[i] times."""
        if len(word2ph) != len(norm_text):
            raise ValueError(
                f"word2ph has {len(word2ph)} entries for {len(norm_text)} characters of {norm_text!r}"
            )
        chars = self.char_features(norm_text)  # [n_chars, H]
        repeats = torch.as_tensor(list(word2ph), dtype=torch.long, device=chars.device)
        return torch.repeat_interleave(chars, repeats, dim=0).T  # [H, n_phones]


def phone_bert_features(
    extractor: BertFeatureExtractor | None,
    language: str,
    norm_text: str,
    word2ph: Sequence[int] | None,
    n_phones: int,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """BERT features [1024, n_phones] for one language segment, as upstream's `get_bert_inf`.

    Chinese segments run `extractor` (required then); any other language gets zeros.
    """
    if not is_bert_language(language):
        return torch.zeros(BERT_FEATURE_DIM, n_phones, dtype=dtype, device=device)
    if extractor is None:
        raise ValueError(
            "Chinese text needs BERT features: load a BertFeatureExtractor from pretrained_models"
        )
    if word2ph is None or sum(word2ph) != n_phones:
        raise ValueError(f"word2ph {word2ph} does not add up to the segment's {n_phones} phones")
    return extractor(norm_text, word2ph).to(device=device, dtype=dtype)


# --- random-weight folders for tests and benchmarks -------------------------------------------------
SPECIAL_TOKENS = ["[PAD]"] + [f"[unused{i}]" for i in range(1, 100)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
FULL_VOCAB_SIZE = 21128  # chinese-roberta-wwm-ext-large (the bert-base-chinese vocabulary)
TINY_CJK = 400  # CJK characters in the tiny vocabulary, from U+4E00 on, plus the ones below
TINY_EXTRA_CHARS = "你好世界今天气很我们是中国人的语音合成测试这样吗呢吧啊说话声音"
PUNCTUATION = list("，。！？、；：“”‘’（）《》…—·,.!?;:'\"()-~") + [str(d) for d in range(10)]


def make_vocab(size: str) -> list[str]:
    """A test vocabulary: the real special-token ids ([PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103),
    punctuation, digits, CJK characters, and for `full` filler tokens up to 21128. Not the real vocabulary."""
    is_full = parse_size(size) is Size.FULL
    tokens = SPECIAL_TOKENS + PUNCTUATION
    n_cjk = 0x9FA5 - 0x4E00 + 1 if is_full else TINY_CJK
    cjk = [chr(0x4E00 + i) for i in range(n_cjk)]
    tokens += cjk + [c for c in dict.fromkeys(TINY_EXTRA_CHARS) if c not in set(cjk)]
    if is_full:
        tokens = tokens[:FULL_VOCAB_SIZE]
        tokens += [f"[filler{i}]" for i in range(FULL_VOCAB_SIZE - len(tokens))]
    return tokens


def bert_config(size: str, vocab_size: int) -> dict:
    """config.json values: `full` = chinese-roberta-wwm-ext-large's real values, `tiny` = 3 layers of width 1024."""
    full = {
        "architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": 1024, "num_hidden_layers": 24,
        "num_attention_heads": 16, "intermediate_size": 4096, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512, "type_vocab_size": 2,
        "initializer_range": 0.02, "layer_norm_eps": 1e-12, "vocab_size": FULL_VOCAB_SIZE, "pad_token_id": 0,
        "bos_token_id": 0, "eos_token_id": 2, "directionality": "bidi", "output_past": True,
        "pooler_fc_size": 768, "pooler_num_attention_heads": 12, "pooler_num_fc_layers": 3,
        "pooler_size_per_head": 128, "pooler_type": "first_token_transform",
    }  # fmt: skip
    if parse_size(size) is Size.FULL:
        return full
    # Width stays 1024 (the T2S bert_proj input); 3 layers so hidden_states[-3] is a transformer layer.
    return {**full, "num_hidden_layers": 3, "intermediate_size": 256, "vocab_size": vocab_size}


def make_bert_folder(path: str | Path, size: str = "tiny", seed: int = 0) -> Path:
    """Write a random-weight chinese-roberta-wwm-ext-large folder in the official layout (a test artefact).

    Files: config.json, pytorch_model.bin (BertForMaskedLM names: `bert.*`, `cls.*`), tokenizer.json and
    vocab.txt built from `make_vocab(size)`. Returns the folder.
    """
    from tokenizers import BertWordPieceTokenizer

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = make_vocab(size)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = BertWordPieceTokenizer(str(folder / "vocab.txt"), lowercase=True, handle_chinese_chars=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    values = bert_config(size, len(vocab))
    torch.manual_seed(seed)
    model = bert_model.BertModel(values)
    bert_model.init_random(model, values["initializer_range"])
    state = {f"bert.{k}": v.contiguous() for k, v in model.state_dict().items()}
    torch.save({**state, **masked_lm_head(values)}, folder / "pytorch_model.bin")
    (folder / "config.json").write_text(json.dumps(values, indent=2))
    return folder


def masked_lm_head(values: dict) -> dict[str, torch.Tensor]:
    """BertForMaskedLM's `cls.predictions.*` tensors (random; the file carries them, the runtime ignores them)."""
    width, vocab = values["hidden_size"], values["vocab_size"]
    std = values["initializer_range"]
    return {
        "cls.predictions.bias": torch.zeros(vocab),
        "cls.predictions.transform.dense.weight": torch.randn(width, width) * std,
        "cls.predictions.transform.dense.bias": torch.zeros(width),
        "cls.predictions.transform.LayerNorm.weight": torch.ones(width),
        "cls.predictions.transform.LayerNorm.bias": torch.zeros(width),
        "cls.predictions.decoder.weight": torch.randn(vocab, width) * std,
    }
