"""Continuous batching for the T2S decoder: rows that join and leave between steps.

`T2SRowEngine` is the T2S side of `voicehub.runtime.scheduler.ContinuousScheduler`: the static
decoder's KV cache, sampling buffers and per-row state, where each row holds its own request from
admission to release, with its own length, position, sampling parameters, stop state and random
stream. A step runs every row in [0, n_rows) against the smallest KV bucket that holds the longest
busy row; rows that finished (or are free) ride along harmlessly (`done` rows do not advance).

Host work per round is kept off the device's critical path:
- admission is batched: prompts of one length bucket are prefilled PREFILL_ROWS at a time (`PaddedPrefill.
  load_padded`, one graph per length bucket; a call is padded with copies of its last prompt, so every
  prompt runs at the same shape whatever joins with it), host tensors reach the device through pinned
  memory (no wait for the device's queue), and the first draws, the rows' state and sampling
  parameters are written for all admitted rows at once;
- a snapshot gathers, on the device, each row's tokens since the previous snapshot and its stop state
  into one small tensor copied to pinned host memory behind an event; `collect` waits for that event
  only. The final result is built on the host from the collected tokens (no read of `out`).
The host keeps per row what it can know without reading the device (prompt length, step limit, steps
run), which sizes the KV bucket, the snapshot window and the steps a round still needs.

Random streams are per row (`voicehub.runtime.row_rng`): the noise of a row's k-th draw is a hash
of (its seed, k, vocab index), so its tokens do not depend on which rows share its steps. That is
not upstream's `torch.manual_seed` stream, so a fixed seed gives other tokens than the
single-stream decoders (`T2SStaticDecoder.decode`, `decode.decode`), which keep upstream's stream;
greedy tokens are the same on every path. EOS is masked (never sliced off) in the blocked steps so
every draw is the full vocabulary wide.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field, fields

import torch

from voicehub.models.gpt_sovits.t2s.decode import DecodeResult
from voicehub.models.gpt_sovits.t2s.model import T2SModel
from voicehub.models.gpt_sovits.t2s.prefill import PaddedPrefill, to_device
from voicehub.models.gpt_sovits.t2s.static import (
    PROMPT_ROOM,
    DecodeState,
    StaticDecodeConfig,
    StepKernels,
    T2SRequest,
    decode_step,
    sample_step,
    stopped_result,
)
from voicehub.models.gpt_sovits.t2s.static_decoder import T2SStaticDecoder
from voicehub.runtime.cuda_graphs import BucketedGraphRunner, GraphPreset, parse_graph_preset
from voicehub.runtime.kv_cache import pick_bucket
from voicehub.runtime.row_rng import row_noise, split_seed, vocab_keys
from voicehub.runtime.sampling import TEMPERATURE_FLOOR, SamplingBuffers
from voicehub.runtime.scheduler import RowUpdate

GraphKey = tuple[int, int]  # (batch rows, KV slots)
# Prompts per padded prefill call; every call runs at this row count (padded with copies), so a prompt's
# K/V and first logits do not depend on how many prompts join with it. 8 prompts of the 256-position
# bucket are ~2k positions a call: large GEMMs, one graph replay per 8 streams admitted.
PREFILL_ROWS = 8


@dataclass
class _Row:
    """Host bookkeeping of a busy row: what the host knows without reading the device."""

    n_prompt: int  # prompt positions (its KV length after the prefill)
    limit: int  # most tokens it can draw (the first one at admission)
    is_forced: bool
    generation: int  # which admission holds the row (snapshots of an earlier one are skipped)
    n_stepped: int = 0  # decode steps run since admission
    n_snapped: int = 0  # tokens the snapshots taken so far cover, while the row is live
    tokens: list[int] = field(default_factory=list)  # tokens collected so far (out[:len])


@dataclass
class RowSnapshot:
    """Taken by `snapshot`: host [n, 4 + width] long (start, end, done, stop_eos, then the tokens out[start:
    start + width] of each row in [0, n)), filled once `ready` has passed (None: already filled)."""

    rows: list[tuple[int, int]]  # (row, generation)
    width: int
    host: torch.Tensor
    ready: torch.cuda.Event | None


class T2SRowEngine(T2SStaticDecoder):
    """Rows of one T2S model's static state, admitted (in batches) and released one at a time.

    preset: `full` captures a graph per (batch bucket, KV bucket) at construction; `off` steps
    eagerly. `minimal` and `lazy` are refused: capturing on first use runs warm-up steps on live
    rows. Do not mix with the inherited batch `decode` while rows are busy (same buffers).
    round_graphs: also a graph of stop_check_interval steps per key (`step_round`: a whole round in one
    replay where every step of it runs at the same KV bucket, the same steps the single-step graphs run;
    ~interval times the capture work at load). Off by default.
    padded_prefill: admit prompts through `PaddedPrefill` (prefill_rows prompts a call, each call into its
    own rows; graphs of every length bucket captured at construction under `full`); None: exactly when
    the preset is full.
    """

    def __init__(
        self,
        model: T2SModel,
        engine: StaticDecodeConfig | None = None,
        preset: str = "off",
        padded_prefill: bool | None = None,
        prefill_rows: int = PREFILL_ROWS,
        round_graphs: bool = False,
    ):
        super().__init__(model, engine)
        self.preset = parse_graph_preset(preset)
        if self.preset in (GraphPreset.MINIMAL, GraphPreset.LAZY):
            raise ValueError(
                f"cuda_graph_preset={self.preset.value!r}: the continuous engine captures at load "
                "only; use 'full' (CUDA) or 'off'"
            )
        if prefill_rows < 1:
            raise ValueError(f"prefill_rows must be >= 1, got {prefill_rows}")
        n = self.engine.max_batch
        self.seed_lo = torch.zeros(n, dtype=torch.long, device=self.device)
        self.seed_hi = torch.zeros(n, dtype=torch.long, device=self.device)
        self.snap_from = torch.zeros(n, dtype=torch.long, device=self.device)  # first token not snapshotted
        self.vocab = vocab_keys(model.config.vocab_size, self.device)
        self._arange = torch.arange(max(n, self.state.out.shape[1]), device=self.device)
        self._rows: dict[int, _Row] = {}  # busy rows
        self._n_admitted = 0
        self.n_snapshots = 0  # snapshots collected: the engine's host reads of the device
        self._reset()  # every row free (done, length 0)
        if padded_prefill is None:
            padded_prefill = self.preset is GraphPreset.FULL
        if padded_prefill:  # a prefill writes only its own rows: capturing it with rows busy is harmless
            rows = min(prefill_rows, n)  # an engine of fewer rows prefills them all in one call
            self.prefill = PaddedPrefill(model, self.cache, PROMPT_ROOM, self.preset, row_counts=(rows,))
        keys = [(r, s) for r in self.engine.row_buckets for s in self.engine.buckets]
        self.graphs = BucketedGraphRunner(self._graph_step, keys, self.preset, self.device)
        self.rounds = (
            BucketedGraphRunner(self._graph_round, keys, self.preset, self.device) if round_graphs else None
        )
        self._capture()

    def _capture(self) -> None:
        if self.preset is GraphPreset.FULL:
            self.graphs.capture_at_load()  # warm-ups step free rows only: harmless
            if self.rounds is not None:
                self.rounds.capture_at_load()
            if self.prefill is not None:  # independent of the step kernels: captured once
                self.prefill.capture_at_load()
            self._reset()

    def set_step_kernels(self, kernels: StepKernels) -> StepKernels:
        """Use `kernels` from now on; the graphs are captured again, so no row may be busy."""
        if self._rows:
            raise RuntimeError(f"rows {sorted(self._rows)} are busy; change step kernels while idle")
        previous = super().set_step_kernels(kernels)
        self.graphs.reset()
        if self.rounds is not None:
            self.rounds.reset()
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

    def admit(self, row: int, request: T2SRequest) -> None:
        """`admit_rows` of one request."""
        self.admit_rows([row], [request])

    @torch.inference_mode()
    def admit_rows(self, rows: list[int], requests: list[T2SRequest]) -> None:
        """Prefill each request into its free row (no other row is touched) and draw its first token
        (step 0) from its own stream. No read of the device."""
        assert len(rows) == len(requests) and len(set(rows)) == len(rows), "one request per distinct row"
        busy = [r for r in rows if r in self._rows]
        assert not busy, f"rows {busy} are busy"
        for request in requests:
            self.check(request)
        first = self._prefill_rows(rows, requests)
        self._start_rows(rows, requests, first)
        for row, req in zip(rows, requests):
            self._n_admitted += 1
            n_prompt = req.phone_ids.shape[0] + req.prompt_tokens.shape[0]
            is_forced = req.params.force_n_tokens is not None
            self._rows[row] = _Row(n_prompt, self._step_limit(req.params)[1], is_forced, self._n_admitted)

    def steps_left(self, row: int) -> int:
        rec = self._rows[row]
        return max(rec.limit - 1 - rec.n_stepped, 0)

    @torch.inference_mode()
    def step(self, n_rows: int) -> None:
        """One token for every live row in [0, n_rows), against the bucket of the longest busy row."""
        busy = [rec for r, rec in self._rows.items() if r < n_rows]
        self.graphs.run((n_rows, self._bucket(busy, 0)))
        for rec in busy:
            rec.n_stepped += 1

    @torch.inference_mode()
    def step_round(self, n_rows: int, n_steps: int) -> None:
        """n_steps `step`s: with round graphs, a round of stop_check_interval steps whose KV bucket is the same
        for all of them (the first step's is the last's) is one replay of the round's graph; else step by step."""
        if self.rounds is not None and n_steps == self.stop_check_interval:
            busy = [rec for r, rec in self._rows.items() if r < n_rows]
            bucket = self._bucket(busy, 0)
            if self._bucket(busy, n_steps - 1) == bucket:
                self.rounds.run((n_rows, bucket))
                for rec in busy:
                    rec.n_stepped += n_steps
                return
        for _ in range(n_steps):
            self.step(n_rows)

    def _bucket(self, busy: list[_Row], ahead: int) -> int:
        """The KV bucket of the step `ahead` steps from now: the busy rows' longest next write holds. A row's
        next write goes to slot n_prompt + steps; it never passes n_prompt + limit - 1."""
        need = max((rec.n_prompt + min(rec.n_stepped + ahead, rec.limit - 1) + 1 for rec in busy), default=1)
        return pick_bucket(need, self.engine.buckets)

    def _graph_step(self, key: GraphKey) -> None:
        """The captured unit: per-row noise from (seed, step), then `decode_step` over n_rows rows."""
        n_rows, n_slots = key
        state = self.state.narrow(n_rows)
        noise = self._noise(self.seed_lo[:n_rows], self.seed_hi[:n_rows], state.step)
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

    def _graph_round(self, key: GraphKey) -> None:
        """The captured round: stop_check_interval `_graph_step`s at one key."""
        for _ in range(self.stop_check_interval):
            self._graph_step(key)

    def _noise(self, seed_lo: torch.Tensor, seed_hi: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        """The rows' noise for this step: the ROW_NOISE op of the step kernels, else its torch definition."""
        return (self.kernels.row_noise or row_noise)(seed_lo, seed_hi, step, self.vocab)

    @torch.inference_mode()
    def snapshot(self, rows: list[int]) -> RowSnapshot:
        """Gather each row's new tokens and stop state on the device and start the copy to the host.
        `rows` must hold every row still decoding (the device's read mark moves for every row below the
        highest one, so a live row left out would lose its tokens); only finished rows may be left out."""
        recs = [(r, self._rows[r]) for r in rows]
        width = max((1 + rec.n_stepped - rec.n_snapped for _, rec in recs), default=0)
        n, st = max(rows, default=-1) + 1, self.state
        start = self.snap_from[:n]
        # what a stream keeps: up to EOS (excluded), else through the last draw
        end = torch.where(st.done[:n], st.stop_step[:n] + (~st.stop_eos[:n]).long(), st.step[:n])
        cols = (start[:, None] + self._arange[:width]).clamp(max=st.out.shape[1] - 1)
        flags = torch.stack([start, end, st.done[:n].long(), st.stop_eos[:n].long()], dim=1)
        payload = torch.cat([flags, st.out[:n].gather(1, cols)], dim=1)
        self.snap_from[:n].copy_(end)
        for _, rec in recs:
            rec.n_snapped = 1 + rec.n_stepped  # the device's end of a live row
        ready = None
        if payload.is_cuda:
            host = torch.empty(payload.shape, dtype=payload.dtype, pin_memory=True)
            host.copy_(payload, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
            payload = host
        return RowSnapshot([(r, rec.generation) for r, rec in recs], width, payload, ready)

    def collect(self, snapshot: RowSnapshot) -> dict[int, RowUpdate]:
        """Wait for a snapshot (its event only) and read it: rows released or admitted again since it
        was taken are left out. Snapshots of a row must be collected in the order they were taken."""
        if snapshot.ready is not None:
            snapshot.ready.synchronize()
        data = snapshot.host.tolist()
        self.n_snapshots += 1
        updates = {}
        for row, generation in snapshot.rows:
            rec = self._rows.get(row)
            if rec is None or rec.generation != generation:
                continue
            start, end, is_done, stop_eos = data[row][:4]
            assert start == len(rec.tokens) and end - start <= snapshot.width, (
                row,
                start,
                end,
                snapshot.width,
            )
            tokens = data[row][4 : 4 + max(end - start, 0)]
            rec.tokens += tokens
            # the final result from the collected tokens (out[:end]; an EOS stop's end is its EOS step)
            stop_step = end if stop_eos else end - 1
            result = stopped_result(rec.tokens, stop_step, rec.is_forced, bool(stop_eos)) if is_done else None
            updates[row] = RowUpdate(tokens, bool(is_done), result)
        return updates

    def poll(self, rows: list[int]) -> dict[int, RowUpdate]:
        """A snapshot of `rows`, read at once."""
        return self.collect(self.snapshot(rows))

    @torch.inference_mode()
    def result(self, row: int) -> DecodeResult:
        """The row's DecodeResult read from the device, as the static decoder builds it (upstream's
        trimming included: a row stopped by the cap drops its first token, which the stream had sent)."""
        return self._result(row)

    @torch.inference_mode()
    def release(self, row: int) -> None:
        """Free the row: done, length 0 (its old KV is masked out), host bookkeeping dropped."""
        self.state.done[row : row + 1] = True  # a slice: done[row] = True would wait for the device
        self.cache.reset_row(row)
        self._rows.pop(row, None)

    # -- admission --------------------------------------------------------------------------------

    def _prefill_rows(self, rows: list[int], requests: list[T2SRequest]) -> torch.Tensor:
        """Each prompt's K/V into its row, lengths set; returns the first logits [len(rows), V]. Prompts
        within the padded prefill's room go prefill_rows at a time per length bucket, the rest eagerly."""
        first: list[torch.Tensor | None] = [None] * len(rows)
        groups: dict[int, list[int]] = {}  # length bucket -> requests
        for i, (row, req) in enumerate(zip(rows, requests)):
            n_prompt = req.phone_ids.shape[0] + req.prompt_tokens.shape[0]
            if self.prefill is not None and n_prompt <= self.prefill.prompt_room:
                groups.setdefault(self.prefill.bucket_of(n_prompt), []).append(i)
            else:  # at the exact length (logged once when beyond the padded prefill's room)
                phone_ids, prompt = (
                    to_device(t, self.device).long() for t in (req.phone_ids, req.prompt_tokens)
                )
                first[i] = self._prefill(row, phone_ids, to_device(req.bert, self.device), prompt)
        for members in groups.values():
            size = self.prefill.row_counts[-1]
            for at in range(0, len(members), size):
                part = members[at : at + size]
                prompts = [(requests[i].phone_ids, requests[i].bert, requests[i].prompt_tokens) for i in part]
                logits = self.prefill.load_padded([rows[i] for i in part], prompts).clone()
                for j, i in enumerate(part):
                    first[i] = logits[j]
        return torch.stack(first)

    def _start_rows(self, rows: list[int], requests: list[T2SRequest], first: torch.Tensor) -> None:
        """Per-row state and sampling parameters (as `_load_row` and `SamplingBuffers.set_row` write them)
        for all rows at once, and their first draws: built packed from one host table, sampled, scattered."""
        k, vocab, device = len(rows), self.model.config.vocab_size, self.device
        longs, floats = [], []
        for row, req in zip(rows, requests):
            p = req.params
            seed = p.seed if p.seed is not None else secrets.randbits(64)
            cap, _ = self._step_limit(p)
            longs.append([row, req.prompt_tokens.shape[0], cap, p.force_n_tokens is not None,
                          max(1, min(int(p.top_k), vocab)), *split_seed(seed)])  # fmt: skip
            floats.append([p.top_p, max(p.temperature, TEMPERATURE_FLOOR), p.repetition_penalty])
        lo = to_device(torch.tensor(longs, dtype=torch.long), device)
        fl = to_device(torch.tensor(floats, dtype=torch.float32), device)
        idx, st = lo[:, 0], self.state
        on_host = not any(r.prompt_tokens.is_cuda for r in requests)
        seen = torch.zeros(k, vocab, dtype=torch.bool, device="cpu" if on_host else device)
        for i, req in enumerate(requests):  # the prompt's tokens count as seen (repetition penalty)
            seen[i, to_device(req.prompt_tokens, seen.device).long()] = True
        buf = SamplingBuffers(lo[:, 4].clone(), fl[:, 0].clone(), fl[:, 1].clone(), fl[:, 2].clone(),
                              to_device(seen, device))  # fmt: skip

        def zeros(dtype: torch.dtype, *shape: int) -> torch.Tensor:
            return torch.zeros(k, *shape, dtype=dtype, device=device)

        packed = DecodeState(
            tokens=zeros(torch.long), audio_pos=lo[:, 1].clone(), step=zeros(torch.long), cap=lo[:, 2].clone(),
            stop_step=zeros(torch.long), forced=lo[:, 3].bool(), done=zeros(torch.bool),
            stop_eos=zeros(torch.bool), out=zeros(torch.long, st.out.shape[1]), rows=self._arange[:k],
        )  # fmt: skip
        noise = self._noise(lo[:, 5], lo[:, 6], packed.step)
        sample_step(self.model, packed, first, buf, None, False, noise)
        for f in fields(st):
            if f.name != "rows":
                getattr(st, f.name).index_copy_(0, idx, getattr(packed, f.name))
        for f in fields(self.buf):
            getattr(self.buf, f.name).index_copy_(0, idx, getattr(buf, f.name))
        self.seed_lo.index_copy_(0, idx, lo[:, 5])
        self.seed_hi.index_copy_(0, idx, lo[:, 6])
        self.snap_from.index_fill_(0, idx, 0)
