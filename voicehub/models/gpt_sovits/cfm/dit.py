"""The DiT velocity estimator of GPT-SoVITS v3's conditional flow matching (F5-TTS backbone).

Names and shapes follow upstream's `f5_tts.model.backbones.dit.DiT`. Two compatibility facts:
rotary embedding is applied to the first `dim_head` channels of q and k before the split into
heads (so only the first head is rotated), with interleaved pairs, as x_transformers'
`apply_rotary_pos_emb` does on a [B, N, heads*dim_head] tensor; and the text/step embeddings
do not change across solver steps, so they are computed once per solve.

The solver's schedule and step cache (cfm/schedule.py) are held by the DiT instance and swapped
only by optimization transforms (`set_schedule`, `set_step_cache`); the model code never picks one.

A `mask` [B, N] (True on valid frames) lets rows of different lengths share a right-padded batch:
attention ignores padded keys, and every layer that mixes frames (the depthwise and positional
convolutions, GRN's norm over frames) sees zeros there, as the unpadded row sees its zero padding,
so a valid frame's output does not depend on the padding (up to float rounding).

The block's elementwise ops (adaLN modulation, gated residuals, rotary embedding, the attention
mask) and the text blocks' depthwise convolution are named kernel ops
(voicehub/runtime/kernels/dit_block.py); the DiT calls the functions of the `DiTKernels` it holds, by
default the ops' torch definitions, which are its own code. Only an optimization transform swaps them
(`set_kernels`), e.g. for fused Triton kernels.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from voicehub.models.gpt_sovits.cfm.schedule import BlockReuse, Schedule, StepCache, uniform_steps
from voicehub.models.gpt_sovits.weights import computed_buffer
from voicehub.runtime.kernels.dit_block import (
    gated_residual_reference,
    modulated_norm_reference,
    residual_norm_reference,
    rope_first_head,
    rope_reference,
)

FREQ_EMBED_DIM = 256  # sinusoidal width of the step embeddings
TEXT_MAX_POS = 4096  # positions precomputed for the text-side sinusoid (~44 s at 24 kHz)
CONV_POS_KERNEL = 31
CONV_POS_GROUPS = 16

# The rotation of x [B, N, C]'s first head, under the name callers of the model know.
apply_rope_first_head = rope_first_head


@dataclass(frozen=True)
class DiTKernels:
    """What a DiT runs for its block ops (signatures: voicehub/runtime/kernels/dit_block.py).

    The defaults are the model's own code. `attention_bias` None: each block hands SDPA the boolean
    mask expanded to [B, heads, N, N] (SDPA converts it per call); a function: the forward makes the
    additive bias once. `depthwise_conv` None: the text blocks' depthwise convolutions run as their
    nn.Conv1d (cuDNN on a GPU); a function: it runs them (DIT_DEPTHWISE_CONV). `is_qkv_packed`: q, k, v
    come from one GEMM over the three projections' weights, packed into one buffer that the
    projections' parameters view (names unchanged)."""

    modulated_norm: Callable = modulated_norm_reference
    residual_norm: Callable = residual_norm_reference
    gated_residual: Callable = gated_residual_reference
    rope: Callable = rope_reference
    attention_bias: Callable | None = None
    depthwise_conv: Callable | None = None
    is_qkv_packed: bool = False


NATIVE_KERNELS = DiTKernels()


def sinusoid_table(dim: int, n_pos: int, theta: float = 10000.0) -> torch.Tensor:
    """[n_pos, dim]: cos of pos*freq for the first half, sin for the second (F5's precompute_freqs_cis)."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    angles = torch.outer(torch.arange(n_pos).float(), freqs)
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


def _zero_padding(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """x [B, N, D] with padded frames (mask [B, N] False) set to 0; x itself when mask is None."""
    return x if mask is None else x.masked_fill(~mask[..., None], 0.0)


class TimestepEmbedding(nn.Module):
    """Scalar step in [0, 1] -> [B, dim] through a 1000-scaled sinusoid and an MLP."""

    def __init__(self, dim: int, freq_dim: int = FREQ_EMBED_DIM):
        super().__init__()
        self.freq_dim = freq_dim
        self.time_mlp = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        # t: [B]
        half = self.freq_dim // 2
        freqs = torch.exp(torch.arange(half, device=t.device).float() * -(math.log(10000) / (half - 1)))
        angles = 1000 * t.unsqueeze(1) * freqs.unsqueeze(0)
        emb = torch.cat((angles.sin(), angles.cos()), dim=-1).to(t.dtype)
        return self.time_mlp(emb)


class GRN(nn.Module):
    """Global response normalisation of ConvNeXt-V2."""

    def __init__(self, dim: int):
        super().__init__()
        self.gamma = nn.Parameter(torch.zeros(1, 1, dim))
        self.beta = nn.Parameter(torch.zeros(1, 1, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, N, D]
        gx = torch.norm(x, p=2, dim=1, keepdim=True)
        nx = gx / (gx.mean(dim=-1, keepdim=True) + 1e-6)
        return self.gamma * (x * nx) + self.beta + x


class ConvNeXtV2Block(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.dwconv = nn.Conv1d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, hidden)
        self.grn = GRN(hidden)
        self.pwconv2 = nn.Linear(hidden, dim)
        self.kernels = NATIVE_KERNELS

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        # x: [B, N, D]; mask: [B, N] or None
        h, conv, dw = _zero_padding(x, mask).transpose(1, 2), self.kernels.depthwise_conv, self.dwconv
        h = (dw(h) if conv is None else conv(h, dw.weight, dw.bias, dw.padding[0])).transpose(1, 2)
        h = self.grn(_zero_padding(F.gelu(self.pwconv1(self.norm(h))), mask))
        return x + self.pwconv2(h)


class TextEmbedding(nn.Module):
    """Condition features [B, N, text_dim] + fixed sinusoid -> ConvNeXt-V2 blocks."""

    def __init__(self, text_dim: int, n_conv_layers: int, conv_mult: int = 2):
        super().__init__()
        table = computed_buffer((TEXT_MAX_POS, text_dim), lambda: sinusoid_table(text_dim, TEXT_MAX_POS))
        self.register_buffer("freqs_cis", table, persistent=False)
        self.text_blocks = nn.Sequential(
            *[ConvNeXtV2Block(text_dim, text_dim * conv_mult) for _ in range(n_conv_layers)]
        )

    def forward(self, text: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        # text: [B, N, text_dim]; positions past the table reuse its last row, as upstream
        pos = torch.arange(text.shape[1], device=text.device).clamp(max=TEXT_MAX_POS - 1)
        x = text + self.freqs_cis[pos].to(text.dtype)
        for block in self.text_blocks:
            x = block(x, mask)
        return x


class ConvPositionEmbedding(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        pad = CONV_POS_KERNEL // 2
        self.conv1d = nn.Sequential(
            nn.Conv1d(dim, dim, CONV_POS_KERNEL, groups=CONV_POS_GROUPS, padding=pad),
            nn.Mish(),
            nn.Conv1d(dim, dim, CONV_POS_KERNEL, groups=CONV_POS_GROUPS, padding=pad),
            nn.Mish(),
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        # x: [B, N, D]; mask: [B, N] or None
        conv1, act1, conv2, act2 = self.conv1d
        h = act1(conv1(_zero_padding(x, mask).transpose(1, 2)))
        return act2(conv2(_zero_padding(h.transpose(1, 2), mask).transpose(1, 2))).transpose(1, 2)


class InputEmbedding(nn.Module):
    def __init__(self, mel_dim: int, text_dim: int, dim: int):
        super().__init__()
        self.proj = nn.Linear(mel_dim * 2 + text_dim, dim)
        self.conv_pos_embed = ConvPositionEmbedding(dim)

    def forward(
        self, x: torch.Tensor, cond: torch.Tensor, text_embed: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        # x, cond: [B, N, mel], text_embed: [B, N, text_dim] -> [B, N, dim]
        h = self.proj(torch.cat((x, cond, text_embed), dim=-1))
        return self.conv_pos_embed(h, mask) + h


class RotaryEmbedding(nn.Module):
    """Holds `inv_freq` (the files carry it); angles are computed in float32."""

    def __init__(self, dim_head: int, base: float = 10000.0):
        super().__init__()
        inv_freq = computed_buffer(
            ((dim_head + 1) // 2,), lambda: 1.0 / (base ** (torch.arange(0, dim_head, 2).float() / dim_head))
        )
        self.register_buffer("inv_freq", inv_freq)

    def forward(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        # -> cos, sin: [N, dim_head], each angle repeated for its interleaved pair
        angles = (
            torch.arange(n, device=self.inv_freq.device).float()[:, None] * self.inv_freq.float()[None, :]
        )
        angles = angles.repeat_interleave(2, dim=-1)
        return angles.cos(), angles.sin()


def _like_parameters(param: torch.Tensor) -> torch.inference_mode:
    """The mode to make tensors that replace `param`'s data in: inference tensors for a model built under
    inference mode, normal ones otherwise (a parameter whose data is the other kind fails in forward)."""
    return torch.inference_mode(param.is_inference())


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int):
        super().__init__()
        self.heads = heads
        inner = heads * dim_head
        self.to_q = nn.Linear(dim, inner)
        self.to_k = nn.Linear(dim, inner)
        self.to_v = nn.Linear(dim, inner)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim)])
        self.kernels = NATIVE_KERNELS
        self.qkv: tuple[torch.Tensor, torch.Tensor] | None = None  # packed weight, bias (`pack_qkv`)

    def forward(self, x, rope, mask=None, bias=None):
        # x: [B, N, D], rope: (cos, sin) [N, dim_head], mask: [B, N] bool or None (all valid),
        # bias: [B, 1, 1, N] additive mask made once per forward, or None -> [B, N, D] (padded frames
        # not zeroed: the residual op does that)
        b, n, _ = x.shape
        q, k, v = self._project(x)
        q, k = self.kernels.rope(q, k, *rope)
        q, k, v = (t.view(b, n, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        if bias is None and mask is not None:
            bias = mask[:, None, None, :].expand(b, self.heads, n, n)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.to_out[0](out.transpose(1, 2).reshape(b, n, -1))

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.qkv is None:
            return self.to_q(x), self.to_k(x), self.to_v(x)
        weight, bias = self.qkv
        return F.linear(x, weight, bias).split(self.to_q.out_features, dim=-1)

    def check_packing(self) -> None:
        """Raise if q/k/v's weights were replaced after packing (checked by DiT.forward, outside the blocks:
        a data-pointer comparison inside a block would break a compiled block's graph)."""
        if self.qkv is not None and self.to_q.weight.data_ptr() != self.qkv[0].data_ptr():
            raise RuntimeError(
                "the DiT's q/k/v weights were replaced after packing (e.g. by .to()): "
                "call DiT.set_kernels again to repack them"
            )

    def pack_qkv(self) -> None:
        """Make to_q/to_k/to_v's parameters views of one [3 * inner, dim] buffer (values unchanged)."""
        if self.qkv is not None:
            return
        projs = (self.to_q, self.to_k, self.to_v)
        with _like_parameters(self.to_q.weight):
            weight = torch.cat([p.weight.detach() for p in projs])
            bias = torch.cat([p.bias.detach() for p in projs])
            rows = self.to_q.out_features
            for i, p in enumerate(projs):
                p.weight.data, p.bias.data = (
                    weight[i * rows : (i + 1) * rows],
                    bias[i * rows : (i + 1) * rows],
                )
        self.qkv = (weight, bias)

    def unpack_qkv(self) -> None:
        """Give each projection its own storage again (undoes `pack_qkv`)."""
        if self.qkv is None:
            return
        with _like_parameters(self.to_q.weight):
            for p in (self.to_q, self.to_k, self.to_v):
                p.weight.data, p.bias.data = p.weight.detach().clone(), p.bias.detach().clone()
        self.qkv = None


class AdaLayerNormZero(nn.Module):
    def __init__(self, dim: int, n_chunks: int):
        super().__init__()
        self.linear = nn.Linear(dim, dim * n_chunks)
        self.n_chunks = n_chunks

    def forward(self, emb: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # emb: [B, D] -> n_chunks tensors [B, 1, D]
        return tuple(c[:, None] for c in self.linear(F.silu(emb)).chunk(self.n_chunks, dim=1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, mult: int):
        super().__init__()
        inner = int(dim * mult)
        self.ff = nn.Sequential(
            nn.Sequential(nn.Linear(dim, inner), nn.GELU(approximate="tanh")),
            nn.Identity(),
            nn.Linear(inner, dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ff(x)


class DiTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int, ff_mult: int):
        super().__init__()
        self.attn_norm = AdaLayerNormZero(dim, 6)
        self.attn = Attention(dim, heads, dim_head)
        self.ff = FeedForward(dim, ff_mult)
        self.kernels = NATIVE_KERNELS

    def forward(self, x, t, rope, mask=None, bias=None):
        # x: [B, N, D], t: [B, D]; bias: the attention mask made once per forward (DiTKernels)
        # eps is a literal, not a global: torch.compile(dynamic=True) makes a global float an input
        k = self.kernels
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.attn_norm(t)
        norm = k.modulated_norm(x, shift_msa, scale_msa, 1e-6)
        x, norm = k.residual_norm(
            x, self.attn(norm, rope, mask, bias), gate_msa, mask, shift_mlp, scale_mlp, 1e-6
        )
        return k.gated_residual(x, self.ff(norm), gate_mlp)


class DiT(nn.Module):
    """Velocity estimator v(x_t, prompt, condition, t, d) -> [B, N, mel_dim]."""

    def __init__(self, dim, depth, heads, dim_head, ff_mult, mel_dim, text_dim, n_conv_layers):
        super().__init__()
        self.time_embed = TimestepEmbedding(dim)
        self.d_embed = TimestepEmbedding(dim)
        self.text_embed = TextEmbedding(text_dim, n_conv_layers)
        self.input_embed = InputEmbedding(mel_dim, text_dim, dim)
        self.rotary_embed = RotaryEmbedding(dim_head)
        self.transformer_blocks = nn.ModuleList(DiTBlock(dim, heads, dim_head, ff_mult) for _ in range(depth))
        self.norm_out = AdaLayerNormZero(dim, 2)
        self.proj_out = nn.Linear(dim, mel_dim)
        self.schedule: Schedule = uniform_steps
        self.step_cache: StepCache | None = None
        self.weights_version = 0  # bumped when set_kernels moves weights (graph identity)
        self.kernels = NATIVE_KERNELS

    def set_kernels(self, kernels: DiTKernels) -> DiTKernels:
        """Run the block ops through `kernels` from now on (packing or unpacking q/k/v's weights as it
        says); returns the previous set. CUDA graphs captured before run the old functions."""
        previous, self.kernels = self.kernels, kernels
        # Packing and unpacking move q/k/v's weights to new storage: graphs captured on the old
        # storage must not replay (an A -> B -> A change leaves `kernels` as it was, not the storage).
        self.weights_version += 1
        for conv_block in self.text_embed.text_blocks:
            conv_block.kernels = kernels
        for block in self.transformer_blocks:
            block.kernels = block.attn.kernels = kernels
            if kernels.is_qkv_packed:
                block.attn.pack_qkv()
            else:
                block.attn.unpack_qkv()
        return previous

    def set_schedule(self, schedule: Schedule) -> Schedule:
        """The solver's step sizes from now on; returns the previous schedule."""
        previous, self.schedule = self.schedule, schedule
        return previous

    def set_step_cache(self, cache: StepCache | None) -> StepCache | None:
        """Reuse deep-block work across steps (None: never); returns the previous setting."""
        previous, self.step_cache = self.step_cache, cache
        return previous

    def condition(
        self, mu: torch.Tensor, d: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Step-invariant parts: text embedding [B, N, text_dim] and step-size embedding [B, dim]."""
        # mu: [B, N, text_dim], d: [B] solver step size, mask: [B, N] valid frames or None
        return self.text_embed(mu, mask), self.d_embed(d)

    def forward(self, x, cond, text_emb, t, d_emb, mask=None, reuse: BlockReuse | None = None):
        # x, cond: [B, N, mel] noisy mel and prompt mel, text_emb: [B, N, text_dim], t: [B], d_emb: [B, dim]
        for block in self.transformer_blocks:
            block.attn.check_packing()
        temb = self.time_embed(t) + d_emb
        h = self.input_embed(x, cond, text_emb, mask)
        rope = self.rotary_embed(x.shape[1])
        make_bias = self.kernels.attention_bias
        bias = None if mask is None or make_bias is None else make_bias(mask, h.dtype)
        h = self.run_blocks(h, temb, rope, mask, reuse, bias)
        scale, shift = self.norm_out(temb)
        return self.proj_out(self.kernels.modulated_norm(h, shift, scale, 1e-6))

    def run_blocks(
        self, h, temb, rope, mask=None, reuse: BlockReuse | None = None, bias=None
    ) -> torch.Tensor:
        """The transformer stack; with `reuse`, blocks[reuse.start:] run or are stood in for (see StepCache)."""
        # h: [B, N, dim]; bias: the attention mask made once per forward, or None (see DiTKernels)
        blocks = self.transformer_blocks
        start = len(blocks) if reuse is None else reuse.start
        for block in blocks[:start]:
            h = block(h, temb, rope, mask, bias)
        if reuse is None:
            return h
        if reuse.is_reusing:
            assert reuse.residual is not None, "a step cache reuses only after a refresh step"
            return h + reuse.residual
        deep_in = h
        for block in blocks[start:]:
            h = block(h, temb, rope, mask, bias)
        reuse.residual = h - deep_in
        return h


class CFM(nn.Module):
    """Holds the estimator under `estimator`, matching upstream's `cfm.estimator.*` names."""

    def __init__(self, estimator: DiT):
        super().__init__()
        self.estimator = estimator
