"""Convolutions without cuDNN for eager calls at shapes no CUDA graph holds.

cuDNN builds execution plans the first time it sees a convolution shape: ~27 ms of host time per
convolution on the H200 (`benchmarks/results/dit_length_probe_h200.json`), so one eager pass of the
SoVITS encoder or of BigVGAN at a length never seen costs a tenth of a second to a second on the host
for a few ms of GPU work. ATen's own CUDA convolutions (im2col + cuBLAS, and its depthwise kernels)
build no plan. `aten_convolutions(device)` routes the conv1d / conv_transpose1d calls that this thread
makes inside it to them (`torch._convolution` with cuDNN off: the same call `torch.conv1d` makes, with
the cuDNN switch of this call alone, so other threads and the process-wide flag are untouched). CUDA
graphs are captured outside it and keep cuDNN's kernels. The runtime uses it for the eager SoVITS
encoder (`benchmarks/results/conv_plan_probe_h200.json`: a new length 68-89 -> 23 ms) and for a voice's
reference (resamplers, HuBERT, style and SoVITS encoders: one length, computed once): ATen's
dilated and transposed convolutions make BigVGAN ~15x slower, and the mode's Python dispatch of every
op costs the DiT more than its plans save at its few bucketed shapes.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
from torch.overrides import TorchFunctionMode

F = TypeVar("F", bound=Callable[..., Any])
DEVICE_TYPES = ("cuda",)  # where cuDNN plans shapes (tests add "cpu" to run the mode's path there)


def _tuple1(value: Any) -> list[int]:
    return [int(value)] if isinstance(value, int) else [int(v) for v in value]


def _convolution(
    x, weight, bias, stride, padding, dilation, transposed, output_padding, groups
) -> torch.Tensor:
    unbatched = x.dim() == 2
    if unbatched:
        x = x.unsqueeze(0)
    out = torch._convolution(
        x, weight, bias, _tuple1(stride), _tuple1(padding), _tuple1(dilation), transposed,
        _tuple1(output_padding), int(groups), False, False, False, torch.backends.cudnn.allow_tf32,
    )  # fmt: skip
    return out.squeeze(0) if unbatched else out


class AtenConvolutions(TorchFunctionMode):
    """conv1d and conv_transpose1d with integer paddings through ATen's convolutions (cuDNN off for
    the call); every other function, and a string padding ("same"/"valid"), runs as it is."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.conv1d:
            x, weight, bias, stride, padding, dilation, groups = _bind(
                args, kwargs, ("input", "weight", "bias", "stride", "padding", "dilation", "groups"),
                (None, 1, 0, 1, 1),
            )  # fmt: skip
            if not isinstance(padding, str):
                return _convolution(x, weight, bias, stride, padding, dilation, False, 0, groups)
        elif func is torch.conv_transpose1d:
            x, weight, bias, stride, padding, output_padding, groups, dilation = _bind(
                args, kwargs,
                ("input", "weight", "bias", "stride", "padding", "output_padding", "groups", "dilation"),
                (None, 1, 0, 0, 1, 1),
            )  # fmt: skip
            return _convolution(x, weight, bias, stride, padding, dilation, True, output_padding, groups)
        return func(*args, **kwargs)


def _bind(args: tuple, kwargs: dict, names: tuple[str, ...], defaults: tuple) -> list[Any]:
    """Positional + keyword arguments of a torch function -> its parameters in order (the first two,
    input and weight, required; `defaults` the rest's)."""
    values = list(args) + [None] * (len(names) - len(args))
    for i, name in enumerate(names):
        if name in kwargs:
            values[i] = kwargs[name]
        elif i >= len(args) and i >= 2:
            values[i] = defaults[i - 2]
    return values


@contextlib.contextmanager
def aten_convolutions(device: torch.device | str) -> Iterator[None]:
    """This thread's 1-d convolutions on a CUDA `device` without cuDNN (see the module's docstring);
    elsewhere nothing changes."""
    if torch.device(device).type not in DEVICE_TYPES:
        yield
        return
    with AtenConvolutions():
        yield


def _device_of(args: tuple) -> torch.device | None:
    for arg in args:
        if isinstance(arg, torch.Tensor):
            return arg.device
        if isinstance(arg, torch.nn.Module):
            return next(arg.parameters()).device
    return None


def without_cudnn(fn: F) -> F:
    """`fn` run inside `aten_convolutions` for the device of its first tensor or module argument: for
    the runtime's eager calls at shapes no graph holds (the model code itself picks no backend)."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        device = _device_of(args)
        with aten_convolutions(device if device is not None else "cpu"):
            return fn(*args, **kwargs)

    return run  # type: ignore[return-value]


def depthwise_conv1d(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, padding: int
) -> torch.Tensor:
    """DIT_DEPTHWISE_CONV (runtime/kernels/dit_block.py) through ATen's depthwise kernel: no cuDNN plan
    to build at a new length (the DiT's text convolution's first call at a new length: 157-202 ms of
    host time with cuDNN, 0.0-0.3 ms this way; in a graph 15.1 us against cuDNN's 12.5 us per call;
    `benchmarks/results/dit_conv_probe_h100.json`). Graphs captured around it replay ATen's kernel."""
    return _convolution(x, weight, bias, 1, padding, 1, False, 0, x.shape[-2])
