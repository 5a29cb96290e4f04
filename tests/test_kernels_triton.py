"""Every Triton kernel against its op's reference, run by Triton's interpreter on the CPU.

@triton.jit reads TRITON_INTERPRET when a kernel module is imported and the interpreter reads it
again at each launch, so a module fixture sets it for these tests and imports the kernels through
the registry inside it. Outputs are poisoned with NaN before each run, so an element the kernel
forgets to write fails the comparison (NaN never passes). Shapes are small: the interpreter runs
each program in Python.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
from test_kernels import rel_l2, snake_inputs

from voicehub.runtime.kernels import registry
from voicehub.runtime.kernels.registry import ADD_LAYER_NORM, ANTI_ALIAS_SNAKE, DECODE_ATTENTION
from voicehub.runtime.kv_cache import StaticKVCache

FP32_TOL, FP16_TOL = 1e-3, 1e-2  # rel. L2, the GPU runtime issue's thresholds
KERNEL_MODULES = [f"voicehub.runtime.kernels.{m}_triton" for m in registry.ops()]


@pytest.fixture(scope="module")
def triton_kernel():
    """get(op) -> the Triton implementation of op, interpreted on the CPU."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed (pip install triton): Triton kernels untested here")
    imported = [m for m in KERNEL_MODULES if m in sys.modules]
    if imported and not _interpreted(imported[0]):
        pytest.skip(f"{imported[0]} was imported for a GPU before these tests; run them in their own process")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        for op in registry.ops():
            reason = registry.available(op, "triton", "cpu")
            if reason is not None:
                pytest.skip(f"Triton interpreter unusable here: {reason}")
        yield lambda op: registry.get(op, "triton")


def _interpreted(module_name: str) -> bool:
    module = sys.modules[module_name]
    kernels = [v for k, v in vars(module).items() if k.startswith("_") and k.endswith("_kernel")]
    return all(type(k).__name__ == "InterpretedFunction" for k in kernels)


def poisoned(shape, dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype)


def half(args: tuple) -> tuple:
    return tuple(a.half() if isinstance(a, torch.Tensor) else a for a in args)


@pytest.mark.parametrize(
    ("shape", "logscale", "is_beta"),
    [
        ((1, 1, 1), True, True),  # T = 1: every tap is a replicated border sample
        ((2, 3, 5), False, True),  # T shorter than the 12-tap filter
        ((1, 2, 37), True, False),  # plain Snake (beta = alpha), one partial tile
        ((1, 1, 1100), False, True),  # two tiles of 1016 outputs: a seam and a partial tile
    ],
)
def test_anti_alias_snake_triton(triton_kernel, shape, logscale: bool, is_beta: bool):
    kernel, ref = triton_kernel(ANTI_ALIAS_SNAKE), registry.reference(ANTI_ALIAS_SNAKE)
    args = snake_inputs(*shape, logscale, seed=sum(shape), is_beta=is_beta)
    out = poisoned(shape, torch.float32)
    assert kernel(*args, out=out) is out
    assert rel_l2(out, ref(*args)) <= FP32_TOL / 100  # float32 end to end: expect ~1e-7
    args16 = half(args)
    out16 = poisoned(shape, torch.float16)
    kernel(*args16, out=out16)
    assert out16.dtype == torch.float16
    assert rel_l2(out16, ref(*args)) <= FP16_TOL


def test_anti_alias_snake_triton_batch_and_channels_are_independent(triton_kernel):
    # each (batch, channel) row must use its own channel's alpha/beta and its own samples only
    kernel, ref = triton_kernel(ANTI_ALIAS_SNAKE), registry.reference(ANTI_ALIAS_SNAKE)
    x, up, down, alpha, beta, logscale = snake_inputs(3, 5, 9, True, seed=11)
    got = kernel(x, up, down, alpha, beta, logscale)
    for b, c in ((0, 0), (2, 4), (1, 3)):
        want = ref(x[b : b + 1, c : c + 1], up, down, alpha[c : c + 1], beta[c : c + 1], logscale)
        assert rel_l2(got[b, c], want[0, 0]) <= 1e-5


@pytest.mark.parametrize(("length", "valid"), [(37, [37, 20, 1, 0]), (1100, [1100, 1017, 3, 600])])
def test_anti_alias_snake_triton_masked_rows(triton_kernel, length: int, valid: list[int]):
    # per-row lengths read on the device: borders clamped at each row's length, zeros past it (a tile
    # seam at 1016 outputs and a length inside the second tile in the long case)
    kernel, ref = triton_kernel(ANTI_ALIAS_SNAKE), registry.reference(ANTI_ALIAS_SNAKE)
    args = snake_inputs(len(valid), 2, length, False, seed=length)
    lengths = torch.tensor(valid, dtype=torch.int32)
    out = poisoned((len(valid), 2, length), torch.float32)
    kernel(*args, lengths, out=out)
    want = ref(*args, valid=lengths)
    assert torch.allclose(out, want, atol=1e-5, rtol=1e-5)
    out16 = kernel(*half(args), lengths)
    assert rel_l2(out16, want) <= FP16_TOL
    assert (out16[1, :, valid[1] :] == 0).all()


@pytest.mark.parametrize("shape", [(1, 512), (3, 512), (2, 3, 48), (4, 100)])
def test_add_layer_norm_triton(triton_kernel, shape):
    kernel, ref = triton_kernel(ADD_LAYER_NORM), registry.reference(ADD_LAYER_NORM)
    g = torch.Generator().manual_seed(shape[-1])
    x, r = torch.randn(shape, generator=g), 3.0 + torch.randn(shape, generator=g)  # a mean to remove
    w, b = torch.randn(shape[-1], generator=g), torch.randn(shape[-1], generator=g)
    out = poisoned(shape, torch.float32)
    kernel(x, r, w, b, 1e-5, out=out)
    assert rel_l2(out, ref(x, r, w, b, 1e-5)) <= FP32_TOL / 100
    args16 = half((x, r, w, b))
    out16 = poisoned(shape, torch.float16)
    kernel(*args16, 1e-5, out=out16)
    assert rel_l2(out16, ref(*(a.double() for a in args16), 1e-5)) <= FP16_TOL


def _cache_with_stale_slots(n_slots: int, lengths: list[int], dtype: torch.dtype) -> StaticKVCache:
    """A 2-layer cache whose slots at or past each row's length hold NaN (stale or never written)."""
    g = torch.Generator().manual_seed(n_slots)
    cache = StaticKVCache(2, len(lengths), 2, n_slots, 32, device="cpu", dtype=dtype)
    cache.k.copy_(torch.randn(cache.k.shape, generator=g))
    cache.v.copy_(torch.randn(cache.v.shape, generator=g))
    for row, n in enumerate(lengths):
        cache.k[:, row, :, n:] = float("nan")
        cache.v[:, row, :, n:] = float("nan")
        cache.set_length(row, n)
    return cache


@pytest.mark.parametrize(
    ("n_slots", "lengths", "block"),
    [(64, [1, 64, 17], None), (100, [33, 99, 100], 32), (40, [40, 7, 1], 16)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decode_attention_triton_reads_true_lengths(triton_kernel, n_slots, lengths, block, dtype):
    kernel, ref = triton_kernel(DECODE_ATTENTION), registry.reference(DECODE_ATTENTION)
    cache = _cache_with_stale_slots(n_slots, lengths, dtype)
    g = torch.Generator().manual_seed(7)
    q = torch.randn(len(lengths), 2, 3, 32, generator=g).to(dtype)[:, :, 1]  # strided, as a qkv view
    k, v = cache.view(1, n_slots)
    n_valid = cache.lengths.clone()
    out = poisoned((len(lengths), 2, 32), dtype)
    kernel(q, k, v, n_valid, None, block=block, out=out)
    clean_k, clean_v = (t.float().nan_to_num(0.0) for t in (k, v))  # the reference must not see NaN
    want = ref(q.float(), clean_k, clean_v, n_valid)
    assert rel_l2(out, want) <= (FP32_TOL / 100 if dtype == torch.float32 else FP16_TOL)


def test_decode_attention_triton_matches_the_static_step_formulation(triton_kernel):
    # the static decode step appends the new key at slot `lengths` and attends through
    # cache.step_mask; the kernel with n_valid = lengths + 1 must give the same output
    import torch.nn.functional as F

    kernel = triton_kernel(DECODE_ATTENTION)
    cache = _cache_with_stale_slots(48, [5, 30, 47], torch.float32)
    g = torch.Generator().manual_seed(3)
    q, k_new, v_new = (torch.randn(3, 2, 32, generator=g) for _ in range(3))
    cache.append(0, k_new, v_new)
    keys, values = cache.view(0, 48)
    clean = (keys.nan_to_num(0.0), values.nan_to_num(0.0))
    want = F.scaled_dot_product_attention(q.unsqueeze(2), *clean, attn_mask=cache.step_mask(48))[:, :, 0]
    got = kernel(q, keys, values, cache.lengths + 1)
    assert rel_l2(got, want) <= 1e-5


def test_decode_attention_triton_empty_rows_are_zero(triton_kernel):
    kernel = triton_kernel(DECODE_ATTENTION)
    cache = _cache_with_stale_slots(32, [0, 3], torch.float32)
    q = torch.randn(2, 2, 32)
    k, v = cache.view(0, 32)
    out = kernel(q, k, v, torch.tensor([0, 3]), None, out=poisoned((2, 2, 32), torch.float32))
    assert torch.equal(out[0], torch.zeros(2, 32))
    assert torch.isfinite(out[1]).all()
