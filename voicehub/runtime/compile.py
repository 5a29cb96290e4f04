"""torch.compile as a reversible switch on one module instance (the optimization layer's `compile`).

`compile_forward(module, ...)` sets the instance's `forward` (or another method) to
`torch.compile(module.forward)` and returns the undo, which removes that instance attribute so the
class's own method is called again. Nothing is decorated and no global is replaced: other instances of the class are untouched.
A warm-up call compiles at once, so a backend failure surfaces here (as `CompileFailedError`),
not in the middle of a request.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

DEFAULT_BACKEND = "inductor"
Undo = Callable[[], None]


class CompileFailedError(RuntimeError):
    """torch.compile's backend could not compile the module (the cause is chained)."""


Backend = str | Callable[..., Any]  # a registered backend's name, or a backend callable


def compile_unavailable(backend: Backend, device_type: str) -> str | None:
    """Why `backend` cannot compile for `device_type` ('cpu', 'cuda'), or None when it can try."""
    if not isinstance(backend, str):
        return None  # a callable backend is used as given
    if backend not in torch.compiler.list_backends(exclude_tags=()):
        return f"torch.compile has no backend {backend!r}"
    if backend != "inductor":
        return None
    if device_type == "cuda" and importlib.util.find_spec("triton") is None:
        return "torch.compile's inductor backend needs the triton package on CUDA: pip install triton"
    if device_type == "cpu" and not (os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")):
        return "torch.compile's inductor backend needs a C++ compiler on the CPU (g++ or clang++, or set CXX)"
    return None


def compile_forward(
    module: nn.Module,
    backend: Backend = DEFAULT_BACKEND,
    dynamic: bool = True,
    warmup: Callable[[], Any] | None = None,
    method: str = "forward",
) -> Undo:
    """Compile `module`'s `method` (its forward by default) on this instance; returns the undo.

    dynamic=True compiles shape-generic code once (sequence lengths vary per request) instead of
    recompiling per length. `warmup()` is called once after the switch to compile now; if it fails,
    the switch is undone before the error leaves (a backend failure as CompileFailedError, anything
    else, such as CUDA out of memory, as it was raised).
    """
    if method in vars(module):
        raise RuntimeError(f"{type(module).__name__}.{method} is already replaced on this instance")
    setattr(module, method, torch.compile(getattr(module, method), backend=backend, dynamic=dynamic))

    def undo() -> None:
        vars(module).pop(method, None)

    if warmup is None:
        return undo
    try:
        warmup()
    except torch._dynamo.exc.TorchDynamoException as exc:  # the backend or the tracer failed
        undo()
        raise CompileFailedError(
            f"torch.compile (backend {backend!r}) failed on {type(module).__name__}.{method}: {type(exc).__name__}"
        ) from exc
    except BaseException:
        undo()
        raise
    return undo


def is_compiled(module: nn.Module, method: str = "forward") -> bool:
    """Whether `compile_forward` is in effect on this instance's `method`."""
    return method in vars(module)
