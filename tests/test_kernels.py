"""Kernel registry rules and the portable `torch` backends against each op's reference (CPU)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from voicehub.models.gpt_sovits.bigvgan.activation import anti_alias_snake_torch
from voicehub.runtime.kernels import registry
from voicehub.runtime.kernels.anti_alias_snake import (
    anti_alias_snake_polyphase,
    anti_alias_snake_reference,
)
from voicehub.runtime.kernels.registry import Backend, KernelUnavailableError


def rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| in float64; inf when got has any non-finite value (NaN never passes)."""
    assert got.shape == want.shape, (got.shape, want.shape)
    if not torch.isfinite(got).all():
        return float("inf")
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def snake_inputs(batch: int, channels: int, length: int, logscale: bool, seed: int, is_beta: bool = True):
    """Random x [B, C, T]; random asymmetric filters (a flipped or shifted tap would show);
    alpha, beta [C] spread around a factor of 1 (plain Snake passes beta = alpha)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, channels, length, generator=g)
    up, down = torch.randn(1, 1, 12, generator=g), torch.randn(1, 1, 12, generator=g)
    centre = 0.0 if logscale else 1.0
    alpha = centre + 0.5 * torch.randn(channels, generator=g)
    beta = centre + 0.5 * torch.randn(channels, generator=g) if is_beta else alpha
    return x, up, down, alpha, beta, logscale


def test_importing_the_registry_imports_no_triton():
    code = (
        "import sys; from voicehub.runtime.kernels import registry; "
        "registry.available('anti_alias_snake', 'triton', 'cpu'); "
        "assert 'triton' not in sys.modules, 'triton was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_unknown_names_raise_with_the_valid_ones():
    with pytest.raises(ValueError, match="registered ops: anti_alias_snake"):
        registry.available("snake", "torch", "cpu")
    with pytest.raises(ValueError, match="valid backends: torch, triton, cuda_extension"):
        registry.get("add_layer_norm", "cuda")


def test_available_gives_reasons(monkeypatch: pytest.MonkeyPatch):
    assert registry.available(registry.DECODE_ATTENTION, "torch", "cpu") is None
    reason = registry.available(registry.ANTI_ALIAS_SNAKE, Backend.CUDA_EXTENSION, "cpu")
    assert reason is not None and "no cuda_extension implementation" in reason
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    reason = registry.available(registry.ADD_LAYER_NORM, "triton", "cpu")
    assert reason is not None and ("CUDA device" in reason or "not installed" in reason)
    with pytest.raises(KernelUnavailableError, match="add_layer_norm on triton"):
        registry.resolve(registry.ADD_LAYER_NORM, "triton", "cpu")
    with pytest.raises(ValueError, match="no cuda_extension implementation"):
        registry.get(registry.ANTI_ALIAS_SNAKE, "cuda_extension")


def test_every_op_has_a_reference_and_torch_backend():
    for op in registry.ops():
        assert callable(registry.reference(op))
        assert Backend.TORCH in registry.backends(op)
        assert callable(registry.resolve(op, "torch", "cpu"))


def test_the_bigvgan_module_uses_the_ops_reference_definition():
    # one definition: the model's own activation is the op's reference, to which backends are held
    assert anti_alias_snake_torch is anti_alias_snake_reference


@pytest.mark.parametrize(
    ("shape", "logscale", "is_beta"),
    [((1, 1, 1), True, True), ((2, 3, 2), False, True), ((1, 4, 5), True, False),
     ((2, 3, 11), False, False), ((1, 2, 300), True, True)],
)  # fmt: skip
def test_polyphase_torch_backend_equals_reference(shape, logscale: bool, is_beta: bool):
    args = snake_inputs(*shape, logscale, seed=sum(shape), is_beta=is_beta)
    assert rel_l2(anti_alias_snake_polyphase(*args), anti_alias_snake_reference(*args)) < 1e-5
    doubles = tuple(a.double() if isinstance(a, torch.Tensor) else a for a in args)
    assert rel_l2(anti_alias_snake_polyphase(*doubles), anti_alias_snake_reference(*doubles)) < 1e-12


def masked_rows_alone(op, args: tuple, valid: list[int]) -> torch.Tensor:
    """What a masked call must give: each row's op over its first valid[b] samples alone, zeros after."""
    x, rest = args[0], args[1:]
    want = torch.zeros_like(x)
    for b, n in enumerate(valid):
        if n > 0:
            want[b, :, :n] = op(x[b : b + 1, :, :n], *rest)[0]
    return want


@pytest.mark.parametrize("op", [anti_alias_snake_reference, anti_alias_snake_polyphase])
@pytest.mark.parametrize(
    ("length", "valid"), [(40, [40, 17, 1, 0]), (9, [3, 9, 4, 8]), (300, [299, 5, 150, 300])]
)
def test_masked_rows_equal_the_op_of_their_valid_samples(op, length: int, valid: list[int]):
    # the masked op is a row ending at valid[b]: both borders replicated there, zeros past it; the
    # samples past it (random here) must change nothing
    args = snake_inputs(len(valid), 3, length, True, seed=length)
    got = op(*args, valid=torch.tensor(valid, dtype=torch.int32))
    want = masked_rows_alone(anti_alias_snake_reference, args, valid)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)  # zeros past each length included
    # all rows full: the unmasked op
    full = torch.full((len(valid),), length, dtype=torch.int64)
    assert torch.allclose(op(*args, valid=full), op(*args), atol=1e-5, rtol=1e-5)


def test_masked_op_rejects_bad_lengths():
    x, up, down, alpha, beta, logscale = snake_inputs(2, 2, 8, True, seed=3)
    with pytest.raises(ValueError, match="valid must be an integer tensor"):
        anti_alias_snake_reference(x, up, down, alpha, beta, logscale, valid=torch.tensor([8.0, 8.0]))
    with pytest.raises(ValueError, match="valid must be an integer tensor"):
        anti_alias_snake_reference(x, up, down, alpha, beta, logscale, valid=torch.tensor([8]))


def test_polyphase_keeps_dtype_and_rejects_bad_filters():
    x, up, down, alpha, beta, logscale = snake_inputs(1, 2, 8, True, seed=3)
    halves = (t.half() for t in (x, up, down, alpha, beta))
    assert anti_alias_snake_polyphase(*halves, True).dtype == torch.float16
    with pytest.raises(ValueError, match="12 taps"):
        anti_alias_snake_polyphase(x, up[..., :10], down, alpha, beta, logscale)
    with pytest.raises(ValueError, match="channels"):
        anti_alias_snake_polyphase(x, up, down, alpha[:1], beta, logscale)
