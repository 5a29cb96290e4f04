"""The weight-norm file layout of SoVITS and BigVGAN, and their strict loading (voicehub.models.checkpoints).

Upstream GPT-SoVITS keeps `torch.nn.utils.weight_norm` on some convolutions, so its files hold
`<layer>.weight_g` / `<layer>.weight_v` where our modules hold a plain `<layer>.weight`. Layers
of the classes below are stored that way; every other tensor is stored under its own name.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from voicehub.models.checkpoints import check_state_dict, fold_weight_norm, load_strict
from voicehub.models.gpt_sovits.weights import assign_strict

SLOT_HINT = "Is this the right file for this slot?"


class WeightNormConv1d(nn.Conv1d):
    """A Conv1d whose checkpoint stores weight_norm's `weight_g`/`weight_v` (folded at load)."""


class WeightNormConvTranspose1d(nn.ConvTranspose1d):
    """A ConvTranspose1d whose checkpoint stores weight_norm's `weight_g`/`weight_v`."""


WEIGHT_NORM_TYPES = (WeightNormConv1d, WeightNormConvTranspose1d)


def weight_norm_layers(model: nn.Module) -> set[str]:
    """Names of the layers whose weight a checkpoint stores as weight_g/weight_v."""
    return {name for name, mod in model.named_modules() if isinstance(mod, WEIGHT_NORM_TYPES)}


def file_layout(model: nn.Module, weight_normed: bool = True) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes a checkpoint of `model` holds (weight_g/weight_v when `weight_normed`)."""
    wn = weight_norm_layers(model) if weight_normed else set()
    layout: dict[str, tuple[int, ...]] = {}
    for name, tensor in model.state_dict().items():
        owner, _, leaf = name.rpartition(".")
        if leaf == "weight" and owner in wn:
            # torch's weight_norm(dim=0) keeps one norm per slice of dim 0.
            layout[f"{owner}.weight_g"] = (tensor.shape[0],) + (1,) * (tensor.dim() - 1)
            layout[f"{owner}.weight_v"] = tuple(tensor.shape)
        else:
            layout[name] = tuple(tensor.shape)
    return layout


def load_weight_normed(
    model: nn.Module,
    tensors: Mapping[str, torch.Tensor],
    source: str,
    *,
    device: torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> None:
    """Check `tensors` against `model`'s file layout (either weight-norm layout), fold each pair in
    float32, and copy them in; with `device` (a model built on meta) fold each pair there, and assign
    each tensor cast once to `dtype` instead (`weights.assign_strict`).

    The check names the file's own tensors (`weight_g`/`weight_v`), before anything is folded.
    """
    has_g = any(k.endswith(".weight_g") for k in tensors)
    check_state_dict(file_layout(model, weight_normed=has_g), tensors, source, hint=SLOT_HINT)
    if device is None:
        load_strict(model, fold_weight_norm(tensors), source, hint=SLOT_HINT)
    else:
        folded = fold_weight_norm(tensors, device=device, dtype=dtype)
        assign_strict(model, folded, source, device=device, dtype=dtype, hint=SLOT_HINT)
