"""How the CFM solver walks from noise (t=0) to mel (t=1): the step sizes and the DiT step cache.

A DiT instance holds one `Schedule` (`DiT.schedule`, `uniform_steps` unless an optimization swaps
it) and at most one `StepCache` (`DiT.step_cache`); `solver.solve` reads both. Each is decided from
the step count alone, in Python, so a fixed-step solve has no branch on tensor values and stays
graph-capturable.

Why the dyadic schedule: v3's CFM is a shortcut model. Its step-size input `d` was trained on
0 and on 1/2, 1/4, ..., 1/64 (upstream `CFM.forward`: `dt = 2 * d`, `d = 1 / 2**randint(2, 8)`), so
it can take large steps late in the flow, where the trajectory is nearly straight, while the first
steps out of the noise keep the requested resolution.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

Schedule = Callable[[int], tuple[float, ...]]  # requested steps -> the step sizes taken (sum 1)
_END = 1e-9  # what counts as having reached t=1 in float arithmetic


def uniform_steps(n_steps: int) -> tuple[float, ...]:
    """Upstream's schedule: `n_steps` equal steps of 1/n_steps."""
    return (1 / n_steps,) * n_steps


def dyadic_steps(n_steps: int) -> tuple[float, ...]:
    """Fewer steps for the same finest resolution: the first step is 1/n_steps, each later one as long
    as the time so far (so t doubles: 1/n, 2/n, 4/n, ...), the last one capped at what remains.

    4 requested -> 3 steps (1/4, 1/4, 1/2); 8 -> 4; 16 -> 5; 32 -> 6. 1 to 3 requested take the same
    number of steps as the uniform schedule.
    """
    first = 1 / n_steps
    steps, t = [first], first
    while t < 1 - _END:
        step = min(t, 1 - t)
        steps.append(step)
        t += step
    return tuple(steps)


@dataclass(frozen=True)
class StepCache:
    """Reuse the deep DiT blocks' work across neighbouring steps.

    On a refresh step the DiT runs every block and keeps the residual that blocks[start:] added to
    the hidden state; on the `interval - 1` steps after it, it runs blocks[:start] only and adds the
    kept residual instead of running the rest. `start` is `start_fraction` of the depth (at least 1:
    the first block always sees the current step's input). The first step always refreshes.
    """

    interval: int = 2
    start_fraction: float = 0.5

    def __post_init__(self) -> None:
        if self.interval < 1:
            raise ValueError(f"StepCache interval must be >= 1 (1 never reuses), got {self.interval}")
        if not 0 < self.start_fraction < 1:
            raise ValueError(f"StepCache start_fraction must be in (0, 1), got {self.start_fraction}")

    def start_block(self, depth: int) -> int:
        return min(max(1, round(depth * self.start_fraction)), depth)

    def reuses(self, n_steps: int) -> tuple[bool, ...]:
        """Per step: True where the kept residual stands in for blocks[start:]."""
        return tuple(k % self.interval != 0 for k in range(n_steps))


@dataclass
class BlockReuse:
    """One solve's cache state: the residual of blocks[start:] from the last refresh step.

    `is_reusing` is set by the solver before each step; the DiT reads it and fills `residual`.
    """

    start: int
    is_reusing: bool = False
    residual: torch.Tensor | None = None  # [B, N, dim]
