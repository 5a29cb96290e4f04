"""A post-norm decoder's whole decode step after the embedding, as one op: every layer, then the head.

Op signature (every backend): `f(x, weights, k_cache, v_cache, lengths, n_slots) -> logits`, with
x: [B, D] each row's embedded input token; weights: `StackWeights`; k_cache, v_cache:
[L, B, H, S, Dh] (any strides with a unit last stride: a static cache, possibly narrowed to B rows);
lengths: [B] integer, the slots each row has cached; n_slots: the KV bucket, <= S. Layer l writes
row b's key and value at slot lengths[b] of layer l (when it is < S) and attends to slots
[0, min(lengths[b] + 1, n_slots)); lengths is not advanced. Each layer is post-norm (GPT-SoVITS T2S):
x = LN1(x + out(attn(x))); x = LN2(x + W2 relu(W1 x + b1) + b2). Returns logits [B, V] in x's dtype.

The variant op with the input embedding inside (T2S_EMBED_STACK, so a decode step runs no torch
kernel before the stack): `f(tokens, audio_pos, embed, weights, k_cache, v_cache, lengths, n_slots)
-> logits`, tokens and audio_pos [B] integer, embed: `EmbedWeights`; x = table[tokens] + alpha *
pe[audio_pos] as `T2SModel.embed_audio_at` computes it (`embed_stack_reference`), then the stack.

`decode_stack_reference` is the definition. The Triton backend runs each layer as three kernels
that hand sums over to the next kernel as 32.32 fixed-point int64 accumulators (added with integer
atomics, so the total does not depend on the order of the adds: deterministic and batch-invariant).
The `*_stage_reference` functions state each kernel's contract in torch, accumulators included.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

FIXED_POINT_SCALE = 2.0**32  # accumulator units per 1.0: 32 fraction bits, |sum| < 2**31


class LayerWeights(NamedTuple):
    """One post-norm layer: qkv [3D, D] + [3D] (q, k, v stacked, heads contiguous), out [D, D] + [D],
    norm1 [D] x2, ffn1 [F, D] + [F], ffn2 [D, F] + [D], norm2 [D] x2. Contiguous tensors."""

    qkv_weight: torch.Tensor
    qkv_bias: torch.Tensor
    out_weight: torch.Tensor
    out_bias: torch.Tensor
    norm1_weight: torch.Tensor
    norm1_bias: torch.Tensor
    ffn1_weight: torch.Tensor
    ffn1_bias: torch.Tensor
    ffn2_weight: torch.Tensor
    ffn2_bias: torch.Tensor
    norm2_weight: torch.Tensor
    norm2_bias: torch.Tensor


class StackWeights(NamedTuple):
    """Every layer, the bias-free head [V, D], the head count and the LayerNorms' epsilon."""

    layers: tuple[LayerWeights, ...]
    head_weight: torch.Tensor
    n_head: int
    eps: float


class EmbedWeights(NamedTuple):
    """The decoder's input embedding x = table[token] + alpha * pe[position]: table [V_in, D] (token
    embeddings), pe [P, D] (the sinusoid table), alpha [1] (its learned scale). Contiguous, the
    stack's dtype. Positions must be < P (the torch reference raises past it; the kernel does not check)."""

    table: torch.Tensor
    pe: torch.Tensor
    alpha: torch.Tensor


def check_args(
    x: torch.Tensor, weights: StackWeights, k_cache: torch.Tensor, v_cache: torch.Tensor,
    lengths: torch.Tensor, n_slots: int,
) -> None:  # fmt: skip
    n_layer, n_head = len(weights.layers), weights.n_head
    n_rows, dim = x.shape if x.dim() == 2 else (-1, -1)
    want = (n_layer, n_rows, n_head, k_cache.shape[3] if k_cache.dim() == 5 else -1, dim // n_head)
    if dim % n_head or tuple(k_cache.shape) != want or v_cache.shape != k_cache.shape:
        raise ValueError(
            f"t2s_layer_stack takes x [B, D] and k, v caches [L, B, H, S, D/H]; got x {tuple(x.shape)}, "
            f"k {tuple(k_cache.shape)}, v {tuple(v_cache.shape)} for {n_layer} layers of {n_head} heads"
        )
    if lengths.shape != (n_rows,) or lengths.is_floating_point():
        raise ValueError(f"t2s_layer_stack: lengths must be an integer tensor [B={n_rows}]")
    if not 1 <= n_slots <= k_cache.shape[3]:
        raise ValueError(f"t2s_layer_stack: n_slots {n_slots} must be in [1, {k_cache.shape[3]}]")
    if any(t.dtype != x.dtype or t.stride(-1) != 1 for t in (x, k_cache, v_cache)):
        raise ValueError(f"t2s_layer_stack: x and the caches must be {x.dtype} with a unit last stride")
    tensors = [weights.head_weight, *(t for layer in weights.layers for t in layer)]
    if any(not t.is_contiguous() or t.dtype != x.dtype for t in tensors):
        raise ValueError(f"t2s_layer_stack: every weight must be a contiguous {x.dtype} tensor")


def check_embed_args(
    tokens: torch.Tensor, audio_pos: torch.Tensor, embed: EmbedWeights, weights: StackWeights
) -> None:
    dim, dtype = weights.head_weight.shape[1], weights.head_weight.dtype
    n_rows = tokens.shape[0] if tokens.dim() == 1 else -1
    if audio_pos.shape != (n_rows,) or tokens.is_floating_point() or audio_pos.is_floating_point():
        raise ValueError(
            f"t2s_embed_layer_stack takes integer tokens and audio_pos [B]; got {tuple(tokens.shape)} "
            f"{tokens.dtype} and {tuple(audio_pos.shape)} {audio_pos.dtype}"
        )
    shapes = (embed.table.shape[1:], embed.pe.shape[1:], embed.alpha.shape)
    if shapes != ((dim,), (dim,), (1,)) or embed.table.dim() != 2 or embed.pe.dim() != 2:
        raise ValueError(
            f"t2s_embed_layer_stack: embedding table and pe must be [*, {dim}] and alpha [1]; got "
            f"{tuple(embed.table.shape)}, {tuple(embed.pe.shape)}, {tuple(embed.alpha.shape)}"
        )
    if any(not t.is_contiguous() or t.dtype != dtype for t in embed):
        raise ValueError(f"t2s_embed_layer_stack: the embedding tensors must be contiguous {dtype} tensors")


def embed_reference(tokens: torch.Tensor, audio_pos: torch.Tensor, embed: EmbedWeights) -> torch.Tensor:
    """tokens, audio_pos: [B] -> x [B, D]: `embed_audio_at`'s ops, rounded to the tables' dtype
    where torch stores a tensor (alpha * pe, then the sum)."""
    return embed.table[tokens] + embed.alpha * embed.pe[audio_pos]


def attend_cached(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor, n_slots: int
) -> torch.Tensor:
    """q: [B, H, Dh]; k, v: [B, H, S, Dh] holding this step's key at slot lengths -> [B, H, Dh]:
    the static step's masked attention over the first n_slots slots (slots <= lengths)."""
    slots = torch.arange(n_slots, device=k.device)
    mask = (slots[None, :] <= lengths[:, None])[:, None, None, :]
    out = F.scaled_dot_product_attention(q[:, :, None], k[:, :, :n_slots], v[:, :, :n_slots], attn_mask=mask)
    return out[:, :, 0]


def write_kv(k_layer: torch.Tensor, v_layer: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths) -> None:
    """k_layer, v_layer: [B, H, S, Dh]; k, v: [B, H, Dh] written at slot lengths[b] of row b."""
    rows = torch.arange(k.shape[0], device=k.device)
    k_layer[rows, :, lengths] = k
    v_layer[rows, :, lengths] = v


def decode_stack_reference(
    x: torch.Tensor, weights: StackWeights, k_cache: torch.Tensor, v_cache: torch.Tensor,
    lengths: torch.Tensor, n_slots: int,
) -> torch.Tensor:  # fmt: skip
    """Reference and `torch` backend, the unfused ops of the static decode step. [B, D] -> [B, V]."""
    check_args(x, weights, k_cache, v_cache, lengths, n_slots)
    n_rows, dim = x.shape
    h, eps = weights.n_head, weights.eps
    for i, w in enumerate(weights.layers):
        q, k, v = F.linear(x, w.qkv_weight, w.qkv_bias).view(n_rows, 3, h, -1).unbind(1)
        write_kv(k_cache[i], v_cache[i], k, v, lengths)
        attn = attend_cached(q, k_cache[i], v_cache[i], lengths, n_slots).reshape(n_rows, dim)
        x = x + F.linear(attn, w.out_weight, w.out_bias)
        x = F.layer_norm(x, (dim,), w.norm1_weight, w.norm1_bias, eps)
        ffn = F.linear(F.relu(F.linear(x, w.ffn1_weight, w.ffn1_bias)), w.ffn2_weight, w.ffn2_bias)
        x = F.layer_norm(x + ffn, (dim,), w.norm2_weight, w.norm2_bias, eps)
    return F.linear(x, weights.head_weight)


def embed_stack_reference(
    tokens: torch.Tensor, audio_pos: torch.Tensor, embed: EmbedWeights, weights: StackWeights,
    k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor, n_slots: int,
) -> torch.Tensor:  # fmt: skip
    """Reference and `torch` backend of T2S_EMBED_STACK: the embedding, then the stack. [B] -> [B, V]."""
    check_embed_args(tokens, audio_pos, embed, weights)
    return decode_stack_reference(
        embed_reference(tokens, audio_pos, embed), weights, k_cache, v_cache, lengths, n_slots
    )


# -- the staged formulation: each Triton kernel's contract --------------------------------------


def to_fixed(v: torch.Tensor) -> torch.Tensor:
    """float -> int64 accumulator units (truncated toward zero, as the kernels convert)."""
    return (v.float() * FIXED_POINT_SCALE).to(torch.int64)


def from_fixed(acc: torch.Tensor) -> torch.Tensor:
    """int64 accumulator -> float32 (one rounding of the exact sum)."""
    return acc.to(torch.float32) * (1.0 / FIXED_POINT_SCALE)


def post_norm_reference(
    residual: torch.Tensor, acc: torch.Tensor, bias: torch.Tensor, norm_w: torch.Tensor,
    norm_b: torch.Tensor, eps: float,
) -> torch.Tensor:  # fmt: skip
    """LN(residual + (sum + bias)), sum = from_fixed(acc); rounded to residual's dtype where the
    unfused ops round (the linear's output, the residual sum, the norm's output). [B, D] -> [B, D]."""
    dt = residual.dtype
    branch = (from_fixed(acc) + bias.float()).to(dt)
    return F.layer_norm(
        (residual + branch).float(), residual.shape[-1:], norm_w.float(), norm_b.float(), eps
    ).to(dt)


def qkv_stage_reference(
    x_in: torch.Tensor, acc: torch.Tensor | None, prev: LayerWeights | None, layer: LayerWeights,
    k_layer: torch.Tensor, v_layer: torch.Tensor, lengths: torch.Tensor, n_head: int, eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Kernel 1 of a layer: its input x (x_in itself for the first layer, else the previous layer's
    post_norm(x_in, acc, ffn2 bias, norm2)), then q, k, v = x W_qkv + b; k, v written at slot
    lengths. x_in, acc: [B, D] -> (x [B, D], q [B, D]). The kernel also zeroes the attention
    accumulator it hands to kernel 2."""
    x = x_in
    if prev is not None:
        x = post_norm_reference(x_in, acc, prev.ffn2_bias, prev.norm2_weight, prev.norm2_bias, eps)
    q, k, v = F.linear(x, layer.qkv_weight, layer.qkv_bias).view(x.shape[0], 3, n_head, -1).unbind(1)
    write_kv(k_layer, v_layer, k, v, lengths)
    return x, q.reshape(x.shape)


def attention_stage_reference(
    q: torch.Tensor, k_layer: torch.Tensor, v_layer: torch.Tensor, lengths: torch.Tensor, n_slots: int,
    out_weight: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """Kernel 2: attention over the cached slots and the out-projection without its bias, summed
    in fixed point one head at a time. q: [B, D] -> acc [B, D] int64. The kernel also zeroes
    the FFN accumulator it hands to kernel 3."""
    n_rows, dim = q.shape
    n_head, head_dim = k_layer.shape[1], k_layer.shape[3]
    attn = attend_cached(q.view(n_rows, n_head, head_dim), k_layer, v_layer, lengths, n_slots)
    per_head = torch.einsum("dhe,bhe->bhd", out_weight.float().view(dim, n_head, head_dim), attn.float())
    return to_fixed(per_head).sum(dim=1)


def ffn_stage_reference(
    x: torch.Tensor, acc: torch.Tensor, layer: LayerWeights, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel 3: x1 = post_norm(x, acc, out bias, norm1), then W2 relu(W1 x1 + b1) without the
    ffn2 bias, in fixed point. x, acc: [B, D] -> (x1 [B, D], acc [B, D] int64)."""
    x1 = post_norm_reference(x, acc, layer.out_bias, layer.norm1_weight, layer.norm1_bias, eps)
    hidden = F.relu(F.linear(x1, layer.ffn1_weight, layer.ffn1_bias))
    return x1, to_fixed(hidden.float() @ layer.ffn2_weight.float().T)


def head_stage_reference(
    x1: torch.Tensor, acc: torch.Tensor, last: LayerWeights, head_weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """The head kernel: the last layer's post_norm(x1, acc, ffn2 bias, norm2), then the logits."""
    x = post_norm_reference(x1, acc, last.ffn2_bias, last.norm2_weight, last.norm2_bias, eps)
    return F.linear(x, head_weight)


def staged_stack_reference(
    x: torch.Tensor, weights: StackWeights, k_cache: torch.Tensor, v_cache: torch.Tensor,
    lengths: torch.Tensor, n_slots: int,
) -> torch.Tensor:  # fmt: skip
    """The stage references chained as the Triton backend chains its kernels (for tests)."""
    check_args(x, weights, k_cache, v_cache, lengths, n_slots)
    x_in, acc, prev = x, None, None
    for i, layer in enumerate(weights.layers):
        x_attn, q = qkv_stage_reference(
            x_in, acc, prev, layer, k_cache[i], v_cache[i], lengths, weights.n_head, weights.eps
        )
        acc = attention_stage_reference(q, k_cache[i], v_cache[i], lengths, n_slots, layer.out_weight)
        x_in, acc = ffn_stage_reference(x_attn, acc, layer, weights.eps)
        prev = layer
    return head_stage_reference(x_in, acc, weights.layers[-1], weights.head_weight, weights.eps)
