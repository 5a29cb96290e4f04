"""Errors of the optimization layer; each names what to change."""

from __future__ import annotations

from voicehub.errors import MissingDependencyError, VoiceHubError


class OptimizationError(VoiceHubError):
    """Base class of the optimization layer's errors."""


class OptimizationUnsupportedError(OptimizationError, ValueError):
    """An explicit request that the family, device, dtype or GPU cannot run; nothing was changed."""


class OptimizationNotImplementedError(OptimizationUnsupportedError):
    """A technique the family declares for its design but has not implemented yet; nothing changed."""


class TrainingModeUnsupportedError(OptimizationUnsupportedError):
    """mode='training': VoiceHub optimizes inference only, for every family."""


class OptimizationDependencyError(OptimizationUnsupportedError, MissingDependencyError):
    """An explicitly requested technique needs a package that is missing or cannot be imported."""


class OptimizationCompileError(OptimizationError, RuntimeError):
    """torch.compile failed while an explicit compile request was applied; the model was rolled back."""


class OptimizationStateError(OptimizationError, RuntimeError):
    """optimize() on a model already optimized, or restore() on one that is not."""


class OptimizationRollbackError(OptimizationError, RuntimeError):
    """Undoing applied transforms failed: the model may be half-optimized; reload it."""


class EvidenceError(OptimizationError, ValueError):
    """An evidence file is malformed or its numbers do not support its recorded decision."""


__all__ = [
    "EvidenceError",
    "MissingDependencyError",
    "OptimizationCompileError",
    "OptimizationDependencyError",
    "OptimizationError",
    "OptimizationNotImplementedError",
    "OptimizationRollbackError",
    "OptimizationStateError",
    "OptimizationUnsupportedError",
    "TrainingModeUnsupportedError",
]
