"""Shared inputs of the fused T2S decode stack tests (test_kernels_t2s_layer*.py): random weights, caches
and embeddings at a tiny shape (and the full v3 size for the GPU), NaN in the cache slots past each row's
length, and the full-size check against the fp32 definition. Not a test module: the test modules import
these names.
"""

from __future__ import annotations

import torch
from test_kernels import rel_l2

from voicehub.runtime.kernels import t2s_layer as ref

FP32_TOL, FP16_TOL = 1e-5, 1e-2  # rel. L2
SHAPE = {"n_layer": 2, "dim": 32, "n_head": 2, "ffn_dim": 128, "vocab": 40}
N_SLOTS, MAX_SLOTS = 72, 80
FULL = {"n_layer": 24, "dim": 512, "n_head": 16, "ffn_dim": 2048, "vocab": 1025}


def random_weights(n_layer, dim, n_head, ffn_dim, vocab, dtype=torch.float32, seed=0, device="cpu"):
    """Non-degenerate random weights: unit-scale activations, logits spread over a few units."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0, mean=0.0):
        return (mean + scale * torch.randn(*shape, generator=g)).to(device=device, dtype=dtype)

    def layer():
        return ref.LayerWeights(
            r(3 * dim, dim, scale=1.4 / dim**0.5), r(3 * dim, scale=0.02), r(dim, dim, scale=dim**-0.5),
            r(dim, scale=0.02), r(dim, scale=0.1, mean=1.0), r(dim, scale=0.1), r(ffn_dim, dim, scale=dim**-0.5),
            r(ffn_dim, scale=0.02), r(dim, ffn_dim, scale=ffn_dim**-0.5), r(dim, scale=0.02),
            r(dim, scale=0.1, mean=1.0), r(dim, scale=0.1),
        )  # fmt: skip

    layers = tuple(layer() for _ in range(n_layer))
    return ref.StackWeights(layers, r(vocab, dim, scale=4 / dim**0.5), n_head, 1e-5)


def random_cache(n_layer, n_rows, n_head, head_dim, lengths, dtype=torch.float32, seed=1, device="cpu"):
    """k, v [L, B, H, MAX_SLOTS, Dh]: random below each row's length, NaN from it on (unwritten)."""
    g = torch.Generator().manual_seed(seed)
    shape = (n_layer, n_rows, n_head, MAX_SLOTS, head_dim)
    k, v = (torch.randn(shape, generator=g).to(device=device, dtype=dtype) for _ in range(2))
    for row, n in enumerate(lengths):
        k[:, row, :, n:] = float("nan")
        v[:, row, :, n:] = float("nan")
    return k, v


def as_float(t):
    """A float64 copy with NaN (unwritten slots) as 0, for the references."""
    return t.double().nan_to_num(0.0)


def stack_inputs(n_rows, dtype, lengths, seed=0):
    s = SHAPE
    weights = random_weights(s["n_layer"], s["dim"], s["n_head"], s["ffn_dim"], s["vocab"], dtype, seed)
    k, v = random_cache(s["n_layer"], n_rows, s["n_head"], s["dim"] // s["n_head"], lengths, dtype, seed + 1)
    x = torch.randn(n_rows, s["dim"], generator=torch.Generator().manual_seed(seed + 2)).to(dtype)
    return x, weights, k, v, torch.tensor(lengths)


def random_embed(n_tokens, n_positions, dim, dtype=torch.float32, seed=3, device="cpu"):
    """EmbedWeights: a unit-scale table, a sinusoid-sized pe and an alpha away from 1 (so its product rounds)."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(n_tokens, dim, generator=g)
    pe = torch.rand(n_positions, dim, generator=g) * 2 - 1
    alpha = torch.tensor([0.7311])
    return ref.EmbedWeights(*(t.to(device=device, dtype=dtype) for t in (table, pe, alpha)))


def token_inputs(n_rows, seed=4):
    """tokens and audio_pos [B] for random_embed's tables (tokens < 50, positions < 200)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 50, (n_rows,), generator=g), torch.randint(0, 200, (n_rows,), generator=g)


def embed_as(embed, fn):
    return ref.EmbedWeights(*(fn(t) for t in embed))


def weights_as(weights, fn):
    layers = tuple(ref.LayerWeights(*(fn(t) for t in layer)) for layer in weights.layers)
    return ref.StackWeights(layers, fn(weights.head_weight), weights.n_head, weights.eps)


def check_full_size_stack(stack, x, w, k, v, lengths, dtype) -> torch.Tensor:
    """stack(x, w, k, v, lengths, 1024) against the fp32 definition: its logits and the k, v it writes."""
    k_want, v_want = k.float(), v.float()
    want = ref.decode_stack_reference(
        x.float(), weights_as(w, torch.Tensor.float), k_want, v_want, lengths, 1024
    )
    got = stack(x, w, k, v, lengths, 1024)
    tol = FP16_TOL if dtype == torch.float16 else 1e-4
    assert rel_l2(got, want) <= tol and rel_l2(k, k_want) <= tol and rel_l2(v, v_want) <= tol
    return got
