"""The optimization policy layer: decide, apply, record and revert optimizations per family.

`TTSOptimizationConfig(...).resolve(model_type, context=...)` gives a side-effect-free plan;
`model.optimize(config)` applies it transactionally; evidence files decide what `auto` enables.
"""

from voicehub.optimization.apply import (
    AppliedTransform,
    Optimizable,
    OptimizationResult,
    Transform,
    optimize,
    restore,
)
from voicehub.optimization.config import (
    AttentionImplementation,
    CudaGraphPreset,
    DType,
    Feature,
    KernelBackend,
    OptimizationContext,
    OptimizationMode,
    Toggle,
    TTSOptimizationConfig,
)
from voicehub.optimization.errors import (
    EvidenceError,
    OptimizationCompileError,
    OptimizationDependencyError,
    OptimizationError,
    OptimizationNotImplementedError,
    OptimizationRollbackError,
    OptimizationStateError,
    OptimizationUnsupportedError,
    TrainingModeUnsupportedError,
)
from voicehub.optimization.evidence import Evidence, EvidenceStore, check_evidence
from voicehub.optimization.mixin import OptimizableModelMixin, apply_load_time_config
from voicehub.optimization.plan import Decision, OptimizationPlan
from voicehub.optimization.support import (
    TTSOptimizationSupport,
    get_tts_optimization_support,
    list_tts_optimization_support,
)

__all__ = [
    "AppliedTransform",
    "AttentionImplementation",
    "CudaGraphPreset",
    "DType",
    "Decision",
    "Evidence",
    "EvidenceError",
    "EvidenceStore",
    "Feature",
    "KernelBackend",
    "Optimizable",
    "OptimizableModelMixin",
    "OptimizationContext",
    "OptimizationCompileError",
    "OptimizationDependencyError",
    "OptimizationError",
    "OptimizationNotImplementedError",
    "OptimizationMode",
    "OptimizationPlan",
    "OptimizationResult",
    "OptimizationRollbackError",
    "OptimizationStateError",
    "OptimizationUnsupportedError",
    "TTSOptimizationConfig",
    "TTSOptimizationSupport",
    "Toggle",
    "TrainingModeUnsupportedError",
    "Transform",
    "apply_load_time_config",
    "check_evidence",
    "get_tts_optimization_support",
    "list_tts_optimization_support",
    "optimize",
    "restore",
]
