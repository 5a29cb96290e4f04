"""Generation presets for GPT-SoVITS v3: named starting points for per-request parameters.

`fast` favours first-audio latency (fewer CFM steps, a narrow sampler, faster speech);
`quality` favours fidelity (16 CFM steps, a wider sampler).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from enum import StrEnum
from typing import Any

from voicehub.choices import parse_choice


class PresetName(StrEnum):
    FAST = "fast"
    BALANCED = "balanced"
    QUALITY = "quality"


@dataclass(frozen=True)
class GenerationPreset:
    """The parameters a preset fixes; every other request parameter keeps its default."""

    speed: float
    sample_steps: int  # CFM solver steps
    top_k: int
    top_p: float
    temperature: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


PRESETS: dict[PresetName, GenerationPreset] = {
    PresetName.FAST: GenerationPreset(speed=1.3, sample_steps=4, top_k=3, top_p=1.0, temperature=0.6),
    PresetName.BALANCED: GenerationPreset(speed=1.1, sample_steps=4, top_k=5, top_p=1.0, temperature=0.6),
    PresetName.QUALITY: GenerationPreset(speed=1.0, sample_steps=16, top_k=8, top_p=0.8, temperature=0.8),
}


def parse_preset(name: str | PresetName) -> PresetName:
    return parse_choice(PresetName, name, "preset")


def list_presets() -> list[str]:
    return [p.value for p in PresetName]


def apply_preset(name: str | PresetName, overrides: dict[str, Any] | None = None) -> GenerationPreset:
    """The preset `name` with `overrides` applied; an override of an unknown field raises and lists the fields."""
    preset = PRESETS[parse_preset(name)]
    overrides = dict(overrides or {})
    known = {f.name for f in fields(GenerationPreset)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown preset override(s) {unknown}; presets set: {', '.join(sorted(known))}")
    return replace(preset, **overrides)
