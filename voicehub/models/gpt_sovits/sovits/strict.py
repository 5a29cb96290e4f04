"""Strict state-dict loading with weight-norm folding, shared by SoVITS and BigVGAN.

Upstream GPT-SoVITS keeps `torch.nn.utils.weight_norm` on some convolutions, so its files hold
`<layer>.weight_g` / `<layer>.weight_v` where our modules hold a plain `<layer>.weight`. Layers
of the classes below are stored that way; every other tensor is stored under its own name.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from voicehub.errors import CheckpointError

MAX_LISTED = 12  # names listed per category in an error message


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


def fold_weight_norm(weight_g: torch.Tensor, weight_v: torch.Tensor) -> torch.Tensor:
    """weight = g * v / ||v|| with the norm over every dim but 0, computed in float32."""
    v = weight_v.float()
    norm = v.flatten(1).norm(dim=1).view(-1, *([1] * (v.dim() - 1)))
    return weight_g.float() * v / norm


def check_layout(
    tensors: Mapping[str, torch.Tensor],
    expected: Mapping[str, tuple[int, ...]],
    source: str,
    *,
    allow_missing: bool = False,
) -> None:
    """Raise CheckpointError naming every missing, unexpected or mis-shaped tensor of `source`."""
    missing = [] if allow_missing else [k for k in expected if k not in tensors]
    unexpected = [k for k in tensors if k not in expected]
    misshaped = [
        f"{k} {tuple(t.shape)} (expected {expected[k]})"
        for k, t in tensors.items()
        if k in expected and tuple(t.shape) != tuple(expected[k])
    ]
    problems = []
    for label, names in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped)):
        if names:
            shown = ", ".join(names[:MAX_LISTED])
            more = f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else ""
            problems.append(f"{len(names)} {label} tensor(s): {shown}{more}")
    if problems:
        raise CheckpointError(
            f"{source} does not match the model: "
            + "; ".join(problems)
            + ". Is this the right file for this slot?"
        )


def to_module_state(tensors: Mapping[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Checkpoint tensors renamed to `model`'s state dict, weight norm folded where stored."""
    state = dict(tensors)
    for owner in weight_norm_layers(model):
        g_key, v_key = f"{owner}.weight_g", f"{owner}.weight_v"
        if g_key in state and v_key in state:
            state[f"{owner}.weight"] = fold_weight_norm(state.pop(g_key), state.pop(v_key))
    return state


def load_strict(model: nn.Module, tensors: Mapping[str, torch.Tensor], source: str) -> None:
    """Check `tensors` against `model` (either weight-norm layout) and copy them in, in model dtype."""
    has_g = any(k.endswith(".weight_g") for k in tensors)
    check_layout(tensors, file_layout(model, weight_normed=has_g), source)
    state = to_module_state(tensors, model)
    own = model.state_dict()
    with torch.no_grad():
        for name, value in state.items():
            own[name].copy_(value.to(own[name].dtype))
