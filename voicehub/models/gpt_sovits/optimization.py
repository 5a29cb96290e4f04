"""The optimization layer's transforms for GPT-SoVITS v3: named, reversible, applied from outside.

`kernel_backend` torch / triton routes BigVGAN's anti-aliased Snake through the kernel registry's
implementation on that backend (`BigVGAN.set_activation_kernel`); triton also runs the T2S graph
decoder's layers through the registry's fused T2S_LAYER_STACK (T2S_LAYER_STACK_ROWS where an engine
batches many streams: `StepKernels.for_rows`) and its sampling and state updates
through T2S_SAMPLE_STEP (`Pipeline.set_t2s_step_kernels`; the
eager reference path, used on the CPU and with cuda_graph_preset 'off', is left as it is). Undo puts the previous functions back. The model
code never picks a kernel: it calls whatever function its instance holds.
The CFM schedule and step cache and compile are in techniques.py. Techniques that the family's
capability record declares but that have no transform yet get a placeholder whose `validate()`
raises `OptimizationNotImplementedError` (a second guard: resolution already refuses an explicit
request for one, and `auto` skips them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

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
            return (
                registry.ANTI_ALIAS_SNAKE, registry.T2S_LAYER_STACK, registry.T2S_LAYER_STACK_ROWS,
                registry.T2S_SAMPLE_STEP,
            )  # fmt: skip
        return (registry.ANTI_ALIAS_SNAKE,)

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
        previous = pipe.vocoder.set_activation_kernel(kernels[registry.ANTI_ALIAS_SNAKE])
        undos: list[Undo] = [lambda: pipe.vocoder.set_activation_kernel(previous)]
        if registry.T2S_LAYER_STACK in kernels and pipe.t2s_decoder is not None:
            step = StepKernels(
                layer_stack=kernels[registry.T2S_LAYER_STACK],
                layer_stack_rows=kernels[registry.T2S_LAYER_STACK_ROWS],
                sampler=kernels[registry.T2S_SAMPLE_STEP],
            )
            try:
                previous_step = pipe.set_t2s_step_kernels(step)
            except BaseException:
                undos[0]()  # atomic: undo the vocoder swap before re-raising
                raise
            undos.append(lambda: pipe.set_t2s_step_kernels(previous_step))

        def undo() -> None:
            for u in reversed(undos):
                u()

        return undo


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
