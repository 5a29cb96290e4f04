"""Loading a module built on the meta device: strict check, one cast-and-copy per tensor, assign.

Building a large module for real runs its random initialisation (seconds for BERT-large or the
SoVITS DiT) only for `load_state_dict` to overwrite every value. Built under `torch.device("meta")`
it costs nothing; the checkpoint's tensors are then checked strictly (naming any missing,
unexpected or mis-shaped tensor and the file), cast to the model's dtype on their way to its
device (one copy each, not a float32 copy converted again by `module.to`), and assigned. What the
file does not hold, the non-persistent buffers a constructor computes, is rebuilt by a function
per (module class name, buffer name): a buffer with no such function raises, so no module leaves
a load with an uninitialised tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch

from voicehub.models.checkpoints import check_state_dict, fold_weight_norm
from voicehub.models.gpt_sovits.sovits.strict import SLOT_HINT, file_layout

# (meta buffer) -> its value on the CPU, in the dtype the constructor gives it.
BufferBuilder = Callable[[torch.Tensor], torch.Tensor]


def target_dtype(own: torch.Tensor, dtype: torch.dtype) -> torch.dtype:
    # What `module.to(dtype=...)` does: floating tensors take the dtype, integer and bool ones keep theirs.
    return dtype if own.is_floating_point() else own.dtype


@torch.no_grad()
def assign_strict(
    module: torch.nn.Module,
    state: Mapping[str, torch.Tensor],
    source: str,
    *,
    device: torch.device,
    dtype: torch.dtype,
    model: str = "the model",
    optional: Iterable[str] = (),
    hint: str = "",
) -> None:
    """Check `state` against `module.state_dict()` (module built on meta), then assign each tensor cast
    to `dtype` (floating ones) on `device`. An optional tensor the file lacks becomes zeros (it must be
    unused at inference, which is what makes it optional)."""
    optional = set(optional)
    own = module.state_dict(keep_vars=True)
    check_state_dict({k: tuple(v.shape) for k, v in own.items()}, state, source, model=model, optional=optional, hint=hint)  # fmt: skip
    values = {}
    for name, ref in own.items():
        dt = target_dtype(ref, dtype)
        value = state.get(name)
        values[name] = (
            torch.zeros(ref.shape, dtype=dt, device=device)
            if value is None
            else value.to(device=device, dtype=dt, copy=True)  # a memory-mapped file's pages stay its own
        )
    module.load_state_dict(values, strict=True, assign=True)


def assign_weight_normed(
    module: torch.nn.Module,
    tensors: Mapping[str, torch.Tensor],
    source: str,
    *,
    device: torch.device,
    dtype: torch.dtype,
) -> None:
    """`strict.load_weight_normed` for a module built on meta: check the file's own names (either
    weight-norm layout), fold each pair in float32, and assign every tensor cast once to `dtype`."""
    has_g = any(k.endswith(".weight_g") for k in tensors)
    check_state_dict(file_layout(module, weight_normed=has_g), tensors, source, hint=SLOT_HINT)
    assign_strict(module, fold_weight_norm(tensors), source, device=device, dtype=dtype, hint=SLOT_HINT)


def rebuild_buffers(
    module: torch.nn.Module,
    builders: Mapping[tuple[str, str], BufferBuilder],
    device: torch.device,
    dtype: torch.dtype,
) -> None:
    """Give every buffer still on the meta device its value from `builders[(class name, buffer name)]`,
    cast as `module.to(device, dtype)` would."""
    for owner_name, owner in module.named_modules():
        for name, buf in list(owner.named_buffers(recurse=False)):
            if buf is None or not buf.is_meta:
                continue
            key = (type(owner).__name__, name)
            if key not in builders:
                raise AssertionError(
                    f"{owner_name}.{name} ({key[0]}) is not in the checkpoint and has no rebuild function"
                )
            value = builders[key](buf)
            assert value.shape == buf.shape, f"{owner_name}.{name}: rebuilt {value.shape}, built {buf.shape}"
            setattr(owner, name, value.to(device=device, dtype=target_dtype(value, dtype)))


def check_materialized(module: torch.nn.Module) -> None:
    """Assert no parameter or buffer of `module` is left on the meta device."""
    left = [n for n, t in [*module.named_parameters(), *module.named_buffers()] if t.is_meta]
    assert not left, f"left on the meta device after loading: {left[:8]}"
