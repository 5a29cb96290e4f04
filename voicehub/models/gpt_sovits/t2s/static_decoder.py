"""The static-KV decoder: the object that owns one model's static decode state and runs it eagerly.

`T2SStaticDecoder` allocates the KV cache, sampling buffers and per-row state once from a
`StaticDecodeConfig` and steps them with `static.decode_step`; the graph runner (`runner.py`) and
the row engine (`scheduler.py`) subclass it and replay captured copies of its `step`.
"""

from __future__ import annotations

import logging

import torch

from voicehub.models.gpt_sovits.t2s.config import EOS_BLOCKED_STEPS, MAX_DECODE_STEPS
from voicehub.models.gpt_sovits.t2s.decode import DecodeResult, T2SSamplingParams, encode_prompt, reseed
from voicehub.models.gpt_sovits.t2s.model import T2SModel
from voicehub.models.gpt_sovits.t2s.prefill import PaddedPrefill
from voicehub.models.gpt_sovits.t2s.static import (
    NATIVE_KERNELS,
    PROMPT_ROOM,
    DecodeState,
    StaticDecodeConfig,
    StepKernels,
    T2SRequest,
    decode_step,
    sample_step,
    stopped_result,
)
from voicehub.runtime.kv_cache import StaticKVCache, pick_bucket
from voicehub.runtime.sampling import SamplingBuffers

log = logging.getLogger(__name__)


class T2SStaticDecoder:
    """Owns the static state of one model's decodes: KV cache, sampling buffers, per-row state.

    Allocated once from an engine config; `decode` runs up to max_batch requests together. This is
    the object a CUDA-graph runner wraps (capturing `decode_step` per bucket); here it runs eagerly.
    """

    def __init__(self, model: T2SModel, engine: StaticDecodeConfig | None = None):
        self.model, self.engine = model, engine or StaticDecodeConfig()
        cfg, w = model.config, model.ar_predict_layer.weight
        self.device = w.device
        self.cache = StaticKVCache(
            cfg.n_layer, self.engine.max_batch, cfg.n_head, self.engine.max_seq_len, cfg.head_dim,
            device=w.device, dtype=w.dtype,
        )  # fmt: skip
        self.buf = SamplingBuffers.allocate(self.engine.max_batch, cfg.vocab_size, w.device)
        self.state = DecodeState.allocate(self.engine.max_batch, self.engine.max_seq_len, w.device)
        # One generator for every decode, reseeded per call: a graph that captured it keeps using it.
        self.generator = torch.Generator(device=w.device)
        self.kernels = NATIVE_KERNELS
        self.prefill: PaddedPrefill | None = None  # set by graph-capturing owners (`use_padded_prefill`)
        self._said_eager_prefill = False

    def use_padded_prefill(self, preset: str) -> PaddedPrefill:
        """Prefill prompts (up to PROMPT_ROOM positions) through `PaddedPrefill`, its graphs under `preset`."""
        self.prefill = PaddedPrefill(self.model, self.cache, PROMPT_ROOM, preset)
        return self.prefill

    def set_step_kernels(self, kernels: StepKernels) -> StepKernels:
        """Use `kernels` in every later step; returns the previous choice (for undo)."""
        previous, self.kernels = self.kernels, kernels
        return previous

    def step(self, n_rows: int, n_slots: int, drop_eos: bool) -> None:
        """One decode step over rows [0, n_rows) against KV bucket n_slots (eager here; a graph
        runner replays a captured copy of exactly this call)."""
        decode_step(
            self.model, self.cache.narrow(n_rows), self.state.narrow(n_rows), self.buf.narrow(n_rows),
            self.generator, n_slots, drop_eos, kernels=self.kernels,
        )  # fmt: skip

    def _step_limit(self, params: T2SSamplingParams) -> tuple[int, int]:
        """(cap kept on the device, most steps the row can take)."""
        if params.force_n_tokens is not None:
            return params.force_n_tokens, params.force_n_tokens
        cap = params.max_new_tokens or self.model.config.early_stop_num
        return cap, min(cap + 1, MAX_DECODE_STEPS)

    def slots_needed(self, req: T2SRequest) -> int:
        """KV slots the request may use: its prompt plus the most steps it can take."""
        return req.phone_ids.shape[0] + req.prompt_tokens.shape[0] + self._step_limit(req.params)[1]

    def fits(self, req: T2SRequest) -> bool:
        """Whether the static cache holds the request (else `decode` refuses it)."""
        return self.slots_needed(req) <= self.engine.max_seq_len

    def _load_row(self, row: int, req: T2SRequest) -> tuple[torch.Tensor, int, int]:
        """Prefill one request into its row; returns (first logits [V], prompt length, step limit)."""
        phone_ids, prompt = req.phone_ids.to(self.device).long(), req.prompt_tokens.to(self.device).long()
        cap, limit = self._step_limit(req.params)
        n_prompt = phone_ids.shape[0] + prompt.shape[0]
        if n_prompt + limit > self.engine.max_seq_len:
            raise ValueError(
                f"request needs up to {n_prompt} + {limit} KV slots, the static cache holds "
                f"{self.engine.max_seq_len}; raise StaticDecodeConfig.max_seq_len or lower max_new_tokens"
            )
        logits = self._prefill(row, phone_ids, req.bert.to(self.device), prompt)
        p, st = req.params, self.state
        self.buf.set_row(row, top_k=p.top_k, top_p=p.top_p, temperature=p.temperature,
                         repetition_penalty=p.repetition_penalty, seen_tokens=prompt)  # fmt: skip
        st.audio_pos[row], st.cap[row], st.forced[row] = prompt.shape[0], cap, p.force_n_tokens is not None
        st.done[row] = False
        return logits, n_prompt, limit

    def _prefill(
        self, row: int, phone_ids: torch.Tensor, bert: torch.Tensor, prompt: torch.Tensor
    ) -> torch.Tensor:
        """The prompt's K/V into cache row `row`, its length set; returns the next-token logits [V].
        Through the padded prefill when set (`prefill.py`: a graph replay per length bucket), else, or
        for a prompt beyond its room (logged once), eagerly: `encode_prompt` at the exact length, copied in."""
        n_prompt = phone_ids.shape[0] + prompt.shape[0]
        if self.prefill is not None and n_prompt <= self.prefill.prompt_room:
            return self.prefill.load([row], [(phone_ids, bert, prompt)])[0]
        if self.prefill is not None and not self._said_eager_prefill:
            self._said_eager_prefill = True
            log.info(
                "T2S prompt of %d positions exceeds the padded prefill's %d: prefilled eagerly",
                n_prompt, self.prefill.prompt_room,
            )  # fmt: skip
        logits, keys, values = encode_prompt(self.model, phone_ids, bert, prompt)
        for i, (k, v) in enumerate(zip(keys, values)):
            self.cache.fill_row(i, row, k[0], v[0])
        self.cache.set_length(row, phone_ids.shape[0] + prompt.shape[0])
        return logits[0]

    def _reset(self) -> None:
        st = self.state
        for t in (st.tokens, st.audio_pos, st.step, st.cap, st.stop_step, self.cache.lengths):
            t.zero_()
        st.forced.zero_()
        st.stop_eos.zero_()
        st.done.fill_(True)  # unused rows stay done: they step along harmlessly on slot 0

    @torch.inference_mode()
    def decode(self, requests: list[T2SRequest]) -> list[DecodeResult]:
        """Decode requests together; results in request order, with the eager path's semantics."""
        if not 1 <= len(requests) <= self.engine.max_batch:
            raise ValueError(f"got {len(requests)} requests; this decoder takes 1..{self.engine.max_batch}")
        seeds = {r.params.seed for r in requests}
        if len(seeds) > 1:
            raise ValueError(
                "rows of one batch share one RNG stream; give them the same seed or decode them separately"
            )
        self._reset()
        n_rows = pick_bucket(len(requests), self.engine.row_buckets)
        state, buf = self.state.narrow(n_rows), self.buf.narrow(n_rows)
        first = torch.zeros(n_rows, self.model.config.vocab_size, device=self.device)
        first = first.to(self.model.ar_predict_layer.weight.dtype)
        n_prompt_max, limit = 0, 0
        for row, req in enumerate(requests):
            first[row], n_prompt, row_limit = self._load_row(row, req)
            n_prompt_max, limit = max(n_prompt_max, n_prompt), max(limit, row_limit)
        gen = reseed(self.generator, requests[0].params.seed)
        all_forced = all(r.params.force_n_tokens is not None for r in requests)
        sample_step(self.model, state, first, buf, gen, drop_eos=True)
        for n_steps in range(1, limit):
            if n_steps % self.engine.stop_check_interval == 0 and bool(state.done.all()):
                break  # the only host read of device state: once per stop_check_interval steps
            n_slots = pick_bucket(n_prompt_max + n_steps, self.engine.buckets)
            drop_eos = all_forced or n_steps < EOS_BLOCKED_STEPS  # rows start together: same phase
            self.step(n_rows, n_slots, drop_eos)
        return [self._result(row) for row in range(len(requests))]

    def _result(self, row: int) -> DecodeResult:
        st = self.state
        return stopped_result(
            st.out[row].cpu(), int(st.stop_step[row]), bool(st.forced[row]), bool(st.stop_eos[row])
        )
