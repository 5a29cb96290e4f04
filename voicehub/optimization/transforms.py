"""Transforms any family can offer: torch.compile of its hot modules, and the placeholder of a
technique declared without a transform yet. Families build them in their `optimization_targets()`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from voicehub.optimization.config import Feature
from voicehub.optimization.errors import (
    OptimizationCompileError,
    OptimizationDependencyError,
    OptimizationNotImplementedError,
    OptimizationUnsupportedError,
)
from voicehub.optimization.families import Technique

if TYPE_CHECKING:
    from torch import nn

Undo = Callable[[], None]
COMPILE_TECHNIQUE = "torch_compile"


@dataclass(frozen=True)
class CompileTarget:
    """One module to compile: `label` names it in the manifest; `warmup()` calls it once on a small
    input of the shapes it serves (compiling now), under the grad mode of real requests."""

    label: str
    module: nn.Module
    warmup: Callable[[], Any]
    method: str = "forward"


@dataclass
class CompileTransform:
    """compile: torch.compile of each target module's forward, on that instance (runtime/compile.py).

    `targets()` is called by apply() only, so validating reads no weights. `backend` is the
    torch.compile backend ('inductor' for real use; tests use 'aot_eager').
    """

    prefix: str
    device_type: str
    targets: Callable[[], Sequence[CompileTarget]]
    backend: Any  # a torch.compile backend name, or a backend callable
    feature: str = str(Feature.COMPILE)
    technique: str = COMPILE_TECHNIQUE
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.prefix}.compile.{self.technique}"

    def validate(self) -> None:
        from voicehub.runtime.compile import compile_unavailable

        reason = compile_unavailable(self.backend, self.device_type)
        if reason is None:
            return
        error = OptimizationDependencyError if "pip install" in reason else OptimizationUnsupportedError
        raise error(f"compile='required' cannot run here: {reason}; use compile='disabled'")

    def apply(self) -> Undo:
        from voicehub.runtime.compile import CompileFailedError, compile_forward

        undos: list[Undo] = []
        labels: list[str] = []
        try:
            for target in self.targets():
                undos.append(
                    compile_forward(target.module, self.backend, warmup=target.warmup, method=target.method)
                )
                labels.append(target.label)
        except BaseException as exc:
            for undo in reversed(undos):  # atomic: what this transform compiled is undone first
                undo()
            if isinstance(exc, CompileFailedError):
                raise OptimizationCompileError(f"{exc}; use compile='disabled'") from exc
            raise
        self.details.update(backend=str(getattr(self.backend, "__name__", self.backend)), modules=labels)

        def undo_all() -> None:
            for undo in reversed(undos):
                undo()

        return undo_all


@dataclass(frozen=True)
class NotImplementedTransform:
    """The placeholder of a declared technique without a transform: validate() says so."""

    prefix: str
    model_type: str
    tech: Technique

    @property
    def name(self) -> str:
        return f"{self.prefix}.{self.tech.feature}.{self.tech.name}"

    @property
    def feature(self) -> str:
        return str(self.tech.feature)

    @property
    def technique(self) -> str:
        return self.tech.name

    def validate(self) -> None:
        raise OptimizationNotImplementedError(
            f"{self.model_type}: {self.tech.feature}={self.tech.name!r} is {self.tech.not_implemented}; "
            f"leave {self.tech.feature} at its native/disabled value"
        )

    def apply(self) -> Undo:  # never reached: optimize() validates every transform first
        self.validate()
        raise AssertionError("unreachable")
