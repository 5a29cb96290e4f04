"""What our HuBERT and BERT modules (hubert_model.py, bert_model.py) share: the config check and
bidirectional multi-head attention over unpadded sequences."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from voicehub.errors import CheckpointError


def check_config(
    config: Mapping[str, Any], supported: Mapping[str, tuple[Any, ...]], source: str, what: str
) -> None:
    """Raise CheckpointError naming each config.json value outside `supported` (key -> allowed values)."""
    wrong = [
        f"{key}={config[key]!r} (supported: {', '.join(map(repr, allowed))})"
        for key, allowed in supported.items()
        if key in config and config[key] not in allowed
    ]
    if wrong:
        raise CheckpointError(f"{source}: a {what} this runtime does not implement: {'; '.join(wrong)}")


def attend(x: torch.Tensor, query: nn.Linear, key: nn.Linear, value: nn.Linear, heads: int) -> torch.Tensor:
    """Softmax attention of every position over every other: x [B, n, C] -> [B, n, C] (heads joined, before
    any output projection), scaled by 1/sqrt(C / heads)."""
    b, n, c = x.shape
    q, k, v = (proj(x).view(b, n, heads, -1).transpose(1, 2) for proj in (query, key, value))
    y = F.scaled_dot_product_attention(q, k, v, scale=1.0 / math.sqrt(c // heads))
    return y.transpose(1, 2).reshape(b, n, c)
