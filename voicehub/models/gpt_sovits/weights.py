"""Loading a module built on the meta device: strict check, one cast-and-copy per tensor, assign.

Building a large module for real runs its random initialisation (seconds for BERT-large or the
SoVITS DiT) only for `load_state_dict` to overwrite every value. Built under `torch.device("meta")`
it costs nothing; the checkpoint's tensors are then checked strictly (naming any missing,
unexpected or mis-shaped tensor and the file), cast to the model's dtype on their way to its
device (one copy each, not a float32 copy converted again by `module.to`), and assigned. What the
file does not hold (the non-persistent buffers a constructor computes, an optional tensor) is
rebuilt by a function per (module class name, tensor name): a tensor with no such function
fails the load, so no module leaves it with an uninitialised tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode

from voicehub.models.checkpoints import check_state_dict

# (meta tensor) -> its value on the CPU, in the dtype the constructor gives it.
Builder = Callable[[torch.Tensor], torch.Tensor]


# Value-setting ops constructors call (random init, fill, zero). On a meta tensor they change nothing (it
# has no values), but torch runs several on meta through Python kernels, whose first use imports
# torch._dynamo, sympy and ~900 other modules (1-2 s at the first build in a process): the meta build skips
# them. Each returns its target, as these ops do; none changes a shape, dtype or stride.
_INIT = torch.nn.init
VALUE_INIT_OPS = frozenset({
    torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.fill_, torch.Tensor.zero_,
    _INIT.normal_, _INIT.uniform_, _INIT.constant_, _INIT.kaiming_uniform_, _INIT.kaiming_normal_,
})  # fmt: skip
# Constant factories: on meta only the result's shape, dtype and flags exist, and `empty` given the same
# arguments makes the same ones (torch 2.13 runs `zeros`/`ones`/`full` on meta through Python kernels).
_AS_EMPTY = {
    torch.zeros: torch.empty, torch.ones: torch.empty, torch.zeros_like: torch.empty_like,
    torch.ones_like: torch.empty_like, torch.full_like: torch.empty_like, torch.Tensor.new_zeros: torch.Tensor.new_empty,
    torch.Tensor.new_ones: torch.Tensor.new_empty, torch.Tensor.new_full: torch.Tensor.new_empty,
}  # fmt: skip
_FILL_AT = {torch.full_like: 1, torch.Tensor.new_full: 2}  # the fill value's position, dropped for `empty`


def _makes_meta(func, args, kwargs) -> bool:
    # whether a factory call's result is on the meta device (no `out=`: that writes an existing tensor)
    if "out" in kwargs:
        return False
    if kwargs.get("device") is not None:
        return torch.device(kwargs["device"]).type == "meta"
    if func in (torch.zeros, torch.ones, torch.full):
        return torch.get_default_device().type == "meta"
    first = args[0] if args else kwargs.get("input")  # a *_like input, or the tensor of new_*
    return isinstance(first, torch.Tensor) and first.is_meta


def _empty_full(size, fill_value, *, dtype=None, **kwargs) -> torch.Tensor:
    # torch.full's dtype when none is given follows the fill value (bool, int64, the default float...)
    dtype = dtype if dtype is not None else torch.full((), fill_value, device="cpu").dtype
    return torch.empty(size, dtype=dtype, **kwargs)


class _MetaBuild(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in VALUE_INIT_OPS:
            # torch.nn.init passes its tensor by keyword, a Tensor method as its first argument
            target = args[0] if args else kwargs.get("tensor")
            if isinstance(target, torch.Tensor) and target.is_meta:
                return target
        elif func in _AS_EMPTY and _makes_meta(func, args, kwargs):
            if func in _FILL_AT:  # its dtype, when none is given, is its input's, as `empty`'s
                args, kwargs = args[: _FILL_AT[func]], {k: v for k, v in kwargs.items() if k != "fill_value"}
            return _AS_EMPTY[func](*args, **kwargs)
        elif func is torch.full and _makes_meta(func, args, kwargs):
            return _empty_full(*args, **kwargs)
        return func(*args, **kwargs)


@contextmanager
def meta_device() -> Iterator[None]:
    """Build modules on the meta device (shapes and dtypes only), skipping what only sets values: random
    initialisers, fills, constant factories (made as `empty`). Constructors should compute tables with
    `computed_buffer`: other arithmetic on meta still works, through torch's slow-to-import Python kernels.

    Thread-local, as `torch.device` is: a build on another thread is not affected."""
    with torch.device("meta"), _MetaBuild():
        yield


def computed_buffer(
    shape: tuple[int, ...], compute: Callable[[], torch.Tensor], dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """A tensor a constructor computes (a sinusoid table, a filter): `compute()`, or inside `meta_device()`
    an empty meta tensor of `shape` and `dtype`, which the loader assigns from the file or rebuilds.

    Why: arithmetic on meta tensors (and `arange`, `randn`, `kaiser_window` on meta) runs through torch's
    Python references, whose first use imports sympy, torch._dynamo and ~900 other modules (2-3 s of
    process start); the meta build makes only empty tensors."""
    if torch.get_default_device().type == "meta":
        return torch.empty(shape, dtype=dtype)
    return compute()


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
    to `dtype` (floating ones) on `device`. An optional tensor the file lacks stays on meta, for
    `rebuild_missing` to compute."""
    own = module.state_dict(keep_vars=True)
    expected = {k: tuple(v.shape) for k, v in own.items()}
    check_state_dict(expected, state, source, model=model, optional=optional, hint=hint)
    values = {
        # copy a CPU tensor: a memory-mapped file's pages are never shared with the model; one on another
        # device was made by the load (a weight-norm fold there) and is used as it is, not copied again
        name: value.to(device=device, dtype=target_dtype(own[name], dtype), copy=value.device.type == "cpu")
        for name, value in state.items()
    }
    module.load_state_dict(values, strict=False, assign=True)  # strictness checked above


def _on_meta(module: torch.nn.Module):
    # (owner's name, owner, tensor name, tensor) of each parameter and buffer still on the meta device
    for owner_name, owner in module.named_modules():
        for name, t in [*owner.named_parameters(recurse=False), *owner.named_buffers(recurse=False)]:
            if t is not None and t.is_meta:
                yield owner_name, owner, name, t


def without_builder(module: torch.nn.Module, builders: Mapping[tuple[str, str], Builder]) -> list[str]:
    """Names of the tensors left on meta that `builders` cannot compute."""
    found = [(f"{o}.{n}" if o else n, owner, n) for o, owner, n, _ in _on_meta(module)]
    return [full for full, owner, n in found if (type(owner).__name__, n) not in builders]


def rebuild_missing(
    module: torch.nn.Module,
    builders: Mapping[tuple[str, str], Builder],
    device: torch.device,
    dtype: torch.dtype,
) -> None:
    """Give every tensor still on the meta device (non-persistent buffers, optional tensors the file
    lacked) its value from `builders[(class name, tensor name)]`, cast as `module.to(device, dtype)` would."""
    unknown = without_builder(module, builders)
    assert not unknown, f"not in the checkpoint and no rebuild function: {unknown[:8]}"
    for owner_name, owner, name, t in list(_on_meta(module)):
        value = builders[(type(owner).__name__, name)](t)
        assert value.shape == t.shape, f"{owner_name}.{name}: rebuilt {value.shape}, built {t.shape}"
        value = value.to(device=device, dtype=target_dtype(value, dtype))
        if isinstance(t, torch.nn.Parameter):
            value = torch.nn.Parameter(value, requires_grad=t.requires_grad)
        setattr(owner, name, value)
    # A legacy constructor (`torch.Tensor(n)`, as transformers' HubertModel uses) ignores the meta
    # device: cast what it made as `module.to` did; every other tensor is in place already (no copy).
    module.to(device=device, dtype=dtype)


def check_materialized(module: torch.nn.Module) -> None:
    """Assert no parameter or buffer of `module` is left on the meta device."""
    left = [n for n, t in [*module.named_parameters(), *module.named_buffers()] if t.is_meta]
    assert not left, f"left on the meta device after loading: {left[:8]}"
