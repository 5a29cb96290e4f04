"""Static-KV decoding for the T2S decoder: fixed buffers, a batch dimension, a capturable step.

`decode_step` is the unit a CUDA graph captures: a free function of (model, cache, state, sampling
buffers, generator, n_slots) that advances every row by one token using only device tensors; the
only Python value it depends on is n_slots, the KV bucket, fixed per captured graph. Stop decisions
are made on the device (`done`, `stop_step`); the host reads them every few steps, never per token.

Same semantics as the eager reference (`decode.py`). Where upstream slices the EOS logit off
(first 11 steps, forced mode) the host passes drop_eos=True when every row is in that phase, so the
noise draw has upstream's width and the RNG stream matches; rows in mixed phases get EOS = -inf at
full width instead (same greedy tokens; a different draw width, so sampled tokens may differ).

The object that owns these buffers and runs the step eagerly is `static_decoder.T2SStaticDecoder`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F

from voicehub.models.gpt_sovits.t2s.config import EOS_BLOCKED_STEPS, MAX_DECODE_STEPS, T2SConfig
from voicehub.models.gpt_sovits.t2s.decode import DecodeResult, StopReason, T2SSamplingParams
from voicehub.models.gpt_sovits.t2s.model import T2SModel
from voicehub.runtime.kernels.sample_step import record_step
from voicehub.runtime.kernels.t2s_layer import EmbedWeights, LayerWeights, StackWeights
from voicehub.runtime.kv_cache import StaticKVCache
from voicehub.runtime.sampling import SamplingBuffers, sample

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
    embed_stack_rows: T2S_EMBED_STACK_ROWS, embed_stack's signature tiled for many rows (the embedding in
    one kernel, then layer_stack_rows' layers, bitwise): an engine's embed_stack (`for_rows`);
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
    embed_stack_rows: Callable[..., torch.Tensor] | None = None
    sampler: Callable[..., torch.Tensor] | None = None
    row_noise: Callable[..., torch.Tensor] | None = None

    def for_rows(self) -> StepKernels:
        """The kernels of an engine of many batched rows (`T2SRowEngine`): layer_stack_rows, when set,
        as its layer stack (every batch bucket, so a row's numbers do not change with the bucket), and
        embed_stack_rows (None: the model's embedding, then that stack) as its embed stack."""
        if self.layer_stack_rows is None:
            return self
        return replace(self, layer_stack=self.layer_stack_rows, embed_stack=self.embed_stack_rows)


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
