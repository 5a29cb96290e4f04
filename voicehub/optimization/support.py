"""The support table: which values each family accepts for each control."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from voicehub.optimization.config import NATIVE, Feature, Toggle
from voicehub.optimization.families import FAMILY_CAPABILITIES, FamilyCapabilities
from voicehub.optimization.plan import family_capabilities


@dataclass(frozen=True)
class TTSOptimizationSupport:
    """Accepted values per control for one family. `auto` is always accepted (it may stay native);
    for compile and the diffusion controls, 'required' appears only where the family offers the
    technique. Devices, dtypes and evidence still decide what runs: see `notes`."""

    model_type: str
    attention_implementations: tuple[str, ...]
    kernel_backends: tuple[str, ...]
    compile: tuple[str, ...]
    diffusion_cache: tuple[str, ...]
    diffusion_sampling: tuple[str, ...]
    training: bool = False
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}


def _values(caps: FamilyCapabilities, feature: Feature) -> tuple[str, ...]:
    offered = caps.for_feature(feature)
    if feature in (Feature.ATTENTION, Feature.KERNELS):
        return ("auto", NATIVE, *(t.name for t in offered))
    return (Toggle.AUTO, Toggle.DISABLED) + ((Toggle.REQUIRED,) if offered else ())


def _technique_notes(caps: FamilyCapabilities) -> tuple[str, ...]:
    notes = []
    for t in caps.techniques:
        where = "/".join(sorted(t.devices))
        extra = f", GPU {'/'.join(sorted(t.gpu_archs))}" if t.gpu_archs else ""
        extra += f", needs {t.distribution}" if t.distribution else ""
        notes.append(f"{t.feature}={t.name}: {t.summary} ({t.kind}; {where}{extra})")
    return tuple(notes)


def get_tts_optimization_support(model_type: str) -> TTSOptimizationSupport:
    """The support record of one family; an unknown family raises and lists the known ones."""
    caps = family_capabilities(model_type)
    return TTSOptimizationSupport(
        model_type=caps.model_type,
        attention_implementations=tuple(map(str, _values(caps, Feature.ATTENTION))),
        kernel_backends=tuple(map(str, _values(caps, Feature.KERNELS))),
        compile=tuple(map(str, _values(caps, Feature.COMPILE))),
        diffusion_cache=tuple(map(str, _values(caps, Feature.DIFFUSION_CACHE))),
        diffusion_sampling=tuple(map(str, _values(caps, Feature.DIFFUSION_SAMPLING))),
        training=False,
        notes=_technique_notes(caps) + caps.notes + ("training: not supported (inference only)",),
    )


def list_tts_optimization_support() -> list[TTSOptimizationSupport]:
    """Every family's support record, sorted by model_type."""
    return [get_tts_optimization_support(t) for t in sorted(FAMILY_CAPABILITIES)]
