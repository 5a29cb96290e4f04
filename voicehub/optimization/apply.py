"""Apply and restore, model-agnostic and transactional.

A family exposes named, reversible transforms (`optimization_targets()`); `optimize` resolves
the plan, validates every transform before the first change, applies them in feature order and
undoes what it applied if a later one fails, re-raising that failure (a CUDA out-of-memory
error keeps its type: it is never hidden behind a fallback). The active policy is kept on the
model object itself, so two models never share state.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from voicehub.choices import parse_choice
from voicehub.optimization.config import (
    OptimizationContext,
    OptimizationMode,
    TTSOptimizationConfig,
)
from voicehub.optimization.errors import (
    OptimizationError,
    OptimizationRollbackError,
    OptimizationStateError,
    OptimizationUnsupportedError,
    TrainingModeUnsupportedError,
)
from voicehub.optimization.evidence import EvidenceStore
from voicehub.optimization.plan import OptimizationPlan, canonical_json

RESULT_SCHEMA = "voicehub.optimization.result/1"
STATE_ATTR = "_voicehub_active_optimization"
Undo = Callable[[], None]


@runtime_checkable
class Transform(Protocol):
    """One reversible change: `validate()` raises if it cannot run (changing nothing);
    `apply()` makes the change and returns the callable that undoes it, or raises having
    changed nothing (each transform is atomic; the policy rolls back the ones before it)."""

    name: str
    feature: str
    technique: str

    def validate(self) -> None: ...

    def apply(self) -> Undo: ...


class Optimizable(Protocol):
    """What a model offers the policy layer."""

    model_type: str

    def optimization_context(self) -> OptimizationContext: ...

    def optimization_targets(self) -> Sequence[Transform]: ...


@dataclass(frozen=True)
class AppliedTransform:
    """What was applied; `details` (only where the transform reports any) says how, e.g. the
    compiled modules and backend, or the steps a schedule takes."""

    name: str
    feature: str
    technique: str
    details: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "feature": self.feature, "technique": self.technique}
        if self.details:
            d["details"] = self.details
        return d


@dataclass(frozen=True)
class OptimizationResult:
    """The plan joined with what was applied; `skipped` are the automatic choices left native."""

    plan: OptimizationPlan
    applied: tuple[AppliedTransform, ...]

    def to_dict(self) -> dict[str, Any]:
        skipped = [
            {"feature": str(d.feature), "requested": d.requested, "reason": d.reason}
            for d in self.plan.decisions
            if d.is_native and d.requested == "auto"
        ]
        return {
            "schema": RESULT_SCHEMA,
            "plan": self.plan.to_dict(),
            "applied": [a.to_dict() for a in self.applied],
            "skipped": skipped,
        }

    def manifest(self) -> str:
        return canonical_json(self.to_dict())

    @classmethod
    def from_manifest(cls, manifest: str | dict[str, Any]) -> OptimizationResult:
        d = json.loads(manifest) if isinstance(manifest, str) else manifest
        if d.get("schema") != RESULT_SCHEMA:
            raise ValueError(f"not a result manifest of schema {RESULT_SCHEMA!r}: {d.get('schema')!r}")
        applied = tuple(AppliedTransform(**a) for a in d["applied"])
        return cls(OptimizationPlan.from_manifest(d["plan"]), applied)


@dataclass(frozen=True)
class _Active:
    result: OptimizationResult
    undos: tuple[tuple[Transform, Undo], ...]


def is_out_of_memory(exc: BaseException) -> bool:
    """torch.OutOfMemoryError (CUDA) or MemoryError, recognised without importing torch."""
    return isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"


def active_result(model: Any) -> OptimizationResult | None:
    """The result of the policy active on `model`, or None."""
    active = getattr(model, STATE_ATTR, None)
    return active.result if active is not None else None


def _match(plan: OptimizationPlan, targets: Sequence[Transform]) -> list[Transform]:
    by_key: dict[tuple[str, str], Transform] = {}
    for t in targets:
        key = (str(t.feature), t.technique)
        if key in by_key:
            raise OptimizationError(f"{plan.model_type}: two transforms for {key[0]}={key[1]}")
        by_key[key] = t
    chosen = []
    for d in plan.selected:
        t = by_key.get((str(d.feature), d.selected))
        if t is None:
            raise OptimizationUnsupportedError(
                f"{plan.model_type}: this model offers no transform for {d.feature}={d.selected} "
                f"(its capability record and its optimization_targets() disagree); use {d.feature}=native"
            )
        chosen.append(t)
    return chosen


def _rollback(undos: list[tuple[Transform, Undo]], cause: BaseException) -> None:
    failed = []
    for t, undo in reversed(undos):
        try:
            undo()
        except Exception as exc:  # keep undoing the rest; report every failure
            cause.add_note(f"voicehub: rolling back {t.name} failed: {type(exc).__name__}: {exc}")
            failed.append(t.name)
    if failed:
        raise OptimizationRollbackError(
            f"applying the optimization failed and undoing {', '.join(failed)} failed too: "
            "the model may be half-optimized; reload it"
        ) from cause


def optimize(
    model: Optimizable,
    config: TTSOptimizationConfig,
    *,
    context: OptimizationContext | None = None,
    evidence: EvidenceStore | None = None,
) -> OptimizationResult:
    """Resolve `config` for the model, validate every transform, then apply them all or none."""
    if not isinstance(config, TTSOptimizationConfig):
        raise TypeError(f"config must be a TTSOptimizationConfig, got {type(config).__name__}")
    if getattr(model, STATE_ATTR, None) is not None:
        raise OptimizationStateError(
            "this model is already optimized; call restore_tts_optimization() before optimizing again"
        )
    ctx = context if context is not None else model.optimization_context()
    plan = config.resolve(model.model_type, mode="inference", context=ctx, evidence=evidence)
    transforms = _match(plan, model.optimization_targets()) if plan.selected else []
    for t in transforms:
        t.validate()
    undos: list[tuple[Transform, Undo]] = []
    try:
        for t in transforms:
            undo = t.apply()
            if not callable(undo):
                raise OptimizationError(f"transform {t.name} returned {undo!r} instead of an undo callable")
            undos.append((t, undo))
    except BaseException as exc:  # roll back on anything, including KeyboardInterrupt, then re-raise it
        _rollback(undos, exc)
        raise
    applied = tuple(
        AppliedTransform(t.name, str(t.feature), t.technique, dict(getattr(t, "details", None) or {}) or None)
        for t in transforms
    )
    result = OptimizationResult(plan, applied)
    setattr(model, STATE_ATTR, _Active(result, tuple(undos)))
    return result


def restore(model: Any, mode: str = "inference") -> OptimizationResult:
    """Undo the active policy (last applied first) and return the result it had; raises if none."""
    if parse_choice(OptimizationMode, mode, "mode") is OptimizationMode.TRAINING:
        raise TrainingModeUnsupportedError("restore(mode='training') is not supported; use mode='inference'")
    active: _Active | None = getattr(model, STATE_ATTR, None)
    if active is None:
        raise OptimizationStateError("no optimization is active on this model: nothing to restore")
    failures: list[tuple[str, Exception]] = []
    for t, undo in reversed(active.undos):
        try:
            undo()
        except Exception as exc:  # undo the rest before reporting
            failures.append((t.name, exc))
    setattr(model, STATE_ATTR, None)
    if failures:
        first = failures[0][1]
        for name, exc in failures[1:]:
            first.add_note(f"voicehub: restoring {name} failed: {type(exc).__name__}: {exc}")
        if is_out_of_memory(first):
            raise first
        raise OptimizationRollbackError(
            f"restoring {', '.join(n for n, _ in failures)} failed: the model may be half-optimized; reload it"
        ) from first
    return active.result
