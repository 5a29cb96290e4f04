"""Checks for caller-provided output buffers (static buffers of a captured graph, test poison)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def check_out(out: torch.Tensor, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """`out` itself, after checking it is a contiguous tensor of `shape` and `dtype`."""
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype or not out.is_contiguous():
        raise ValueError(
            f"out must be a contiguous {dtype} tensor of shape {tuple(shape)}; "
            f"got {out.dtype} {tuple(out.shape)} (contiguous: {out.is_contiguous()})"
        )
    return out
