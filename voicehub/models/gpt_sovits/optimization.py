"""The optimization layer's transforms for GPT-SoVITS v3: named, reversible, applied from outside.

`kernel_backend` torch / triton routes, through the kernel registry's implementations on that backend:
BigVGAN's anti-aliased Snake (`BigVGAN.set_activation_kernel`) and the CFM DiT's block ops, with q/k/v
as one GEMM over packed weights and the attention mask made once per forward (`DiT.set_kernels`; torch
runs the ops' definitions, triton fused kernels). Triton also runs the T2S graph decoder's layers
through the fused T2S_LAYER_STACK (T2S_EMBED_STACK_ROWS, the embedding and T2S_LAYER_STACK_ROWS, where
an engine batches many streams: `StepKernels.for_rows`), its sampling and state updates through
T2S_SAMPLE_STEP and an engine's per-row noise through ROW_NOISE (`Pipeline.set_t2s_step_kernels`; the
eager reference path, used on the CPU and with cuda_graph_preset 'off', is left as it is). Undo puts the
previous functions back. The model code never picks a kernel: it calls whatever function its instance
holds.
The CFM schedule and step cache and compile are in techniques.py. Techniques that the family's
capability record declares but that have no transform yet get a placeholder whose `validate()`
raises `OptimizationNotImplementedError` (a second guard: resolution already refuses an explicit
request for one, and `auto` skips them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from voicehub.models.gpt_sovits.cfm.dit import DiTKernels
from voicehub.models.gpt_sovits.t2s.static import StepKernels
from voicehub.models.gpt_sovits.techniques import technique_transforms
from voicehub.optimization.config import KernelBackend
from voicehub.optimization.errors import OptimizationNotImplementedError, OptimizationUnsupportedError
from voicehub.optimization.families import FAMILY_CAPABILITIES
from voicehub.optimization.transforms import NotImplementedTransform
from voicehub.runtime.kernels import registry

if TYPE_CHECKING:
    from voicehub.models.gpt_sovits.model import GptSovitsModel

Undo = Callable[[], None]
KERNEL_BACKENDS = (KernelBackend.TORCH, KernelBackend.TRITON)  # the backends with a transform here
DIT_OPS = (
    registry.DIT_MODULATED_NORM, registry.DIT_RESIDUAL_NORM, registry.DIT_GATED_RESIDUAL, registry.DIT_ROPE,
    registry.DIT_ATTENTION_BIAS, registry.DIT_DEPTHWISE_CONV,
)  # fmt: skip
# the T2S decoder's ops (`t2s_step_kernels`): triton routes them, torch leaves the decoder as it is
T2S_STEP_OPS = (
    registry.T2S_LAYER_STACK,
    registry.T2S_LAYER_STACK_ROWS,
    registry.T2S_EMBED_STACK_ROWS,
    registry.T2S_SAMPLE_STEP,
    registry.ROW_NOISE,
)


def dit_kernels(kernels: dict[str, Callable]) -> DiTKernels:
    """The DiT's kernel set from resolved registry ops (DIT_OPS), q/k/v packed into one GEMM."""
    return DiTKernels(
        modulated_norm=kernels[registry.DIT_MODULATED_NORM],
        residual_norm=kernels[registry.DIT_RESIDUAL_NORM],
        gated_residual=kernels[registry.DIT_GATED_RESIDUAL],
        rope=kernels[registry.DIT_ROPE],
        attention_bias=kernels[registry.DIT_ATTENTION_BIAS],
        depthwise_conv=kernels[registry.DIT_DEPTHWISE_CONV],
        is_qkv_packed=True,
    )


@dataclass
class KernelBackendTransform:
    """kernels=<backend>: the registry's `backend` implementations of this family's fused ops."""

    model: GptSovitsModel
    backend: KernelBackend
    feature: str = "kernels"

    @property
    def name(self) -> str:
        return f"gpt_sovits.kernels.{self.backend.value}"

    @property
    def technique(self) -> str:
        return self.backend.value

    @property
    def ops(self) -> tuple[str, ...]:
        """The registry ops this backend's transform routes."""
        if self.backend is KernelBackend.TRITON:
            return (registry.ANTI_ALIAS_SNAKE, *T2S_STEP_OPS, *DIT_OPS)
        return (registry.ANTI_ALIAS_SNAKE, *DIT_OPS)

    def validate(self) -> None:
        """Raise, changing nothing, when the backend cannot run an op on the model's device."""
        for op in self.ops:
            reason = registry.available(op, self.backend.value, self.model.device)
            if reason is not None:
                raise OptimizationUnsupportedError(
                    f"kernel_backend={self.backend.value!r} cannot run here: {reason}; use kernel_backend='native'"
                )

    def apply(self) -> Undo:
        kernels = {op: registry.resolve(op, self.backend.value, self.model.device) for op in self.ops}
        pipe = self.model.pipeline  # reads the weights now if the model is lazy
        undos: list[Undo] = []

        def undo() -> None:
            for u in reversed(undos):
                u()

        try:  # atomic: a failure undoes the swaps made so far before re-raising
            previous = pipe.vocoder.set_activation_kernel(kernels[registry.ANTI_ALIAS_SNAKE])
            undos.append(lambda: pipe.vocoder.set_activation_kernel(previous))
            if registry.T2S_LAYER_STACK in kernels and pipe.t2s_decoder is not None:
                previous_step = pipe.set_t2s_step_kernels(t2s_step_kernels(kernels))
                undos.append(lambda: pipe.set_t2s_step_kernels(previous_step))
            dit = pipe.sovits.cfm.estimator
            previous_dit = dit.set_kernels(dit_kernels(kernels))
            undos.append(lambda: dit.set_kernels(previous_dit))
        except BaseException:
            undo()
            raise
        return undo


def t2s_step_kernels(kernels: dict[str, Callable]) -> StepKernels:
    """The T2S decoder's StepKernels from a backend's resolved ops (T2S_STEP_OPS, keyed by op name)."""
    return StepKernels(
        layer_stack=kernels[registry.T2S_LAYER_STACK],
        layer_stack_rows=kernels[registry.T2S_LAYER_STACK_ROWS],
        embed_stack_rows=kernels[registry.T2S_EMBED_STACK_ROWS],
        sampler=kernels[registry.T2S_SAMPLE_STEP],
        row_noise=kernels[registry.ROW_NOISE],
    )


def gpt_sovits_transforms(model: GptSovitsModel) -> list:
    """Every transform the model offers: kernel backends, the CFM techniques and compile
    (techniques.py), plus a placeholder per declared-only technique."""
    caps = FAMILY_CAPABILITIES[model.model_type]
    transforms: list = [KernelBackendTransform(model, b) for b in KERNEL_BACKENDS]
    transforms += technique_transforms(model)
    transforms += [NotImplementedTransform("gpt_sovits", model.model_type, t) for t in caps.not_implemented()]
    return transforms


__all__ = [
    "KernelBackendTransform",
    "NotImplementedTransform",
    "OptimizationNotImplementedError",  # re-exported: it lives in voicehub.optimization.errors
    "gpt_sovits_transforms",
]
