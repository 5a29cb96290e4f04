"""The sizes of the random-weight files the GPT-SoVITS makers write (test and benchmark tools)."""

from __future__ import annotations

from enum import StrEnum

from voicehub.choices import parse_choice


class Size(StrEnum):
    TINY = "tiny"  # the real tensor names and interface widths, small elsewhere: CPU tests in seconds
    FULL = "full"  # the published checkpoints' sizes: GPU benchmarks


SIZES = tuple(size.value for size in Size)


def parse_size(size: str | Size) -> Size:
    """A Size from its name; unknown names raise ValueError listing tiny, full."""
    return parse_choice(Size, size, "size")
