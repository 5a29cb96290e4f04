"""Strict checkpoint loading shared by every family: name each missing, unexpected or mis-shaped
tensor and the file, never load leniently; and weight norm in both of torch's naming conventions.

Weight-normed layers are stored as a magnitude `g` (one value per slice of dim 0) and a direction `v`:
`<layer>.weight_g` / `<layer>.weight_v` (torch.nn.utils.weight_norm, what GPT-SoVITS, BigVGAN and
Piper save), or `<layer>.parametrizations.weight.original0` / `.original1` (its parametrization
successor, what newer transformers save). Folding gives the plain `<layer>.weight` = g * v / ||v||.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import torch

from voicehub.errors import CheckpointError

MAX_LISTED = 12  # names listed per kind of problem in an error message
# (magnitude suffix, direction suffix) of a weight-normed layer's weight, old and new convention.
WEIGHT_NORM_SUFFIXES = (
    (".weight_g", ".weight_v"),
    (".parametrizations.weight.original0", ".parametrizations.weight.original1"),
)


def _listed(names: list[str]) -> str:
    more = f" ... and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else ""
    return ", ".join(names[:MAX_LISTED]) + more


def check_state_dict(
    expected: Mapping[str, Sequence[int]],
    got: Mapping[str, torch.Tensor],
    source: str | Path,
    *,
    model: str = "the model",
    optional: Iterable[str] = (),
    hint: str = "",
) -> None:
    """Raise CheckpointError naming every missing, unexpected and mis-shaped tensor of `got`, and `source`.

    expected: name -> shape the model needs; optional: names `got` may lack (unused at inference, or a
    partial overlay); model: how the message names what the file should match; hint: the fix, appended.
    """
    optional = set(optional)
    missing = [k for k in expected if k not in got and k not in optional]
    unexpected = [k for k in got if k not in expected]
    misshaped = [
        f"{k} {tuple(got[k].shape)} (expected {tuple(shape)})"
        for k, shape in expected.items()
        if k in got and tuple(got[k].shape) != tuple(shape)
    ]
    problems = [
        f"{label}: {_listed(names)}"
        for label, names in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped))
        if names
    ]
    if problems:
        raise CheckpointError(
            f"{source} does not match {model}: " + "; ".join(problems) + (f". {hint}" if hint else "")
        )


@torch.no_grad()
def load_strict(
    module: torch.nn.Module,
    state: Mapping[str, torch.Tensor],
    source: str | Path,
    *,
    model: str = "the model",
    optional: Iterable[str] = (),
    hint: str = "",
) -> None:
    """Check `state` against `module.state_dict()` (see `check_state_dict`), then copy it in.

    Values are cast to each parameter's dtype and copied to its device; the module keeps its own
    tensors (no re-assignment), so it stays where and what it was.
    """
    own = module.state_dict()
    expected = {k: tuple(v.shape) for k, v in own.items()}
    check_state_dict(expected, state, source, model=model, optional=optional, hint=hint)
    for name, value in state.items():
        own[name].copy_(value.to(own[name].dtype))


def _fold(
    g: torch.Tensor, v: torch.Tensor, device: torch.device | None, dtype: torch.dtype | None
) -> torch.Tensor:
    # g: [out, 1, ...], v: [out, ...] -> weight [out, ...], folded in float32 so fp16 files lose nothing here
    v = v.to(device=device, dtype=torch.float32)
    norm = v.flatten(1).norm(dim=1).view(-1, *([1] * (v.dim() - 1)))
    weight = g.to(device=device, dtype=torch.float32) * v / norm
    return weight if dtype is None else weight.to(dtype)


def fold_weight_norm(
    state: Mapping[str, torch.Tensor], *, device: torch.device | None = None, dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """`state` with each complete weight-norm pair (either convention) replaced by its folded `weight`:
    float32 where the pair is, or folded on `device` and cast to `dtype` when given (a load's folds move to
    the model's device: BigVGAN's 133 took 0.22-0.45 s of CPU in a full-size load; each pair's float32
    copy lives only while it is folded).

    Other tensors pass through unchanged; a lone half is left as it is, for the strict check to name.
    """
    out = dict(state)
    for g_suffix, v_suffix in WEIGHT_NORM_SUFFIXES:
        for key in [k for k in state if k.endswith(g_suffix)]:
            base = key[: -len(g_suffix)]
            if base + v_suffix in out:
                out[base + ".weight"] = _fold(out.pop(key), out.pop(base + v_suffix), device, dtype)
    return out


def rename_weight_norm(state: Mapping[str, torch.Tensor], model_keys: set[str]) -> dict[str, torch.Tensor]:
    """`state` with weight-norm halves renamed to the convention `model_keys` uses (for a model that keeps
    weight norm, e.g. HuBERT's positional conv: older files say weight_g/weight_v, newer transformers
    parametrizations.weight.original0/1). Names the model has, or that have no counterpart, are kept."""
    (old_g, old_v), (new_g, new_v) = WEIGHT_NORM_SUFFIXES
    out = {}
    for key, value in state.items():
        if key not in model_keys:
            for a, b in ((old_g, new_g), (old_v, new_v), (new_g, old_g), (new_v, old_v)):
                if key.endswith(a) and key[: -len(a)] + b in model_keys:
                    key = key[: -len(a)] + b
                    break
        out[key] = value
    return out
