"""Which implementation serves which named op on which backend, as data.

An op is a name and a tensor signature (stated in the op's reference module). The table below maps
each op to its implementations per backend as "module:function" strings, imported only when asked
for, so importing this module imports no Triton. The registry holds no selection: a model asks for
a function once (`get`) and keeps it on its own instance, as `BigVGAN.set_activation_kernel` does;
two models never share a choice. Backend names match the optimization layer's kernel backends
(`native`, the model's own code, is not a kernel backend: the model simply calls no op).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Callable
from enum import StrEnum
from types import MappingProxyType
from typing import Any

import torch

from voicehub.errors import MissingDependencyError, VoiceHubError


class Backend(StrEnum):
    TORCH = "torch"  # portable PyTorch formulations, any device
    TRITON = "triton"  # Triton kernels: CUDA, or the CPU under TRITON_INTERPRET=1 (tests)
    CUDA_EXTENSION = "cuda_extension"  # compiled CUDA extensions: none shipped yet


ANTI_ALIAS_SNAKE = "anti_alias_snake"  # f(x, up_filter, down_filter, alpha, beta, logscale) -> y
ADD_LAYER_NORM = "add_layer_norm"  # f(x, residual, weight, bias, eps) -> LayerNorm(x + residual)
DECODE_ATTENTION = "decode_attention"  # f(q, k, v, n_valid, scale) -> out
T2S_LAYER_STACK = "t2s_layer_stack"  # f(x, weights, k_cache, v_cache, lengths, n_slots) -> logits
# T2S_LAYER_STACK's signature and definition, tiled over blocks of rows: for batches of many streams
T2S_LAYER_STACK_ROWS = "t2s_layer_stack_rows"
# f(tokens, audio_pos, embed, weights, k_cache, v_cache, lengths, n_slots) -> logits (embedding inside)
T2S_EMBED_STACK = "t2s_embed_layer_stack"
# T2S_EMBED_STACK's signature and definition, tiled over blocks of rows (the embedding one kernel)
T2S_EMBED_STACK_ROWS = "t2s_embed_layer_stack_rows"
T2S_SAMPLE_STEP = (
    "t2s_sample_step"  # f(logits, q, buf, state, lengths, *, eos, n_blocked, max_steps) -> tokens
)
# f(seed_lo, seed_hi, step [B], vocab_keys [V]) -> a batched decode step's Exp(1) noise [B, V] (row_rng.py)
ROW_NOISE = "row_noise"
# The DiT block's elementwise ops (signatures in dit_block.py):
DIT_MODULATED_NORM = "dit_modulated_norm"  # f(x, shift, scale, eps) -> LayerNorm(x) * (1 + scale) + shift
DIT_RESIDUAL_NORM = "dit_residual_norm"  # f(x, y, gate, mask, shift, scale, eps) -> (r, modulated norm of r)
DIT_GATED_RESIDUAL = "dit_gated_residual"  # f(x, y, gate) -> x + gate * y
DIT_ROPE = "dit_rope"  # f(q, k, cos, sin) -> (q, k) with the first head rotated (may write q, k)
DIT_ATTENTION_BIAS = "dit_attention_bias"  # f(mask, dtype) -> [B, 1, 1, N] additive attention mask
DIT_DEPTHWISE_CONV = "dit_depthwise_conv"  # f(x [B, D, N], weight [D, 1, K], bias, padding) -> y [B, D, N']


class KernelUnavailableError(VoiceHubError, RuntimeError):
    """A kernel backend cannot run here (no GPU, old GPU, Triton missing); the message says why."""


_PKG = "voicehub.runtime.kernels"
_IMPLEMENTATIONS: MappingProxyType[str, MappingProxyType[Backend, str]] = MappingProxyType(
    {
        ANTI_ALIAS_SNAKE: MappingProxyType(
            {
                Backend.TORCH: f"{_PKG}.anti_alias_snake:anti_alias_snake_polyphase",
                Backend.TRITON: f"{_PKG}.anti_alias_snake_triton:anti_alias_snake_triton",
            }
        ),
        ADD_LAYER_NORM: MappingProxyType(
            {
                Backend.TORCH: f"{_PKG}.add_layer_norm:add_layer_norm_reference",
                Backend.TRITON: f"{_PKG}.add_layer_norm_triton:add_layer_norm_triton",
            }
        ),
        DECODE_ATTENTION: MappingProxyType(
            {
                Backend.TORCH: f"{_PKG}.decode_attention:decode_attention_reference",
                Backend.TRITON: f"{_PKG}.decode_attention_triton:decode_attention_triton",
            }
        ),
        T2S_LAYER_STACK: MappingProxyType(
            {
                Backend.TORCH: f"{_PKG}.t2s_layer:decode_stack_reference",
                Backend.TRITON: f"{_PKG}.t2s_layer_triton:decode_stack_triton",
            }
        ),
        T2S_LAYER_STACK_ROWS: MappingProxyType(
            {
                Backend.TORCH: f"{_PKG}.t2s_layer:decode_stack_reference",
                Backend.TRITON: f"{_PKG}.t2s_layer_mma_triton:decode_stack_mma",
            }
        ),
        T2S_EMBED_STACK: MappingProxyType(
            {
                Backend.TORCH: f"{_PKG}.t2s_layer:embed_stack_reference",
                Backend.TRITON: f"{_PKG}.t2s_layer_triton:embed_stack_triton",
            }
        ),
        T2S_EMBED_STACK_ROWS: MappingProxyType(
            {
                Backend.TORCH: f"{_PKG}.t2s_layer:embed_stack_reference",
                Backend.TRITON: f"{_PKG}.t2s_layer_mma_triton:embed_stack_mma",
            }
        ),
        T2S_SAMPLE_STEP: MappingProxyType(
            {
                Backend.TORCH: f"{_PKG}.sample_step:sample_step_reference",
                Backend.TRITON: f"{_PKG}.sample_step_triton:sample_step_triton",
            }
        ),
        ROW_NOISE: MappingProxyType(
            {
                Backend.TORCH: "voicehub.runtime.row_rng:row_noise",
                Backend.TRITON: f"{_PKG}.row_noise_triton:row_noise_triton",
            }
        ),
        **{
            op: MappingProxyType(
                {
                    Backend.TORCH: f"{_PKG}.dit_block:{name}_reference",
                    Backend.TRITON: f"{_PKG}.dit_block_triton:{name}_triton",
                }
            )
            for op, name in (
                (DIT_MODULATED_NORM, "modulated_norm"),
                (DIT_RESIDUAL_NORM, "residual_norm"),
                (DIT_GATED_RESIDUAL, "gated_residual"),
                (DIT_ROPE, "rope"),
            )
        },
        # One tiny torch op on [B, N] per forward: a kernel of our own would save nothing.
        DIT_ATTENTION_BIAS: MappingProxyType(
            {
                Backend.TORCH: f"{_PKG}.dit_block:attention_bias_reference",
                Backend.TRITON: f"{_PKG}.dit_block:attention_bias_reference",
            }
        ),
        # ATen's depthwise kernel, no cuDNN: cuDNN plans each new length (~0.15-0.2 s of host time, at
        # load and at a voice's first request; dit_conv_probe_h100.json) for a convolution of ~15 us.
        DIT_DEPTHWISE_CONV: MappingProxyType(
            {
                Backend.TORCH: "voicehub.runtime.eager_conv:depthwise_conv1d",
                Backend.TRITON: "voicehub.runtime.eager_conv:depthwise_conv1d",
            }
        ),
    }
)
# The definition of each op, against which every backend is tested.
_REFERENCES = MappingProxyType(
    {
        ANTI_ALIAS_SNAKE: f"{_PKG}.anti_alias_snake:anti_alias_snake_reference",
        ADD_LAYER_NORM: f"{_PKG}.add_layer_norm:add_layer_norm_reference",
        DECODE_ATTENTION: f"{_PKG}.decode_attention:decode_attention_reference",
        T2S_LAYER_STACK: f"{_PKG}.t2s_layer:decode_stack_reference",
        T2S_LAYER_STACK_ROWS: f"{_PKG}.t2s_layer:decode_stack_reference",
        T2S_EMBED_STACK: f"{_PKG}.t2s_layer:embed_stack_reference",
        T2S_EMBED_STACK_ROWS: f"{_PKG}.t2s_layer:embed_stack_reference",
        T2S_SAMPLE_STEP: f"{_PKG}.sample_step:sample_step_reference",
        ROW_NOISE: "voicehub.runtime.row_rng:row_noise",
        DIT_MODULATED_NORM: f"{_PKG}.dit_block:modulated_norm_reference",
        DIT_RESIDUAL_NORM: f"{_PKG}.dit_block:residual_norm_reference",
        DIT_GATED_RESIDUAL: f"{_PKG}.dit_block:gated_residual_reference",
        DIT_ROPE: f"{_PKG}.dit_block:rope_reference",
        DIT_ATTENTION_BIAS: f"{_PKG}.dit_block:attention_bias_reference",
        DIT_DEPTHWISE_CONV: f"{_PKG}.dit_block:depthwise_conv_reference",
    }
)
MIN_TRITON = (3, 2)  # tl.gather, used by the anti-aliased Snake kernel
MIN_CUDA_CAPABILITY = (7, 5)  # Triton 3's oldest supported NVIDIA architecture


def ops() -> tuple[str, ...]:
    """Every registered op name."""
    return tuple(_IMPLEMENTATIONS)


def backends(op: str) -> tuple[Backend, ...]:
    """The backends with an implementation of `op`."""
    return tuple(_table(op))


def _table(op: str) -> MappingProxyType[Backend, str]:
    if op not in _IMPLEMENTATIONS:
        raise ValueError(f"unknown kernel op {op!r}; registered ops: {', '.join(_IMPLEMENTATIONS)}")
    return _IMPLEMENTATIONS[op]


def _backend(backend: str | Backend) -> Backend:
    try:
        return Backend(backend)
    except ValueError:
        valid = ", ".join(b.value for b in Backend)
        raise ValueError(f"unknown kernel backend {backend!r}; valid backends: {valid}") from None


def _triton_unmet(device: torch.device) -> str | None:
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install triton)"
    version = importlib.metadata.version("triton")
    parsed = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if parsed < MIN_TRITON:
        return f"triton {version} is older than {'.'.join(map(str, MIN_TRITON))}, which these kernels need"
    if device.type == "cpu":
        if os.environ.get("TRITON_INTERPRET") == "1":
            return None  # the interpreter runs kernels on CPU tensors (slowly: for tests)
        return "Triton kernels need a CUDA device (or TRITON_INTERPRET=1 for testing on the CPU)"
    if device.type != "cuda":
        return f"Triton kernels need a CUDA device, not {device.type}"
    if not torch.cuda.is_available():
        return "torch sees no CUDA GPU"
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CUDA_CAPABILITY:
        need = "sm_{}{}".format(*MIN_CUDA_CAPABILITY)
        return f"this GPU is sm_{capability[0]}{capability[1]}; Triton needs {need} or newer"
    return None


def available(op: str, backend: str | Backend, device: torch.device | str) -> str | None:
    """None when `backend` can run `op` on `device`, else the reason it cannot.

    Unknown op or backend names raise ValueError (they are mistakes, not conditions). Checks
    installation, version and device without importing the kernel module or Triton."""
    table, chosen = _table(op), _backend(backend)
    if chosen not in table:
        have = ", ".join(b.value for b in table)
        return f"no {chosen.value} implementation of {op}; it has: {have}"
    if chosen is Backend.TRITON:
        return _triton_unmet(torch.device(device))
    return None


def _load(target: str) -> Callable[..., Any]:
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise MissingDependencyError(f"kernel module {module_name} cannot be imported: {exc}") from exc
    return getattr(module, attr)


def get(op: str, backend: str | Backend) -> Callable[..., Any]:
    """The implementation of `op` on `backend` (imports its module now). Check `available` first:
    this only raises when the backend has no implementation or its module cannot be imported."""
    table, chosen = _table(op), _backend(backend)
    if chosen not in table:
        have = ", ".join(b.value for b in table)
        raise ValueError(f"no {chosen.value} implementation of {op}; it has: {have}")
    return _load(table[chosen])


def reference(op: str) -> Callable[..., Any]:
    """The op's definition in plain PyTorch, the function every backend is tested against."""
    _table(op)
    return _load(_REFERENCES[op])


def resolve(op: str, backend: str | Backend, device: torch.device | str) -> Callable[..., Any]:
    """`get` after `available`: the implementation, or KernelUnavailableError naming the reason."""
    reason = available(op, backend, device)
    if reason is not None:
        raise KernelUnavailableError(f"kernel {op} on {_backend(backend).value}: {reason}")
    return get(op, backend)
