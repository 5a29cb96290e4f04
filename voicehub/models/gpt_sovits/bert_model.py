"""chinese-roberta-wwm-ext-large's encoder as a plain torch module, on the tensor names of transformers'
`BertModel` (the published file prefixes them `bert.`; its masked-LM head and pooler are not used).

Why not transformers' class: see hubert_model.py (importing transformers' model modules is most of the
process start). `tests/test_bert.py` checks this module against transformers' `AutoModelForMaskedLM` on
the same folder. Inference only: absolute positions, one unpadded sequence (no attention mask), segment
0, no dropout. Only the layers up to the hidden state asked for run (upstream reads hidden_states[-3]):
the feature extractor checks the file's last two layers of 24 strictly but does not keep them
(`keep_layers`: ~50 MB of fp16 weights that would never run).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from voicehub.models.gpt_sovits import encoder_parts

SUPPORTED: dict[str, tuple[Any, ...]] = {
    "hidden_act": ("gelu",),
    "position_embedding_type": ("absolute",),
    "is_decoder": (False,),
    "add_cross_attention": (False,),
}


def check_config(config: Mapping[str, Any], source: str) -> None:
    """Raise CheckpointError naming each config.json value this module does not implement."""
    encoder_parts.check_config(config, SUPPORTED, source, "BERT")


class Embeddings(nn.Module):
    def __init__(self, config: Mapping[str, Any]):
        super().__init__()
        width = config["hidden_size"]
        self.word_embeddings = nn.Embedding(
            config["vocab_size"], width, padding_idx=config.get("pad_token_id")
        )
        self.position_embeddings = nn.Embedding(config["max_position_embeddings"], width)
        self.token_type_embeddings = nn.Embedding(config["type_vocab_size"], width)
        self.LayerNorm = nn.LayerNorm(width, eps=config["layer_norm_eps"])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # [B, n] -> [B, n, H]
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = (
            self.word_embeddings(ids)
            + self.position_embeddings(positions)
            + self.token_type_embeddings.weight[0]
        )
        return self.LayerNorm(x)


class SelfAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(width, width)
        self.key = nn.Linear(width, width)
        self.value = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return encoder_parts.attend(x, self.query, self.key, self.value, self.heads)


class DenseNorm(nn.Module):
    """dense, then LayerNorm of (result + residual): BERT's `attention.output` and `output`."""

    def __init__(self, c_in: int, width: int, eps: float):
        super().__init__()
        self.dense = nn.Linear(c_in, width)
        self.LayerNorm = nn.LayerNorm(width, eps=eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class Attention(nn.Module):
    def __init__(self, config: Mapping[str, Any]):
        super().__init__()
        width = config["hidden_size"]
        self.self = SelfAttention(width, config["num_attention_heads"])
        self.output = DenseNorm(width, width, config["layer_norm_eps"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(x), x)


class Intermediate(nn.Module):
    def __init__(self, width: int, inner: int):
        super().__init__()
        self.dense = nn.Linear(width, inner)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(x))


class Layer(nn.Module):
    def __init__(self, config: Mapping[str, Any]):
        super().__init__()
        width, inner = config["hidden_size"], config["intermediate_size"]
        self.attention = Attention(config)
        self.intermediate = Intermediate(width, inner)
        self.output = DenseNorm(inner, width, config["layer_norm_eps"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attention(x)
        return self.output(self.intermediate(x), x)


class Encoder(nn.Module):
    def __init__(self, config: Mapping[str, Any]):
        super().__init__()
        self.layer = nn.ModuleList(Layer(config) for _ in range(config["num_hidden_layers"]))


class BertModel(nn.Module):
    """Token ids [B, n] -> one of transformers' `hidden_states` ([0] the embeddings, [i] after layer i)."""

    def __init__(self, config: Mapping[str, Any]):
        super().__init__()
        self.config = dict(config)
        self.n_layers = int(config["num_hidden_layers"])  # the checkpoint's; `keep_layers` may hold fewer
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config)

    @property
    def max_tokens(self) -> int:
        return int(self.config["max_position_embeddings"])

    def keep_layers(self, hidden_state: int) -> None:
        """Drop the layers past `hidden_state` (an index as `forward` takes): they would never run."""
        layers = self._layers_for(hidden_state)
        self.encoder.layer = nn.ModuleList(list(self.encoder.layer)[:layers])

    def _layers_for(self, hidden_state: int) -> int:
        if not -(self.n_layers + 1) <= hidden_state <= self.n_layers:
            raise IndexError(f"hidden state {hidden_state} of a BERT with {self.n_layers} layers")
        return hidden_state % (self.n_layers + 1)  # how many layers run

    def forward(self, ids: torch.Tensor, hidden_state: int = -1) -> torch.Tensor:
        """hidden_state: an index into the L + 1 hidden states, negative from the end as a list's."""
        layers = self._layers_for(hidden_state)
        if layers > len(self.encoder.layer):
            raise ValueError(
                f"hidden state {hidden_state} needs {layers} layers; this model kept {len(self.encoder.layer)}"
            )
        x = self.embeddings(ids)
        for layer in self.encoder.layer[:layers]:
            x = layer(x)
        return x


@torch.no_grad()
def init_random(model: BertModel, std: float) -> None:
    """Random test weights as transformers initialises BERT: normal(0, std) linears and embeddings (the
    padding row zero), unit LayerNorms."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.normal_(0.0, std)
        if isinstance(module, nn.Linear):
            module.bias.zero_()
        elif isinstance(module, nn.Embedding) and module.padding_idx is not None:
            module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            module.weight.fill_(1.0)
            module.bias.zero_()
