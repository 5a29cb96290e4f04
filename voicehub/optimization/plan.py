"""Resolution: a config, a family and a context become an `OptimizationPlan` of decisions.

Side-effect free: reads the capability records and the evidence files, checks installed
distributions by their metadata (nothing optional is imported) and changes no model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from voicehub.choices import parse_choice
from voicehub.optimization.config import (
    NATIVE,
    Feature,
    OptimizationContext,
    OptimizationMode,
    Toggle,
    TTSOptimizationConfig,
)
from voicehub.optimization.errors import (
    OptimizationDependencyError,
    OptimizationNotImplementedError,
    OptimizationUnsupportedError,
    TrainingModeUnsupportedError,
)
from voicehub.optimization.evidence import EvidenceStore
from voicehub.optimization.families import FAMILY_CAPABILITIES, FamilyCapabilities, Technique, TechniqueKind

PLAN_SCHEMA = "voicehub.optimization.plan/1"
AUTO, REQUIRED = "auto", Toggle.REQUIRED.value
OFF_VALUES = frozenset({NATIVE, Toggle.DISABLED.value})


def canonical_json(obj: Any) -> str:
    """Sorted keys, no insignificant whitespace: equal content gives equal bytes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class Decision:
    """What one feature became: `selected` is a technique name or 'native'; `kind` is 'exact' or
    'approximate' for a selected technique; `evidence` cites the file that validated it."""

    feature: Feature
    requested: str
    selected: str
    reason: str
    kind: str | None = None
    evidence: dict[str, str] | None = None

    @property
    def is_native(self) -> bool:
        return self.selected == NATIVE

    def to_dict(self) -> dict[str, Any]:
        return {
            "feature": str(self.feature),
            "requested": self.requested,
            "selected": self.selected,
            "reason": self.reason,
            "kind": self.kind,
            "evidence": self.evidence,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Decision:
        return cls(
            Feature(d["feature"]), d["requested"], d["selected"], d["reason"], d["kind"], d["evidence"]
        )


@dataclass(frozen=True)
class OptimizationPlan:
    """The decisions for one family on one context, in application order."""

    model_type: str
    mode: OptimizationMode
    context: OptimizationContext
    config: TTSOptimizationConfig
    decisions: tuple[Decision, ...]

    def decision(self, feature: Feature | str) -> Decision:
        feature = Feature(feature)
        return next(d for d in self.decisions if d.feature == feature)

    @property
    def selected(self) -> tuple[Decision, ...]:
        """The decisions that change something."""
        return tuple(d for d in self.decisions if not d.is_native)

    def to_dict(self) -> dict[str, Any]:
        cited = {d.evidence["file"]: d.evidence for d in self.decisions if d.evidence}
        return {
            "schema": PLAN_SCHEMA,
            "target": {"model_type": self.model_type, "mode": str(self.mode)},
            "context": self.context.to_dict(),
            "config": self.config.to_dict(),
            "decisions": [d.to_dict() for d in self.decisions],
            "evidence": [cited[k] for k in sorted(cited)],
        }

    def manifest(self) -> str:
        """Canonical JSON (versioned by its `schema` field)."""
        return canonical_json(self.to_dict())

    @classmethod
    def from_manifest(cls, manifest: str | dict[str, Any]) -> OptimizationPlan:
        d = json.loads(manifest) if isinstance(manifest, str) else manifest
        if d.get("schema") != PLAN_SCHEMA:
            raise ValueError(f"not a plan manifest of schema {PLAN_SCHEMA!r}: {d.get('schema')!r}")
        return cls(
            model_type=d["target"]["model_type"],
            mode=OptimizationMode(d["target"]["mode"]),
            context=OptimizationContext.from_dict(d["context"]),
            config=TTSOptimizationConfig.from_dict(d["config"]),
            decisions=tuple(Decision.from_dict(x) for x in d["decisions"]),
        )


def family_capabilities(
    model_type: str, capabilities: Mapping[str, FamilyCapabilities] | None = None
) -> FamilyCapabilities:
    """The record of `model_type` in `capabilities` (default: the package's FAMILY_CAPABILITIES)."""
    table = FAMILY_CAPABILITIES if capabilities is None else capabilities
    if model_type not in table:
        known = ", ".join(sorted(table))
        raise OptimizationUnsupportedError(
            f"no optimization support is declared for model_type {model_type!r}; known: {known}"
        )
    return table[model_type]


def missing_distribution(tech: Technique) -> str | None:
    """Why the technique's package is absent, from installed metadata (nothing is imported)."""
    if tech.distribution is None:
        return None
    try:
        metadata.distribution(tech.distribution)
    except metadata.PackageNotFoundError:
        return f"{tech.name} needs the {tech.distribution} package: pip install {tech.distribution}"
    return None


def _explicit(
    feature: Feature, requested: str, caps: FamilyCapabilities, ctx: OptimizationContext
) -> Technique:
    offered = caps.for_feature(feature)
    if requested == REQUIRED:
        tech = offered[0] if offered else None
    else:
        tech = next((t for t in offered if t.name == requested), None)
    if tech is None:
        valid = [AUTO, NATIVE] if feature in (Feature.ATTENTION, Feature.KERNELS) else [AUTO, "disabled"]
        valid += [t.name for t in offered] if requested != REQUIRED else []
        raise OptimizationUnsupportedError(
            f"{caps.model_type} does not support {feature}={requested!r}; use one of {', '.join(valid)}"
        )
    if tech.not_implemented is not None:  # declared for the design, but nothing could run it
        off = NATIVE if feature in (Feature.ATTENTION, Feature.KERNELS) else "disabled"
        raise OptimizationNotImplementedError(
            f"{caps.model_type}: {feature}={tech.name!r} is {tech.not_implemented}; use {feature}={off!r}"
        )
    why = tech.unmet(ctx.device_type, ctx.dtype, ctx.gpu_arch)
    if why:
        raise OptimizationUnsupportedError(f"{feature}={requested!r} cannot run here: {why}")
    why = missing_distribution(tech)
    if why:
        raise OptimizationDependencyError(f"{feature}={requested!r}: {why}")
    return tech


def _auto_skip_reason(
    tech: Technique, caps: FamilyCapabilities, ctx: OptimizationContext, store: EvidenceStore
) -> tuple[str | None, Any]:
    if tech.not_implemented is not None:
        return f"{tech.name}: not implemented yet", None
    why = tech.unmet(ctx.device_type, ctx.dtype, ctx.gpu_arch) or missing_distribution(tech)
    if why:
        return why, None
    if ctx.device_type == "cuda" and ctx.gpu_arch is None:
        return f"{tech.name}: GPU architecture unknown, so no evidence applies (pass gpu_arch)", None
    ev = store.find(caps.model_type, tech.feature, tech.name, ctx.dtype, ctx.platform)
    if ev is None:
        where = f"{caps.model_type}, {ctx.dtype}, {ctx.platform}"
        if tech.kind is TechniqueKind.APPROXIMATE:
            return (
                f"{tech.name}: no evidence for {where}; it is approximate, so auto enables it only after a "
                "fixed-seed comparison on a real checkpoint passes the quality gate"
            ), None
        return f"{tech.name}: no evidence for {where}", None
    if not ev.is_validated:
        return f"{tech.name}: rejected by {ev.source}", None
    if not ev.can_validate(tech.kind):
        return (
            f"{tech.name} is approximate: only a real-checkpoint quality comparison validates it, "
            f"and {ev.source} is not one"
        ), None
    return None, ev


def _decide(
    feature: Feature,
    config: TTSOptimizationConfig,
    caps: FamilyCapabilities,
    ctx: OptimizationContext,
    store: EvidenceStore,
) -> Decision:
    requested = config.requested(feature)
    if requested in OFF_VALUES:
        return Decision(feature, requested, NATIVE, "requested")
    if requested != AUTO:
        tech = _explicit(feature, requested, caps, ctx)
        ev = store.find(caps.model_type, feature, tech.name, ctx.dtype, ctx.platform)
        reason = "requested explicitly"
        if tech.kind == "approximate":
            reason += "; approximate: the audio differs from eager"
        if ev is not None and not ev.is_validated:
            reason += f"; note: rejected by {ev.source}"
        return Decision(feature, requested, tech.name, reason, str(tech.kind))
    skipped = []
    for tech in caps.for_feature(feature):
        why, ev = _auto_skip_reason(tech, caps, ctx, store)
        if why is None:
            return Decision(
                feature, AUTO, tech.name, f"validated by {ev.source}", str(tech.kind), ev.citation()
            )
        skipped.append(why)
    if not skipped:
        return Decision(feature, AUTO, NATIVE, f"{caps.model_type} offers no {feature} technique")
    return Decision(feature, AUTO, NATIVE, "stays native: " + "; ".join(skipped))


def resolve_plan(
    config: TTSOptimizationConfig,
    model_type: str,
    mode: str = "inference",
    context: OptimizationContext | None = None,
    evidence: EvidenceStore | None = None,
    capabilities: Mapping[str, FamilyCapabilities] | None = None,
) -> OptimizationPlan:
    """See TTSOptimizationConfig.resolve."""
    caps = family_capabilities(model_type, capabilities)
    mode = parse_choice(OptimizationMode, mode, "mode")
    context = context if context is not None else OptimizationContext(mode=mode)
    if OptimizationMode.TRAINING in (mode, context.mode):
        raise TrainingModeUnsupportedError(
            f"mode='training' is not supported for {model_type} (VoiceHub optimizes inference only); "
            "use mode='inference'"
        )
    store = evidence if evidence is not None else EvidenceStore.packaged()
    decisions = tuple(_decide(f, config, caps, context, store) for f in Feature)
    return OptimizationPlan(model_type, mode, context, config, decisions)
