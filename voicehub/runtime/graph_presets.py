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


AUTO = "auto"  # what a load that names no preset gets: `default_graph_preset` for its device


def default_graph_preset(device_type: str) -> GraphPreset:
    """The preset of a load that names none: `minimal` on CUDA (the common buckets captured at load,
    the rest on first use: no first-request penalty for common requests, the least memory and start-up
    time of the capturing presets), `off` elsewhere (no CUDA graphs without CUDA)."""
    return GraphPreset.MINIMAL if device_type == "cuda" else GraphPreset.OFF


def resolve_graph_preset(value: str | GraphPreset | None, device_type: str) -> GraphPreset:
    """`value` parsed; None or 'auto' give `default_graph_preset(device_type)`."""
    if value is None or value == AUTO:
        return default_graph_preset(device_type)
    try:
        return parse_graph_preset(value)
    except ValueError as exc:
        raise ValueError(f"{exc}, or {AUTO} (minimal on CUDA, off elsewhere)") from None
