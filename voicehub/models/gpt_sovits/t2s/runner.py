"""The T2S decoder on the GPU: the static decoder's step replayed from CUDA graphs.

One `T2SGraphDecoder` per loaded GPT checkpoint owns the GPU state of its decodes: the KV cache,
sampling buffers, per-row state, the device RNG and the graphs of `decode_step`, one per
(KV bucket, batch bucket, drop_eos) key, all in one memory pool. A sequence that outgrows a KV
bucket moves to the next graph in place (the cache is shared); beyond the largest bucket the
request is refused before it starts (`StaticDecodeConfig.max_seq_len`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields

import torch

from voicehub.models.gpt_sovits.t2s.model import T2SModel
from voicehub.models.gpt_sovits.t2s.static import StaticDecodeConfig, StepKernels, T2SStaticDecoder
from voicehub.runtime.cuda_graphs import BucketedGraphRunner, GraphPreset, parse_graph_preset

GraphKey = tuple[int, int, bool]  # (batch rows, KV slots, drop_eos)


class T2SGraphDecoder(T2SStaticDecoder):
    """`decode(requests)` with the same results as T2SStaticDecoder, each step a graph replay.

    preset: `full` captures every key at construction, `minimal` the common ones (one row, the
    smallest KV bucket, both EOS phases), `lazy` each key on first use, `off` runs eagerly.
    """

    def __init__(self, model: T2SModel, engine: StaticDecodeConfig | None = None, preset: str = "full"):
        super().__init__(model, engine)
        self.preset = parse_graph_preset(preset)
        keys = [
            (n_rows, n_slots, drop)
            for n_rows in self.engine.row_buckets
            for n_slots in self.engine.buckets
            for drop in (True, False)
        ]
        common = [(self.engine.row_buckets[0], self.engine.buckets[0], drop) for drop in (True, False)]
        self.graphs = BucketedGraphRunner(
            self._graph_step,
            keys,
            self.preset,
            self.device,
            common_buckets=common,
            generators=[self.generator],
            preserve=self.state_kept,
        )
        self._capture_at_load()

    @contextmanager
    def state_kept(self) -> Iterator[None]:
        """Within it, decode steps leave no trace: per-row state, sampling buffers, KV lengths and
        the RNG are put back after. Capture warm-ups run real steps, and a capture on first use
        (lazy, minimal) happens mid-decode. K/V contents are not saved: a step writes its K/V at
        slot `lengths` before reading it, so the next real step overwrites what a warm-up wrote."""
        tensors = self._step_written()
        saved = [t.clone() for t in tensors]
        rng = self.generator.get_state()
        try:
            yield
        finally:
            for tensor, copy in zip(tensors, saved):
                tensor.copy_(copy)
            self.generator.set_state(rng)

    def _step_written(self) -> list[torch.Tensor]:
        state = [getattr(self.state, f.name) for f in fields(self.state)]
        return [*state, *(getattr(self.buf, f.name) for f in fields(self.buf)), self.cache.lengths]

    def _capture_at_load(self) -> None:
        if self.preset in (GraphPreset.FULL, GraphPreset.MINIMAL):
            self._reset()  # capture warm-ups run real steps on whatever the buffers hold
            self.graphs.capture_at_load()
            self._reset()

    def set_step_kernels(self, kernels: StepKernels) -> StepKernels:
        """Use `kernels` from now on: the captured graphs hold the old functions, so they are dropped
        and captured again as the preset says (full/minimal now, the rest on first use)."""
        previous = super().set_step_kernels(kernels)
        self.graphs.reset()
        self._capture_at_load()
        return previous

    def _graph_step(self, key: GraphKey) -> None:
        n_rows, n_slots, drop_eos = key
        super().step(n_rows, n_slots, drop_eos)

    def step(self, n_rows: int, n_slots: int, drop_eos: bool) -> None:
        self.graphs.run((n_rows, n_slots, drop_eos))
