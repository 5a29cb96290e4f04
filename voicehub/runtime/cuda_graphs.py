"""CUDA-graph capture over shape buckets, knowing nothing of any model.

A step is a callable of static tensors (same storage every call) and a static bucket key (any
hashable: a sequence-length bucket, a (KV bucket, batch bucket, flag) tuple...). The runner captures it once per bucket, all graphs sharing one
memory pool, and replays: the caller copies inputs into the static buffers, replays, reads the
static outputs. Presets decide when capture happens: `full` (every bucket at load), `minimal`
(the common buckets at load, the rest on first use), `lazy` (each on first use), `off` (eager
calls, no capture).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from dataclasses import dataclass
from typing import Any

import torch

from voicehub.runtime.graph_presets import GraphPreset, parse_graph_preset

__all__ = ["BucketedGraphRunner", "GraphPreset", "parse_graph_preset"]


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    outputs: Any


@contextmanager
def capturing(graph: torch.cuda.CUDAGraph, pool: Any, stream: torch.cuda.Stream) -> Iterator[None]:
    """Capture what the body launches into `graph` on `stream` (which first waits for the current
    stream), into the memory `pool` (None: a new one). `torch.cuda.graph` does the same after a device
    synchronize and an emptying of the allocator's caches (device and pinned host) before every
    capture: a load capturing dozens of graphs paid each time for the caches' frees and for the
    allocations that refilled them next (~15 ms a capture). The body's error is the one raised (an
    interrupted capture's own error on ending it is then secondary)."""
    stream.wait_stream(torch.cuda.current_stream(stream.device))
    with torch.cuda.stream(stream):
        graph.capture_begin(*(() if pool is None else (pool,)), capture_error_mode="global")
        try:
            yield
        except BaseException:
            with suppress(RuntimeError):
                graph.capture_end()
            raise
        graph.capture_end()


class GraphBudget:
    """What a bounded cache of graphs holds: its keys (captured, or being captured), its limit, and the
    keys it said run eagerly (each said once). The acoustic caches (encoder, vocoder) share it."""

    def __init__(self, max_graphs: int):
        self.max_graphs = max_graphs
        self.keys: set[Hashable] = set()
        self._refused: set[Hashable] = set()

    def why_eager(self, key: Hashable, too_long: bool, say: Callable[[str], None]) -> str | None:
        """None when `key` replays a graph (held, or in range with room for it); else 'too_long' or
        'graph_limit', calling `say(reason)` the first time `key` is refused."""
        if key in self.keys:
            return None
        if not too_long and len(self.keys) < self.max_graphs:
            return None
        reason = "too_long" if too_long else "graph_limit"
        if key not in self._refused:
            self._refused.add(key)
            say(reason)
        return reason


class BucketedGraphRunner:
    """Owns the graphs of one step function over `buckets`.

    step(bucket) -> outputs: reads and writes only static tensors the owner allocated once, so
    replays see the caller's latest inputs. `warmup_calls` eager calls on a side stream precede
    each capture, as CUDA graph capture requires (lazy cuBLAS/cuDNN initialisation must be done);
    they run the step for real, so the owner resets its state after capture at load. One is enough:
    what a first call sets up (cuBLAS workspaces, cuDNN plans, with `cudnn.benchmark` its algorithm
    search, Triton's compiled kernels, the owner's lazily made buffers) is there for the next, and a
    second call costs its eager host and GPU time again (~1 s over a GPT-SoVITS load's captures).
    generators: device RNGs the step draws from; registered with every graph so each replay
    advances them as an eager call would (and reseeding them between replays takes effect).
    preserve: a context-manager factory wrapped around the warm-up calls, for owners whose step
    has side effects that a capture on first use (mid-run) must not leave behind.
    """

    def __init__(
        self,
        step: Callable[[Hashable], Any],
        buckets: Sequence[Hashable],
        preset: GraphPreset | str,
        device: torch.device,
        common_buckets: Sequence[Hashable] = (),
        warmup_calls: int = 1,
        generators: Sequence[torch.Generator] = (),
        preserve: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ):
        self.step = step
        self.preserve = preserve
        self.generators = tuple(generators)
        self.buckets = list(dict.fromkeys(buckets))
        self.preset = parse_graph_preset(preset)
        self.device = device
        self.warmup_calls = warmup_calls
        if self.preset is not GraphPreset.OFF and device.type != "cuda":
            raise ValueError(
                f"cuda_graph_preset={self.preset.value!r} needs a CUDA device; use 'off' on {device}"
            )
        self._graphs: dict[Hashable, _Captured] = {}
        self._pool: Any = None
        unknown = [b for b in common_buckets if b not in self.buckets]
        if unknown:
            raise ValueError(f"common buckets {unknown} are not among the buckets {self.buckets}")
        self.common_buckets = list(common_buckets) or self.buckets[:1]

    def capture_at_load(self) -> None:
        """Capture what the preset captures at load time; keys captured already (on first use) are kept."""
        if self.preset is GraphPreset.FULL:
            todo = self.buckets
        elif self.preset is GraphPreset.MINIMAL:
            todo = self.common_buckets
        else:
            todo = []
        for bucket in todo:
            if bucket not in self._graphs:
                self._capture(bucket)

    @property
    def captured_buckets(self) -> list[Hashable]:
        return [b for b in self.buckets if b in self._graphs]

    @property
    def n_captured(self) -> int:
        """How many graphs are held (cheap: for counters read every round)."""
        return len(self._graphs)

    def _capture(self, bucket: Hashable) -> _Captured:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side), self.preserve():
            for _ in range(self.warmup_calls):
                self.step(bucket)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        for gen in self.generators:
            graph.register_generator_state(gen)
        with capturing(graph, self._pool, side):
            outputs = self.step(bucket)
        if self._pool is None:
            self._pool = graph.pool()
        captured = _Captured(graph, outputs)
        self._graphs[bucket] = captured
        return captured

    def run(self, bucket: Hashable) -> Any:
        """Replay the graph of `bucket` (capturing it first if the preset allows), or call eagerly when off."""
        if self.preset is GraphPreset.OFF:
            return self.step(bucket)
        captured = self._graphs.get(bucket)
        if captured is None:
            if bucket not in self.buckets:
                raise ValueError(f"bucket {bucket} is not one of {self.buckets}")
            captured = self._capture(bucket)
        captured.graph.replay()
        return captured.outputs

    def reset(self) -> None:
        """Drop every graph and the pool (for example before the weights change)."""
        self._graphs.clear()
        self._pool = None
