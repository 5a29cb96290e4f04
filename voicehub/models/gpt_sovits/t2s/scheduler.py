"""Continuous batching for the T2S decoder: rows that join and leave between steps.

`T2SRowEngine` is the T2S side of `voicehub.runtime.scheduler.ContinuousScheduler`: the static
decoder's KV cache, sampling buffers and per-row state, where each row holds its own request from
admission to release, with its own length, position, sampling parameters, stop state and random
stream. A step runs every row in [0, n_rows) against the smallest KV bucket that holds the longest
busy row; rows that finished (or are free) ride along harmlessly (`done` rows do not advance).

Random streams are per row (`voicehub.runtime.row_rng`): the noise of a row's k-th draw is a hash
of (its seed, k, vocab index), so its tokens do not depend on which rows share its steps. That is
not upstream's `torch.manual_seed` stream, so a fixed seed gives other tokens than the
single-stream decoders (`T2SStaticDecoder.decode`, `decode.decode`), which keep upstream's stream;
greedy tokens are the same on every path. EOS is masked (never sliced off) in the blocked steps so
every draw is the full vocabulary wide.
"""

from __future__ import annotations

import secrets
from dataclasses import fields

import torch

from voicehub.models.gpt_sovits.t2s.decode import DecodeResult
from voicehub.models.gpt_sovits.t2s.model import T2SModel
from voicehub.models.gpt_sovits.t2s.static import (
    DecodeState,
    StaticDecodeConfig,
    StepKernels,
    T2SRequest,
    T2SStaticDecoder,
    decode_step,
    sample_step,
)
from voicehub.runtime.cuda_graphs import BucketedGraphRunner, GraphPreset, parse_graph_preset
from voicehub.runtime.kv_cache import pick_bucket
from voicehub.runtime.row_rng import exponential_noise, row_keys, split_seed, vocab_keys
from voicehub.runtime.sampling import SamplingBuffers
from voicehub.runtime.scheduler import RowUpdate

GraphKey = tuple[int, int]  # (batch rows, KV slots)


class T2SRowEngine(T2SStaticDecoder):
    """Rows of one T2S model's static state, admitted and released one at a time.

    preset: `full` captures a graph per (batch bucket, KV bucket) at construction; `off` steps
    eagerly. `minimal` and `lazy` are refused: capturing on first use runs warm-up steps on live
    rows. Do not mix with the inherited batch `decode` while rows are busy (same buffers).
    padded_prefill: admit prompts through `PaddedPrefill` (one row at a time into its row; graphs of
    every length bucket captured at construction under `full`); None: exactly when the preset is full.
    """

    def __init__(
        self,
        model: T2SModel,
        engine: StaticDecodeConfig | None = None,
        preset: str = "off",
        padded_prefill: bool | None = None,
    ):
        super().__init__(model, engine)
        self.preset = parse_graph_preset(preset)
        if self.preset in (GraphPreset.MINIMAL, GraphPreset.LAZY):
            raise ValueError(
                f"cuda_graph_preset={self.preset.value!r}: the continuous engine captures at load "
                "only; use 'full' (CUDA) or 'off'"
            )
        n = self.engine.max_batch
        self.seed_lo = torch.zeros(n, dtype=torch.long, device=self.device)
        self.seed_hi = torch.zeros(n, dtype=torch.long, device=self.device)
        self.vocab = vocab_keys(model.config.vocab_size, self.device)
        self._one = torch.arange(1, device=self.device)
        # host bookkeeping per busy row: prompt length, step limit, decode steps run, tokens emitted
        self._n_prompt: dict[int, int] = {}
        self._limit: dict[int, int] = {}
        self._n_stepped: dict[int, int] = {}
        self._n_emitted: dict[int, int] = {}
        self._reset()  # every row free (done, length 0)
        if padded_prefill is None:
            padded_prefill = self.preset is GraphPreset.FULL
        if padded_prefill:  # a prefill writes only its own row: capturing it with rows busy is harmless
            self.use_padded_prefill(self.preset)
        keys = [(r, s) for r in self.engine.row_buckets for s in self.engine.buckets]
        self.graphs = BucketedGraphRunner(self._graph_step, keys, self.preset, self.device)
        self._capture()

    def _capture(self) -> None:
        if self.preset is GraphPreset.FULL:
            self.graphs.capture_at_load()  # warm-ups step free rows only: harmless
            if self.prefill is not None:  # independent of the step kernels: captured once
                self.prefill.capture_at_load()
            self._reset()

    def set_step_kernels(self, kernels: StepKernels) -> StepKernels:
        """Use `kernels` from now on; the graphs are captured again, so no row may be busy."""
        if self._n_prompt:
            raise RuntimeError(f"rows {sorted(self._n_prompt)} are busy; change step kernels while idle")
        previous = super().set_step_kernels(kernels)
        self.graphs.reset()
        self._capture()
        return previous

    # -- RowEngine protocol -------------------------------------------------------------------

    @property
    def max_rows(self) -> int:
        return self.engine.max_batch

    @property
    def row_buckets(self) -> tuple[int, ...]:
        return self.engine.row_buckets

    @property
    def stop_check_interval(self) -> int:
        return self.engine.stop_check_interval

    def check(self, request: T2SRequest) -> None:
        if not self.fits(request):
            raise ValueError(
                f"request needs up to {self.slots_needed(request)} KV slots, the static cache holds "
                f"{self.engine.max_seq_len}; raise StaticDecodeConfig.max_seq_len or lower max_new_tokens"
            )

    @torch.inference_mode()
    def admit(self, row: int, request: T2SRequest) -> None:
        """Prefill `request` into `row` only and draw its first token (step 0) from its own stream."""
        assert row not in self._n_prompt, f"row {row} is busy"
        self.check(request)
        st = self.state
        for t in (st.tokens, st.step, st.stop_step):
            t[row] = 0
        st.stop_eos[row] = False
        first, n_prompt, limit = self._load_row(row, request)
        seed = request.params.seed if request.params.seed is not None else secrets.randbits(64)
        self.seed_lo[row], self.seed_hi[row] = split_seed(seed)
        one = slice(row, row + 1)
        view = DecodeState(**{f.name: getattr(st, f.name)[one] for f in fields(st)} | {"rows": self._one})
        buf = SamplingBuffers(*(getattr(self.buf, f.name)[one] for f in fields(self.buf)))
        noise = exponential_noise(row_keys(self.seed_lo[one], self.seed_hi[one], view.step), self.vocab)
        sample_step(self.model, view, first.unsqueeze(0), buf, None, False, noise)
        self._n_prompt[row], self._limit[row] = n_prompt, limit
        self._n_stepped[row], self._n_emitted[row] = 0, 0

    @torch.inference_mode()
    def step(self, n_rows: int) -> None:
        """One token for every live row in [0, n_rows), against the bucket of the longest busy row."""
        busy = [r for r in self._n_prompt if r < n_rows]
        # a row's next write goes to slot n_prompt + steps; it never passes n_prompt + limit - 1
        need = max(
            (self._n_prompt[r] + min(self._n_stepped[r], self._limit[r] - 1) + 1 for r in busy), default=1
        )
        self.graphs.run((n_rows, pick_bucket(need, self.engine.buckets)))
        for r in busy:
            self._n_stepped[r] += 1

    def _graph_step(self, key: GraphKey) -> None:
        """The captured unit: per-row noise from (seed, step), then `decode_step` over n_rows rows."""
        n_rows, n_slots = key
        state = self.state.narrow(n_rows)
        noise = exponential_noise(
            row_keys(self.seed_lo[:n_rows], self.seed_hi[:n_rows], state.step), self.vocab
        )
        decode_step(
            self.model,
            self.cache.narrow(n_rows),
            state,
            self.buf.narrow(n_rows),
            None,
            n_slots,
            False,
            noise,
            kernels=self.kernels.for_rows(),  # the many-row stack, if the kernels have one
        )

    @torch.inference_mode()
    def poll(self, rows: list[int]) -> dict[int, RowUpdate]:
        """Two small device reads for all rows: the stop state, then the new columns of `out`."""
        if not rows:
            return {}
        n, st = max(rows) + 1, self.state
        meta = torch.stack([st.step[:n], st.done[:n].long(), st.stop_step[:n], st.stop_eos[:n].long()]).cpu()
        ends = {}
        for r in rows:
            step, is_done, stop_step, stop_eos = meta[:, r].tolist()
            # stream what the final result keeps: up to EOS (excluded), else through the last draw
            ends[r] = (stop_step if stop_eos else stop_step + 1) if is_done else step
        lo = min(self._n_emitted[r] for r in rows)
        hi = max(max(ends.values()), lo)
        block = st.out[:n, lo:hi].cpu()
        updates = {}
        for r in rows:
            start, end = self._n_emitted[r], max(ends[r], self._n_emitted[r])
            updates[r] = RowUpdate(block[r, start - lo : end - lo].tolist(), bool(meta[1, r]))
            self._n_emitted[r] = end
        return updates

    @torch.inference_mode()
    def result(self, row: int) -> DecodeResult:
        """The row's DecodeResult, as the static decoder builds it (upstream's trimming included:
        a row stopped by the cap drops its first token, which the stream had already sent)."""
        return self._result(row)

    @torch.inference_mode()
    def release(self, row: int) -> None:
        """Free the row: done, length 0 (its old KV is masked out), host bookkeeping dropped."""
        self.state.done[row] = True
        self.cache.reset_row(row)
        for table in (self._n_prompt, self._limit, self._n_stepped, self._n_emitted):
            table.pop(row, None)
