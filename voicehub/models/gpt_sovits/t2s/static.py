"""Static-KV decoding for the T2S decoder: fixed buffers, a batch dimension, a capturable step.

`decode_step` is the unit a CUDA graph captures: a free function of (model, cache, state, sampling
buffers, generator, n_slots) that advances every row by one token using only device tensors; the
only Python value it depends on is n_slots, the KV bucket, fixed per captured graph. Stop decisions
are made on the device (`done`, `stop_step`); the host reads them every few steps, never per token.

Same semantics as the eager reference (`decode.py`). Where upstream slices the EOS logit off
(first 11 steps, forced mode) the host passes drop_eos=True when every row is in that phase, so the
noise draw has upstream's width and the RNG stream matches; rows in mixed phases get EOS = -inf at
full width instead (same greedy tokens; a different draw width, so sampled tokens may differ).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F

from voicehub.models.gpt_sovits.t2s.config import EOS_BLOCKED_STEPS, MAX_DECODE_STEPS, T2SConfig
from voicehub.models.gpt_sovits.t2s.decode import (
    DecodeResult,
    StopReason,
    T2SSamplingParams,
    encode_prompt,
    reseed,
)
from voicehub.models.gpt_sovits.t2s.model import T2SModel
from voicehub.models.gpt_sovits.t2s.prefill import PaddedPrefill
from voicehub.runtime.kernels.sample_step import record_step
from voicehub.runtime.kernels.t2s_layer import EmbedWeights, LayerWeights, StackWeights
from voicehub.runtime.kv_cache import StaticKVCache, pick_bucket
from voicehub.runtime.sampling import SamplingBuffers, sample

log = logging.getLogger(__name__)

# KV slots kept for the prompt (reference phonemes + sentence phonemes + reference semantic tokens):
# a 10 s reference is 250 tokens, leaving ~260 phonemes; longer requests take the eager path.
PROMPT_ROOM = 512
SLOT_ROUNDING = 256  # max_seq_len is rounded up to a multiple of this (friendlier attention shapes)
DEFAULT_KV_BUCKETS = (256, 512, 1024)


@dataclass(frozen=True)
class StaticDecodeConfig:
    """Engine sizes: rows decoded together, KV slots per row, attention (KV-length) buckets, batch
    buckets (a step runs on the first n rows, n a bucket), stop-check period in steps."""

    max_batch: int = 1
    max_seq_len: int = 2048
    kv_buckets: tuple[int, ...] = (256, 512, 1024, 2048)
    batch_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    stop_check_interval: int = 8

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_seq_len < 2 or self.stop_check_interval < 1:
            raise ValueError("StaticDecodeConfig: max_batch, stop_check_interval >= 1 and max_seq_len >= 2")
        if not self.kv_buckets or any(b < 1 or b > self.max_seq_len for b in self.kv_buckets):
            raise ValueError(
                f"kv_buckets {self.kv_buckets} must be non-empty, each in [1, max_seq_len={self.max_seq_len}]"
            )

    @classmethod
    def for_checkpoint(
        cls, config: T2SConfig, *, prompt_room: int = PROMPT_ROOM, max_batch: int = 1
    ) -> StaticDecodeConfig:
        """Sizes for one checkpoint: room for the prompt plus the most steps a default request
        takes (the checkpoint's cap hz * max_sec + 1, at most upstream's 1500-step loop)."""
        n_steps = min(config.early_stop_num + 1, MAX_DECODE_STEPS)
        max_seq_len = -(-(prompt_room + n_steps) // SLOT_ROUNDING) * SLOT_ROUNDING
        buckets = tuple(b for b in DEFAULT_KV_BUCKETS if b < max_seq_len)
        return cls(max_batch=max_batch, max_seq_len=max_seq_len, kv_buckets=buckets or (max_seq_len,))

    @property
    def buckets(self) -> tuple[int, ...]:
        """Sorted KV buckets, with max_seq_len as the last so every fitting sequence has one."""
        return tuple(sorted(set(self.kv_buckets) | {self.max_seq_len}))

    @property
    def row_buckets(self) -> tuple[int, ...]:
        """Sorted batch buckets up to max_batch, max_batch included."""
        return tuple(sorted({b for b in self.batch_buckets if 1 <= b < self.max_batch} | {self.max_batch}))


@dataclass(frozen=True)
class StepKernels:
    """The functions a decode step calls for fused ops (the kernel registry's signatures);
    None keeps the model's own modules. An optimization transform sets them on a decoder instance.

    attention: DECODE_ATTENTION `f(q [B, H, Dh], k, v [B, H, S, Dh], n_valid [B], scale) -> [B, H, Dh]`
    (attends to the true length instead of a masked bucket);
    add_layer_norm: ADD_LAYER_NORM `f(x, residual, weight, bias, eps) -> LayerNorm(x + residual)`
    (both post-norm residuals of each layer);
    layer_stack: T2S_LAYER_STACK `f(x [B, D], StackWeights, k, v [L, B, H, S, Dh], lengths [B], n_slots)
    -> logits [B, V]` (every layer and the head, writing K/V at slot lengths; when set, the step
    calls it instead of the layers, and attention / add_layer_norm are not used);
    embed_stack: T2S_EMBED_STACK `f(tokens [B], audio_pos [B], EmbedWeights, StackWeights, k, v, lengths,
    n_slots) -> logits [B, V]` (the layer stack with the input embedding gathered by its first kernel;
    when set, the step calls it instead of the embedding and the layers, and layer_stack is not used);
    layer_stack_rows: T2S_LAYER_STACK_ROWS, layer_stack's signature tiled for many rows: what an engine
    batching many streams steps with instead of both stacks (`for_rows`); single streams keep layer_stack;
    sampler: SAMPLE_STEP `f(logits [B, V'], q [B, >= V'], buf, state, lengths | None, *, eos, n_blocked,
    max_steps) -> tokens [B]` (the sampling chain, the stop logic and the state updates of
    `sample_step`, plus the KV-length and position advance of `decode_step`, in one op; the noise q
    is still drawn by torch, so the RNG stream is unchanged);
    row_noise: ROW_NOISE `f(seed_lo, seed_hi, step [B], vocab_keys [V]) -> noise [B, V]`, the per-row
    counter noise an engine of many rows draws each step (`runtime/row_rng.py`; None: its torch ops)."""

    attention: Callable[..., torch.Tensor] | None = None
    add_layer_norm: Callable[..., torch.Tensor] | None = None
    layer_stack: Callable[..., torch.Tensor] | None = None
    embed_stack: Callable[..., torch.Tensor] | None = None
    layer_stack_rows: Callable[..., torch.Tensor] | None = None
    sampler: Callable[..., torch.Tensor] | None = None
    row_noise: Callable[..., torch.Tensor] | None = None

    def for_rows(self) -> StepKernels:
        """The kernels of an engine of many batched rows (`T2SRowEngine`): layer_stack_rows, when set,
        as its layer stack (every batch bucket, so a row's numbers do not change with the bucket)."""
        if self.layer_stack_rows is None:
            return self
        return replace(self, layer_stack=self.layer_stack_rows, embed_stack=None)


NATIVE_KERNELS = StepKernels()


@dataclass(frozen=True)
class T2SRequest:
    """One sequence: phone_ids [Tx] long, bert [1024, Tx], prompt_tokens [Ty] long, and its params."""

    phone_ids: torch.Tensor
    bert: torch.Tensor
    prompt_tokens: torch.Tensor
    params: T2SSamplingParams


@dataclass
class DecodeState:
    """Per-row device tensors of a decode, allocated once. All [B] unless noted:
    tokens (last token), audio_pos (its position), step (tokens sampled so far), cap (upstream's
    early_stop_num, or N when forced), stop_step, forced, done, stop_eos, out [B, max_out] tokens,
    rows (arange(B), for indexing)."""

    tokens: torch.Tensor
    audio_pos: torch.Tensor
    step: torch.Tensor
    cap: torch.Tensor
    stop_step: torch.Tensor
    forced: torch.Tensor
    done: torch.Tensor
    stop_eos: torch.Tensor
    out: torch.Tensor
    rows: torch.Tensor

    @classmethod
    def allocate(cls, batch: int, max_out: int, device: torch.device) -> DecodeState:
        def longs() -> torch.Tensor:
            return torch.zeros(batch, dtype=torch.long, device=device)

        def bools() -> torch.Tensor:
            return torch.zeros(batch, dtype=torch.bool, device=device)

        out = torch.zeros(batch, max_out, dtype=torch.long, device=device)
        rows = torch.arange(batch, device=device)
        return cls(longs(), longs(), longs(), longs(), longs(), bools(), bools(), bools(), out, rows)

    def narrow(self, n_rows: int) -> DecodeState:
        """A view of rows [0, n_rows) sharing storage (a batch bucket)."""
        return DecodeState(*(getattr(self, f.name)[:n_rows] for f in fields(self)))


def _finish(
    layer: torch.nn.Module, x: torch.Tensor, attn: torch.Tensor, kernels: StepKernels
) -> torch.Tensor:
    # x: [B, 1, D]; attn: [B, H, 1, D/H] -> [B, 1, D]; layer.finish with a fused residual + LayerNorm
    if kernels.add_layer_norm is None:
        return layer.finish(x, attn)
    aln, n1, n2 = kernels.add_layer_norm, layer.norm1, layer.norm2
    attn = layer.self_attn.out_proj(attn.transpose(1, 2).reshape(x.shape[0], 1, -1))
    x = aln(x, attn, n1.weight, n1.bias, n1.eps)
    return aln(x, layer.linear2(F.relu(layer.linear1(x))), n2.weight, n2.bias, n2.eps)


def stopped_result(drawn, stop_step: int, is_forced: bool, is_eos: bool) -> DecodeResult:
    """A stopped row's DecodeResult from its draws (out[0:], a tensor or a list, through stop_step; an EOS
    stop's up to it): a forced row keeps every draw, an EOS stop excludes the EOS draw, and the cap keeps
    the last stop_step of the stop_step + 1 draws, as upstream's y[-idx:] does."""
    if is_forced:
        tokens, reason = drawn[: stop_step + 1], StopReason.FORCED
    elif is_eos:
        tokens, reason = drawn[:stop_step], StopReason.EOS
    else:
        tokens, reason = drawn[1 : stop_step + 1], StopReason.MAX_TOKENS
    return DecodeResult(
        torch.as_tensor(tokens, dtype=torch.long).clone(), reason, stop_step + 1, torch.zeros(0)
    )


def stack_weights(model: T2SModel) -> StackWeights:
    """The decoder's layers and head as the layer-stack op takes them (the parameters, not copies)."""
    layers = tuple(
        LayerWeights(
            layer.self_attn.in_proj_weight, layer.self_attn.in_proj_bias, layer.self_attn.out_proj.weight,
            layer.self_attn.out_proj.bias, layer.norm1.weight, layer.norm1.bias, layer.linear1.weight,
            layer.linear1.bias, layer.linear2.weight, layer.linear2.bias, layer.norm2.weight, layer.norm2.bias,
        )
        for layer in model.h.layers
    )  # fmt: skip
    eps = model.h.layers[0].norm1.eps  # every norm of T2SLayer has the same eps
    return StackWeights(layers, model.ar_predict_layer.weight, model.config.n_head, eps)


def embed_weights(model: T2SModel) -> EmbedWeights:
    """The decoder's audio-token embedding as the embed-stack op takes it (the tensors, not copies)."""
    position = model.ar_audio_position
    return EmbedWeights(model.ar_audio_embedding.word_embeddings.weight, position.pe, position.alpha)


def forward_step(
    model: T2SModel,
    cache: StaticKVCache,
    tokens: torch.Tensor,
    audio_pos: torch.Tensor,
    n_slots: int,
    kernels: StepKernels = NATIVE_KERNELS,
) -> torch.Tensor:
    """Run each row's last token through the decoder against its cached context.
    tokens, audio_pos: [B] long -> logits [B, V]. Writes K/V at slot `cache.lengths`; does not advance it."""
    if kernels.embed_stack is not None:
        embed, weights = embed_weights(model), stack_weights(model)
        return kernels.embed_stack(
            tokens, audio_pos, embed, weights, cache.k, cache.v, cache.lengths, n_slots
        )
    x = model.embed_audio_at(tokens, audio_pos)  # [B, 1, D]
    if kernels.layer_stack is not None:
        return kernels.layer_stack(x[:, 0], stack_weights(model), cache.k, cache.v, cache.lengths, n_slots)
    mask = cache.step_mask(n_slots)  # [B, 1, 1, n_slots]
    n_valid = cache.lengths + 1  # [B]: the cached slots and the token written this step
    for i, layer in enumerate(model.h.layers):
        q, k, v = layer.project_qkv(x)  # [B, H, 1, D/H]
        cache.append(i, k[:, :, 0], v[:, :, 0])
        keys, values = cache.view(i, n_slots)
        if kernels.attention is None:
            attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        else:
            attn = kernels.attention(q[:, :, 0], keys, values, n_valid, None)[:, :, None]
        x = _finish(layer, x, attn, kernels)
    return model.logits(x[:, 0])


def sample_step(
    model: T2SModel,
    state: DecodeState,
    logits: torch.Tensor,
    buf: SamplingBuffers,
    generator: torch.Generator | None,
    drop_eos: bool = False,
    noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """Choose each row's next token and update its stop state, on the device. logits: [B, V] -> [B].
    noise: per-row Exp(1) noise [B, V] (`runtime/row_rng.py`) used instead of `generator`.

    drop_eos (static, chosen by the host when every row has EOS blocked: the first 11 steps, or all
    rows forced) samples from logits[:, :EOS] as upstream does, so the noise draw has upstream's
    width and a fixed seed gives upstream's tokens. Otherwise blocked rows get EOS = -inf."""
    eos = model.config.eos
    blocked = state.forced | (state.step < EOS_BLOCKED_STEPS)
    if drop_eos:
        logits = logits[:, :eos]
    else:
        logits = logits.clone()
        logits[:, eos] = logits[:, eos].masked_fill(blocked, float("-inf"))
    tokens, penalized = sample(logits, buf, generator, noise)
    record_step(state, buf, tokens, penalized, blocked, eos=eos, max_steps=MAX_DECODE_STEPS, rows=state.rows)
    return tokens


def fused_sample_step(
    model: T2SModel,
    state: DecodeState,
    logits: torch.Tensor,
    buf: SamplingBuffers,
    generator: torch.Generator | None,
    drop_eos: bool,
    noise: torch.Tensor | None,
    sampler: Callable[..., torch.Tensor],
    cache: StaticKVCache | None = None,
) -> torch.Tensor:
    """`sample_step` through the SAMPLE_STEP op (plus `decode_step`'s advance of the cache and the
    positions when `cache` is given). logits: [B, V] -> tokens [B]. The noise is drawn here exactly as
    `sampling.draw` draws it (same shape and dtype from the same generator), or is the given `noise`."""
    eos = model.config.eos
    if drop_eos:
        logits = logits[:, :eos]
    if noise is None:  # what `torch.empty_like(probs).exponential_` draws: probs is [B, V'] in logits' dtype
        noise = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        noise.exponential_(1, generator=generator)
    lengths = cache.lengths if cache is not None else None
    return sampler(
        logits, noise, buf, state, lengths, eos=eos, n_blocked=EOS_BLOCKED_STEPS, max_steps=MAX_DECODE_STEPS
    )


def decode_step(
    model: T2SModel,
    cache: StaticKVCache,
    state: DecodeState,
    buf: SamplingBuffers,
    generator: torch.Generator | None,
    n_slots: int,
    drop_eos: bool = False,
    noise: torch.Tensor | None = None,
    kernels: StepKernels = NATIVE_KERNELS,
) -> torch.Tensor:
    """One token for every row: forward the last token, sample the next, advance live rows.
    No host sync and no branch on tensor values; n_slots (the KV bucket), drop_eos and kernels
    (the fused-op functions, `StepKernels`) are static choices of the host, one captured graph per
    combination."""
    logits = forward_step(model, cache, state.tokens, state.audio_pos, n_slots, kernels)
    if kernels.sampler is not None:
        return fused_sample_step(
            model, state, logits, buf, generator, drop_eos, noise, kernels.sampler, cache
        )
    live = ~state.done  # rows that consumed a slot this step
    tokens = sample_step(model, state, logits, buf, generator, drop_eos, noise)
    cache.advance(live)
    state.audio_pos.add_(live.long())
    return tokens


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
