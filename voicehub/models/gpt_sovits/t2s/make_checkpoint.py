"""Random-weight GPT checkpoints in the official layout, for tests (tiny) and GPU benchmarks (full).

Weights come from numpy's PCG64 so a seed gives the same file on any torch version. The scales are
chosen so the decoder is not degenerate: the head gives logits with a spread of a few units, and
attention and positions keep changing the last hidden state, so greedy decoding walks over many
distinct tokens (see `logit_margins`). A testing and benchmarking tool, not a model.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from voicehub.models.gpt_sovits.sizes import Size, parse_size
from voicehub.models.gpt_sovits.t2s.config import BERT_DIM, FULL_V3, TINY, T2SConfig
from voicehub.models.gpt_sovits.t2s.decode import T2SSamplingParams, decode
from voicehub.models.gpt_sovits.t2s.model import T2SModel, checkpoint_state_dict

CONFIGS = {Size.TINY: TINY, Size.FULL: FULL_V3}
LOGIT_STD = 4.0  # spread of the head's logits over unit-variance hidden states


def _init_tensor(name: str, shape: tuple[int, ...], rng: np.random.Generator, depth: float) -> np.ndarray:
    """A value for one parameter, by its role (read from its upstream name).

    depth = 2 / n_layer shrinks what each post-norm layer adds (residual-branch outputs, norm
    offsets): with 24 layers at full scale the hidden state collapses to one vector whatever the
    input, and greedy decoding repeats one token. For the 2-layer tiny model depth is exactly 1.
    """
    normal = rng.standard_normal(shape, dtype=np.float32)
    if name.endswith("word_embeddings.weight"):
        return normal
    if name.endswith(".alpha"):
        return 1.0 + 0.1 * normal
    if ".norm" in name:
        return (1.0 + 0.1 * normal * depth) if name.endswith("weight") else 0.1 * normal * depth
    if name.endswith("bias"):
        return 0.02 * normal
    fan_in = shape[-1]
    if name.endswith("ar_predict_layer.weight"):
        return normal * (LOGIT_STD / math.sqrt(fan_in))
    if name.endswith("in_proj_weight"):
        return normal * math.sqrt(2.0 / fan_in)  # sharper-than-uniform attention
    if name.endswith(("out_proj.weight", "linear2.weight")):
        return normal * math.sqrt(1.0 / fan_in) * depth
    return normal * math.sqrt(1.0 / fan_in)


def random_state_dict(config: T2SConfig, seed: int) -> dict[str, torch.Tensor]:
    """fp16 tensors under the checkpoint's `model.` names, drawn in state-dict order."""
    rng = np.random.default_rng(seed)
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in checkpoint_state_dict(T2SModel(config)).items()}
    depth = 2.0 / config.n_layer
    return {k: torch.from_numpy(_init_tensor(k, s, rng, depth)).to(torch.float16) for k, s in shapes.items()}


def make_t2s_checkpoint(path: str | Path, size: str = "tiny", seed: int = 0) -> Path:
    """Write {"weight", "config", "info"} as upstream's s1_train.py does; returns the path.

    size: "tiny" (2 layers, width 64, 4 heads, real vocab and symbol counts) or "full" (v3 sizes).
    """
    config = CONFIGS[parse_size(size)]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ckpt = {
        "weight": random_state_dict(config, seed),
        "config": config.to_checkpoint_config(),
        "info": f"GPT-e1 (voicehub random {size}, seed {seed})",
    }
    torch.save(ckpt, path)
    return path


def random_prompt(
    config: T2SConfig, n_phones: int, n_prompt_tokens: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random decoder inputs: phone ids [n_phones] long, BERT features [1024, n_phones] float32,
    prompt semantic tokens [n_prompt_tokens] long (never EOS). numpy-seeded, so portable."""
    rng = np.random.default_rng(seed)
    phones = torch.from_numpy(rng.integers(0, config.phoneme_vocab_size, n_phones))
    bert = torch.from_numpy(rng.standard_normal((BERT_DIM, n_phones), dtype=np.float32))
    prompt = torch.from_numpy(rng.integers(0, config.eos, n_prompt_tokens))
    return phones, bert, prompt


def logit_margins(
    model: T2SModel,
    phone_ids: torch.Tensor,
    bert: torch.Tensor,
    prompt_tokens: torch.Tensor,
    n_tokens: int,
    repetition_penalty: float = 1.0,
) -> dict[str, float]:
    """Greedy-decode n_tokens (EOS suppressed) and summarise the top-1 minus top-2 logit margins:
    min, 10th percentile, median, the share under 0.01, and how many distinct tokens came out."""
    params = T2SSamplingParams.greedy(force_n_tokens=n_tokens, repetition_penalty=repetition_penalty)
    result = decode(model, phone_ids, bert, prompt_tokens, params)
    m = result.margins
    return {
        "min": float(m.min()),
        "p10": float(m.quantile(0.1)),
        "median": float(m.median()),
        "share_below_0.01": float((m < 0.01).float().mean()),
        "distinct_tokens": len(set(result.tokens.tolist())),
        "n_tokens": int(result.tokens.numel()),
    }
