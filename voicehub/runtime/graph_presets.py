"""CUDA-graph presets: engine configuration given at load. Torch-free, so the optimization layer's
plans can record a preset without importing the runtime that captures graphs (cuda_graphs.py)."""

from __future__ import annotations

from enum import StrEnum

from voicehub.choices import parse_choice


class GraphPreset(StrEnum):
    """When graphs are captured: every bucket at load, the common ones at load, each on first use, never."""

    FULL = "full"
    MINIMAL = "minimal"
    LAZY = "lazy"
    OFF = "off"


def parse_graph_preset(value: str | GraphPreset) -> GraphPreset:
    """A GraphPreset from its name; unknown names raise and list the valid ones."""
    return parse_choice(GraphPreset, value, "cuda_graph_preset", "presets")
