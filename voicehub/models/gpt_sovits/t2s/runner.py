"""The T2S decoder on the GPU: the static decoder's step replayed from CUDA graphs.

One `T2SGraphDecoder` per loaded GPT checkpoint owns the GPU state of its decodes: the KV cache,
sampling buffers, per-row state, the device RNG and the graphs of `decode_step`, one per
(KV bucket, batch bucket, drop_eos) key, all in one memory pool. A sequence that outgrows a KV
bucket moves to the next graph in place (the cache is shared); beyond the largest bucket the
request is refused before it starts (`StaticDecodeConfig.max_seq_len`).

`decode_iter(request, ends=)` is the step-wise face of `decode` for streaming: the tokens come out at
every stop check (the one host read of a decode), or with window ends (token counts) at each end; the
steps and the RNG stream are `decode`'s own.

With a capturing preset the prompt is prefilled by graph replays too (`prefill.PaddedPrefill`: the prompt
padded to a multiple of 64 positions, masked; one graph per length bucket, captured as the preset says),
instead of ~400 eager launches at the prompt's exact length; prompts beyond its room are prefilled eagerly.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields

import torch

from voicehub.models.gpt_sovits.t2s.config import EOS_BLOCKED_STEPS
from voicehub.models.gpt_sovits.t2s.decode import DecodeResult, StopReason, reseed
from voicehub.models.gpt_sovits.t2s.model import T2SModel
from voicehub.models.gpt_sovits.t2s.static import (
    StaticDecodeConfig,
    StepKernels,
    T2SRequest,
    sample_step,
)
from voicehub.models.gpt_sovits.t2s.static_decoder import T2SStaticDecoder
from voicehub.runtime.cuda_graphs import BucketedGraphRunner, GraphPreset, parse_graph_preset
from voicehub.runtime.kv_cache import pick_bucket

GraphKey = tuple[int, int, bool]  # (batch rows, KV slots, drop_eos)


@dataclass(frozen=True)
class DecodedTokens:
    """One item of a step-wise decode: `tokens` [n] long, on the decoder's device, decoded since the
    previous item (n may be 0 on the last item); `result` is None except on the last item, where it is
    exactly what `decode([request])[0]` returns."""

    tokens: torch.Tensor
    result: DecodeResult | None = None


def _next_end(ends: Iterator[int], after: int) -> int | None:
    """The window end after `after` tokens (None: no more windows)."""
    end = next(ends, None)
    if end is not None and end <= after:
        raise ValueError(f"window ends must increase from >= 1 tokens, got {end} after {after}")
    return end


def _n_spoken(result: DecodeResult) -> int:
    """Tokens of the decode a stream speaks: every token drawn but an EOS stop's last one (see decode_iter)."""
    return result.n_steps - 1 if result.stop_reason == StopReason.EOS else result.n_steps


@torch.inference_mode()
def decode_iter(
    decoder: T2SStaticDecoder, request: T2SRequest, ends: Iterable[int] | None = None
) -> Iterator[DecodedTokens]:
    """`decoder.decode([request])` step by step: the same steps (KV buckets, EOS phases, batch bucket)
    and the same RNG stream, so the same tokens and DecodeResult, handed out as they are decoded.

    Every `stop_check_interval` steps, where `decode` reads the stop flag (the only host read), the
    tokens drawn since the last item are yielded as a device tensor (no copy to the host). With `ends`
    (a stream's window ends: increasing token counts, e.g. `streaming.window_ends`), items are yielded
    when the number of tokens drawn reaches the next end instead (the stop flag read there too, and still
    at every stop check): a window leaves as soon as its last token is drawn, not at the next stop check.
    A stop seen at a window's end ends the loop before decode's next stop check would: the steps it skips
    run on a done row, which changes nothing decode reports. The
    concatenated tokens equal the result's, except on a cap stop (no EOS within max_new_tokens), where
    upstream's callers drop the *first* token (`y[-idx:]`, kept in `result.tokens`): a stream has already
    spoken it, so the yielded tokens keep it (one more), as `streaming.decode_steps` does.
    The decoder's state belongs to the iterator until it ends or is closed: no other decode may run on
    this decoder meanwhile (the pipeline holds its T2S lock for that).
    """
    windows = None if ends is None else iter(ends)
    n_edge = None if windows is None else _next_end(windows, 0)  # before anything touches the decoder
    engine, model, st = decoder.engine, decoder.model, decoder.state
    decoder._reset()
    n_rows = pick_bucket(1, engine.row_buckets)  # decode() of one request steps the same rows
    state, buf = st.narrow(n_rows), decoder.buf.narrow(n_rows)
    first = torch.zeros(n_rows, model.config.vocab_size, device=decoder.device)
    first = first.to(model.ar_predict_layer.weight.dtype)
    first[0], n_prompt, limit = decoder._load_row(0, request)
    generator = reseed(decoder.generator, request.params.seed)
    is_forced = request.params.force_n_tokens is not None
    sample_step(model, state, first, buf, generator, drop_eos=True)
    n_sent = 0
    for n_steps in range(1, limit):  # n_steps tokens drawn so far
        is_check = n_steps % engine.stop_check_interval == 0
        is_edge = n_steps == n_edge
        if is_edge:
            n_edge = _next_end(windows, n_steps)
        if is_check or is_edge:
            if bool(st.done[0]):
                break  # the one host read, where decode() makes it (or at a window's end)
            if is_edge or windows is None:
                yield DecodedTokens(st.out[0, n_sent:n_steps].clone())  # not done: all drawn are speech
                n_sent = n_steps
        n_slots = pick_bucket(n_prompt + n_steps, engine.buckets)
        decoder.step(n_rows, n_slots, is_forced or n_steps < EOS_BLOCKED_STEPS)
    result = decoder._result(0)
    yield DecodedTokens(st.out[0, n_sent : _n_spoken(result)].clone(), result)


class T2SGraphDecoder(T2SStaticDecoder):
    """`decode(requests)` with the same results as T2SStaticDecoder, each step a graph replay.

    preset: `full` captures every key at construction, `minimal` the common ones (one row, the
    smallest KV bucket, both EOS phases; the prefill's COMMON_PREFILL_SLOTS), `lazy` each key on first
    use, `off` runs eagerly.
    padded_prefill: prefill prompts through `PaddedPrefill` (graphs under the preset); None: exactly when
    the preset captures. True with preset off runs the padded prefill eagerly (tests on the CPU).
    """

    def __init__(
        self,
        model: T2SModel,
        engine: StaticDecodeConfig | None = None,
        preset: str = "full",
        padded_prefill: bool | None = None,
    ):
        super().__init__(model, engine)
        self.preset = parse_graph_preset(preset)
        if padded_prefill is None:
            padded_prefill = self.preset is not GraphPreset.OFF
        if padded_prefill:
            self.use_padded_prefill(self.preset)
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
            if self.prefill is not None:  # its graphs do not depend on the step kernels: captured once
                self.prefill.capture_at_load(self.graphs.preset)
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

    def decode_iter(self, request: T2SRequest, ends: Iterable[int] | None = None) -> Iterator[DecodedTokens]:
        """One request decoded step by step, each step a graph replay (see the module's `decode_iter`)."""
        return decode_iter(self, request, ends)
