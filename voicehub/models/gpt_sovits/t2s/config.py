"""Architecture of the text-to-semantic (T2S) decoder, read from a GPT checkpoint's own `config`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from voicehub.errors import CheckpointError

BERT_DIM = 1024  # upstream hard-codes the BERT projection input (chinese-roberta-wwm-ext-large width)
SEMANTIC_HZ = 50  # upstream's `hz`: early_stop_num = hz * data.max_sec
DEFAULT_MAX_SEC = 54  # data.max_sec of configs/s1longer-v2.yaml, used when a checkpoint omits it
MAX_DECODE_STEPS = 1500  # upstream's decode loop bound (`for idx in range(1500)`)
EOS_BLOCKED_STEPS = 11  # upstream drops the EOS logit while `idx < 11` ("at least 10 tokens, 0.4 s")
MAX_POSITIONS = 4000  # length of upstream's precomputed sinusoid table (grown on demand for prompts)
V2_PHONEME_VOCAB = 732  # the v2/v3 symbol table; v1 GPT files have 512


@dataclass(frozen=True)
class T2SConfig:
    """Sizes of one T2S decoder; `from_checkpoint_config` is the only way a file sets them.

    ffn_dim is 4 * hidden_dim because upstream builds the FFN that way and ignores `linear_units`
    (kept here only to report it); the strict loader checks the tensors agree.
    """

    embedding_dim: int
    hidden_dim: int
    n_head: int
    n_layer: int
    vocab_size: int
    phoneme_vocab_size: int
    eos: int
    linear_units: int
    max_sec: int = DEFAULT_MAX_SEC

    def __post_init__(self) -> None:
        for name in ("embedding_dim", "hidden_dim", "n_head", "n_layer", "vocab_size", "phoneme_vocab_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"T2S config: {name} must be positive, got {getattr(self, name)}")
        if self.eos != self.vocab_size - 1:
            raise ValueError(
                f"T2S config: EOS must be vocab_size - 1 = {self.vocab_size - 1}, got {self.eos}"
            )
        if self.embedding_dim != self.hidden_dim:
            raise ValueError(
                f"T2S config: embedding_dim {self.embedding_dim} != hidden_dim {self.hidden_dim}; "
                "upstream feeds the embeddings straight into the transformer, so they must match"
            )
        if self.hidden_dim % self.n_head:
            raise ValueError(
                f"T2S config: hidden_dim {self.hidden_dim} is not divisible by head {self.n_head}"
            )

    @property
    def ffn_dim(self) -> int:
        return 4 * self.hidden_dim

    @property
    def head_dim(self) -> int:
        return self.hidden_dim // self.n_head

    @property
    def early_stop_num(self) -> int:
        """Upstream's default token cap for one request: hz * max_sec."""
        return SEMANTIC_HZ * self.max_sec

    @classmethod
    def from_checkpoint_config(cls, config: Any, source: str = "<config>") -> T2SConfig:
        """Read the `config` dict a GPT-SoVITS GPT checkpoint carries (s1longer-v2.yaml layout)."""
        if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
            raise CheckpointError(
                f"{source}: the checkpoint's `config` has no `model` section; not a GPT checkpoint"
            )
        model = config["model"]
        need = ("embedding_dim", "hidden_dim", "head", "n_layer", "vocab_size", "phoneme_vocab_size", "EOS")
        missing = [k for k in need if k not in model]
        if missing:
            raise CheckpointError(f"{source}: config['model'] lacks {', '.join(missing)}")
        data = config.get("data") if isinstance(config.get("data"), dict) else {}
        try:
            return cls(
                embedding_dim=int(model["embedding_dim"]),
                hidden_dim=int(model["hidden_dim"]),
                n_head=int(model["head"]),
                n_layer=int(model["n_layer"]),
                vocab_size=int(model["vocab_size"]),
                phoneme_vocab_size=int(model["phoneme_vocab_size"]),
                eos=int(model["EOS"]),
                linear_units=int(model.get("linear_units", 4 * int(model["hidden_dim"]))),
                max_sec=int(data.get("max_sec", DEFAULT_MAX_SEC)),
            )
        except (TypeError, ValueError) as exc:
            raise CheckpointError(
                f"{source}: config['model'] is not a valid T2S architecture: {exc}"
            ) from exc

    def to_checkpoint_config(self) -> dict[str, Any]:
        """The `config` dict upstream writes (s1longer-v2.yaml as loaded by s1_train.py)."""
        return {
            "train": {
                "seed": 1234,
                "epochs": 20,
                "batch_size": 8,
                "save_every_n_epoch": 1,
                "precision": "16-mixed",
                "gradient_clip": 1.0,
            },
            "optimizer": {
                "lr": 0.01,
                "lr_init": 1e-05,
                "lr_end": 0.0001,
                "warmup_steps": 2000,
                "decay_steps": 40000,
            },
            "data": {"max_eval_sample": 8, "max_sec": self.max_sec, "num_workers": 4, "pad_val": self.eos},
            "model": {
                "vocab_size": self.vocab_size,
                "phoneme_vocab_size": self.phoneme_vocab_size,
                "embedding_dim": self.embedding_dim,
                "hidden_dim": self.hidden_dim,
                "head": self.n_head,
                "linear_units": self.linear_units,
                "n_layer": self.n_layer,
                "dropout": 0,
                "EOS": self.eos,
                "random_bert": 0,
            },
            "inference": {"top_k": 15},
        }


FULL_V3 = T2SConfig(
    embedding_dim=512,
    hidden_dim=512,
    n_head=16,
    n_layer=24,
    vocab_size=1025,
    phoneme_vocab_size=V2_PHONEME_VOCAB,
    eos=1024,
    linear_units=2048,
)
TINY = T2SConfig(
    embedding_dim=64,
    hidden_dim=64,
    n_head=4,
    n_layer=2,
    vocab_size=1025,
    phoneme_vocab_size=V2_PHONEME_VOCAB,
    eos=1024,
    linear_units=256,
)
