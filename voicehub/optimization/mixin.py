"""`OptimizableModelMixin` for TTSModel classes, and the hub's load-time hook.

A family inherits the mixin and overrides `optimization_targets()` (and `is_runtime_loaded`
when it loads lazily, calling `apply_pending_optimization()` right after its weights load).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from voicehub.optimization.apply import (
    STATE_ATTR,
    OptimizationResult,
    Transform,
    active_result,
    optimize,
    restore,
)
from voicehub.optimization.config import OptimizationContext, TTSOptimizationConfig
from voicehub.optimization.errors import OptimizationStateError, OptimizationUnsupportedError

PENDING_ATTR = "_voicehub_pending_optimization"


def detect_gpu_arch(device: Any) -> str | None:
    """'sm_90' for a CUDA device (asks torch), None for the CPU."""
    if str(device).split(":")[0] != "cuda":
        return None
    import torch

    major, minor = torch.cuda.get_device_capability(torch.device(device))
    return f"sm_{major}{minor}"


class OptimizableModelMixin:
    """optimize / restore_tts_optimization / clear_optimization_config for a TTSModel.

    Expects `model_type`, `device` and `dtype` attributes (torch or str) and optionally
    `cuda_graph_preset`; the manifest records them as the context.
    """

    model_type: str

    # -- what families override ---------------------------------------------------------------

    def optimization_targets(self) -> Sequence[Transform]:
        """The reversible transforms this model offers; none by default."""
        return ()

    @property
    def is_runtime_loaded(self) -> bool:
        """False while a lazily loaded model has not read its weights yet."""
        return True

    def load_runtime(self) -> None:
        """Read the weights now if they are not loaded yet (a lazy family overrides this)."""

    def optimization_context(self) -> OptimizationContext:
        """Where this model runs, read from its attributes without loading anything."""
        device = str(getattr(self, "device", "cpu"))
        return OptimizationContext(
            mode="inference",
            device=device,
            dtype=getattr(self, "dtype", None) or "float32",
            gpu_arch=detect_gpu_arch(device),
            cuda_graph_preset=getattr(self, "cuda_graph_preset", None),
        )

    # -- the user-facing API ------------------------------------------------------------------

    def optimize(
        self, config: TTSOptimizationConfig, *, context: OptimizationContext | None = None
    ) -> OptimizationResult:
        """Apply `config` now, all or nothing; `result.manifest()` says what changed and why."""
        if getattr(self, PENDING_ATTR, None) is not None:
            raise OptimizationStateError(
                "a load-time optimization_config is waiting for this model's weights to load; "
                "call clear_optimization_config() before optimizing with another config"
            )
        return optimize(self, config, context=context)

    def restore_tts_optimization(self, mode: str = "inference") -> OptimizationResult:
        """Undo the active optimization; raises OptimizationStateError when none is active."""
        return restore(self, mode)

    def clear_optimization_config(self) -> None:
        """Forget any load-time config and restore the model if an optimization is active."""
        setattr(self, PENDING_ATTR, None)
        if getattr(self, STATE_ATTR, None) is not None:
            restore(self)

    @property
    def optimization_result(self) -> OptimizationResult | None:
        return active_result(self)

    @property
    def pending_optimization_config(self) -> TTSOptimizationConfig | None:
        pending = getattr(self, PENDING_ATTR, None)
        return pending[0] if pending is not None else None

    def apply_pending_optimization(self) -> OptimizationResult | None:
        """Called by a lazy family once its weights are in: applies the load-time config, if any.

        On failure the model is rolled back, the config stays pending and the error is raised.
        """
        pending = getattr(self, PENDING_ATTR, None)
        if pending is None:
            return None
        config, context = pending
        result = optimize(self, config, context=context)
        setattr(self, PENDING_ATTR, None)
        return result


def apply_load_time_config(
    model: Any, config: TTSOptimizationConfig | None, *, context: OptimizationContext | None = None
) -> OptimizationResult | None:
    """The hub's `from_pretrained(optimization_config=...)`: check now, apply when the runtime loads.

    The plan is resolved at once, so an explicit request the model cannot run raises before any
    weights are read. A loaded model is optimized now (the result is returned); a lazy one keeps
    the config until its weights load (returns None; see `apply_pending_optimization`).
    """
    if config is None:
        return None
    if not isinstance(config, TTSOptimizationConfig):
        raise TypeError(f"optimization_config must be a TTSOptimizationConfig, got {type(config).__name__}")
    if not isinstance(model, OptimizableModelMixin):
        raise OptimizationUnsupportedError(
            f"{type(model).__name__} ({getattr(model, 'model_type', '?')}) does not support optimization_config; "
            "load it without one"
        )
    ctx = context if context is not None else model.optimization_context()
    config.resolve(model.model_type, mode="inference", context=ctx)
    if model.is_runtime_loaded:
        return model.optimize(config, context=ctx)
    setattr(model, PENDING_ATTR, (config, ctx))
    return None
