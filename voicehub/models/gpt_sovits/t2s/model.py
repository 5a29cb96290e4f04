"""The GPT-SoVITS text-to-semantic decoder: a post-norm transformer over [phonemes | semantic tokens].

Parameter names and shapes equal upstream's `Text2SemanticDecoder` (the checkpoint stores them under
`model.`), so a user's `s1v3.ckpt` loads strictly. The module only provides the pieces (embeddings,
one layer's projections, the head); the eager reference decode (`decode.py`) and the static-KV step
(`static.py`) are drivers over the same pieces.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from voicehub.models.gpt_sovits.t2s.config import BERT_DIM, MAX_POSITIONS, T2SConfig
from voicehub.models.gpt_sovits.weights import computed_buffer


def sinusoid_table(n_positions: int, dim: int) -> torch.Tensor:
    """Sine/cosine table [n_positions, dim], float32, computed with upstream's exact float ops."""
    position = torch.arange(0, n_positions, dtype=torch.float32).unsqueeze(1)
    inv_freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * -(math.log(10000.0) / dim))
    table = torch.zeros(n_positions, dim)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq)
    return table


class TokenEmbedding(nn.Module):
    """Named like upstream's TokenEmbedding so the table sits at `<name>.word_embeddings.weight`."""

    def __init__(self, dim: int, vocab_size: int):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.word_embeddings(ids)


class SinePosition(nn.Module):
    """x + alpha * sinusoid(position), alpha learned; upstream uses x_scale 1 and no dropout at inference."""

    def __init__(self, dim: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1))
        # Not in the state dict (upstream keeps it as a plain attribute); moves with .to(dtype) like upstream's.
        table = computed_buffer((MAX_POSITIONS, dim), lambda: sinusoid_table(MAX_POSITIONS, dim))
        self.register_buffer("pe", table, persistent=False)

    def reset_table(self, device: torch.device, dtype: torch.dtype) -> None:
        """Recompute the table (after building on the meta device): float32 math, then cast, as upstream."""
        self.pe = sinusoid_table(self.pe.shape[0], self.pe.shape[1]).to(device=device, dtype=dtype)

    def table(self, n_positions: int) -> torch.Tensor:
        # pe: [P, D]; grows for prompts longer than the table, as upstream's extend_pe does
        if n_positions > self.pe.shape[0]:
            self.pe = sinusoid_table(n_positions, self.pe.shape[1]).to(self.pe)
        return self.pe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, T, D], positions 0..T-1
        return x + self.alpha * self.table(x.shape[1])[: x.shape[1]]

    def at(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # x: [B, 1, D]; positions: [B] long (no host sync: a gather from the table)
        return x + self.alpha * self.pe[positions].unsqueeze(1)


class SelfAttention(nn.Module):
    """Fused q/k/v projection named like torch's MultiheadAttention (`in_proj_weight`, `out_proj`)."""

    def __init__(self, dim: int):
        super().__init__()
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.in_proj_bias = nn.Parameter(torch.empty(3 * dim))
        self.out_proj = nn.Linear(dim, dim)


class T2SLayer(nn.Module):
    """One post-norm block: x = LN1(x + attn(x)); x = LN2(x + W2 relu(W1 x))."""

    def __init__(self, config: T2SConfig):
        super().__init__()
        dim = config.hidden_dim
        self.n_head = config.n_head
        self.self_attn = SelfAttention(dim)
        self.linear1 = nn.Linear(dim, config.ffn_dim)
        self.linear2 = nn.Linear(config.ffn_dim, dim)
        self.norm1 = nn.LayerNorm(dim, eps=1e-5)
        self.norm2 = nn.LayerNorm(dim, eps=1e-5)

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # x: [B, T, D] -> q, k, v: [B, H, T, D/H]
        qkv = F.linear(x, self.self_attn.in_proj_weight, self.self_attn.in_proj_bias)
        b, t, _ = x.shape
        q, k, v = qkv.view(b, t, 3, self.n_head, -1).permute(2, 0, 3, 1, 4).unbind(0)
        return q, k, v

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        # x: [B, T, D]; attn: [B, H, T, D/H] -> [B, T, D]
        b, _, t, _ = attn.shape
        attn = self.self_attn.out_proj(attn.transpose(1, 2).reshape(b, t, -1))
        x = self.norm1(x + attn)
        return self.norm2(x + self.linear2(F.relu(self.linear1(x))))


class LayerStack(nn.Module):
    """Holds the layers at `h.layers.N` as upstream's TransformerEncoder does."""

    def __init__(self, config: T2SConfig):
        super().__init__()
        self.layers = nn.ModuleList(T2SLayer(config) for _ in range(config.n_layer))


class T2SModel(nn.Module):
    """The decoder's weights and its building blocks; see `decode.py` and `static_decoder.py` for the loops (`static.py`: the step)."""

    def __init__(self, config: T2SConfig):
        super().__init__()
        self.config = config
        dim = config.embedding_dim
        self.bert_proj = nn.Linear(BERT_DIM, dim)
        self.ar_text_embedding = TokenEmbedding(dim, config.phoneme_vocab_size)
        self.ar_text_position = SinePosition(dim)
        self.ar_audio_embedding = TokenEmbedding(dim, config.vocab_size)
        self.ar_audio_position = SinePosition(dim)
        self.h = LayerStack(config)
        self.ar_predict_layer = nn.Linear(config.hidden_dim, config.vocab_size, bias=False)

    def reset_buffers(self, device: torch.device, dtype: torch.dtype) -> None:
        """Rebuild the non-persistent sinusoid tables on `device` in `dtype`."""
        self.ar_text_position.reset_table(device, dtype)
        self.ar_audio_position.reset_table(device, dtype)

    def embed_text(self, phone_ids: torch.Tensor, bert: torch.Tensor) -> torch.Tensor:
        # phone_ids: [B, Tx] long; bert: [B, 1024, Tx] -> [B, Tx, D]
        x = self.ar_text_embedding(phone_ids) + self.bert_proj(bert.transpose(1, 2))
        return self.ar_text_position(x)

    def embed_audio(self, tokens: torch.Tensor) -> torch.Tensor:
        # tokens: [B, Ty] long, positions 0..Ty-1 -> [B, Ty, D]
        return self.ar_audio_position(self.ar_audio_embedding(tokens))

    def embed_audio_at(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # tokens: [B] long; positions: [B] long -> [B, 1, D]
        return self.ar_audio_position.at(self.ar_audio_embedding(tokens).unsqueeze(1), positions)

    def prefill(
        self, xy: torch.Tensor, attend: torch.Tensor
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """Run the prompt through every layer.

        xy: [B, T, D]; attend: bool [T, T] or [B, 1, T, T], True where a query may see a key.
        Returns the hidden states [B, T, D] and each layer's keys and values [B, H, T, D/H].
        """
        keys, values = [], []
        x = xy
        for layer in self.h.layers:
            q, k, v = layer.project_qkv(x)
            x = layer.finish(x, F.scaled_dot_product_attention(q, k, v, attn_mask=attend))
            keys.append(k)
            values.append(v)
        return x, keys, values

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [B, D] -> [B, V]
        return self.ar_predict_layer(hidden)


def prompt_attention(n_text: int, n_audio: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """bool [T, T], True = may attend: phonemes see all phonemes (not audio); audio sees all
    phonemes and earlier audio (upstream's x_attn_mask / y_attn_mask, inverted to "allowed")."""
    n = n_text + n_audio
    attend = torch.zeros(n, n, dtype=torch.bool, device=device)
    attend[:n_text, :n_text] = True
    attend[n_text:, :n_text] = True
    attend[n_text:, n_text:] = torch.ones(n_audio, n_audio, dtype=torch.bool, device=device).tril()
    return attend


def checkpoint_state_dict(model: T2SModel) -> dict[str, torch.Tensor]:
    """The model's tensors under the names a GPT checkpoint stores them (`model.` prefix)."""
    return {f"model.{k}": v for k, v in model.state_dict().items()}
