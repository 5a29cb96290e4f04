"""VITS optimizations on the CPU: the fused SDPA relative attention against the native one, and the
attention and compile transforms on the embedded Piper voice (fp32; compile with 'aot_eager')."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from voicehub.models.vits import load, optimization, resolve
from voicehub.models.vits.attention_sdpa import relative_attention_sdpa, sdpa_unavailable
from voicehub.models.vits.phonemes import Sentence
from voicehub.models.vits.text_encoder import relative_attention_native
from voicehub.optimization import (
    OptimizationNotImplementedError,
    TTSOptimizationConfig,
    apply_load_time_config,
)
from voicehub.runtime.compile import is_compiled

TOL = 1e-5  # fp32 relative L2: the same function through other kernels
# Fixed phonemes (espeak-ng output for "The weather turned cold overnight."), so no phonemizer is needed.
PHONEMES = tuple("ðə wˈɛðɚ tˈɜːnd kˈoʊld ˌoʊvɚnˈaɪt.")


@pytest.fixture(scope="module")
def joe():
    model = load(resolve("en_US-joe-medium"))
    model.phonemize = lambda text: iter([Sentence(text, PHONEMES)])
    return model


def _rel(a, b) -> float:
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    return float((a - b).norm() / b.norm())


def _attention_inputs(b, h, t, d, window, n_rel, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, t, d, generator=g) for _ in range(3))
    rel_k, rel_v = (torch.randn(n_rel, 2 * window + 1, d, generator=g) for _ in range(2))
    return q, k, v, rel_k, rel_v


@pytest.mark.parametrize(
    ("t", "window", "n_rel"),
    [(37, 4, 1), (3, 4, 1), (1, 4, 1), (50, 4, 2), (129, 10, 1)],
    ids=["long", "shorter-than-window", "one", "per-head-relative", "wide-window"],
)
def test_fused_relative_attention_equals_native(t, window, n_rel):
    q, k, v, rel_k, rel_v = _attention_inputs(2, 2, t, 16, window, n_rel)
    mask = torch.ones(2, 1, t, t)
    fused = relative_attention_sdpa(q, k, v, rel_k, rel_v, mask)
    native = relative_attention_native(q, k, v, rel_k, rel_v, mask)
    assert _rel(fused, native) <= TOL


def test_fused_relative_attention_with_padding_equals_native_on_valid_rows():
    q, k, v, rel_k, rel_v = _attention_inputs(2, 2, 20, 8, 4, 1)
    lengths = torch.tensor([20, 13])
    valid = (torch.arange(20)[None, :] < lengths[:, None]).float()  # [B, T]
    mask = (valid[:, None, :, None] * valid[:, None, None, :]).contiguous()  # [B, 1, T, T]
    fused = relative_attention_sdpa(q, k, v, rel_k, rel_v, mask)
    native = relative_attention_native(q, k, v, rel_k, rel_v, mask)
    assert _rel(fused[0], native[0]) <= TOL and _rel(fused[1, :, :13], native[1, :, :13]) <= TOL


def test_the_probe_passes_on_the_cpu():
    assert sdpa_unavailable(torch.device("cpu"), torch.float32) is None


def test_sdpa_transform_is_exact_and_restores(joe):
    ids = torch.tensor([[1, 8, 20, 31, 5, 59, 12, 3, 2]])
    mask = torch.ones(1, 1, ids.shape[1])
    with torch.inference_mode():
        enc_native = joe.network.enc_p(ids, mask)[0]
    native = joe.generate("The weather turned cold overnight.", seed=4).audio
    result = joe.optimize(TTSOptimizationConfig(attn_implementation="sdpa"))
    try:
        with torch.inference_mode():
            enc_fused = joe.network.enc_p(ids, mask)[0]
        fused = joe.generate("The weather turned cold overnight.", seed=4).audio
        layers = joe.network.enc_p.encoder.attn_layers
        assert all(layer.attend is relative_attention_sdpa for layer in layers)
        manifest = json.loads(result.manifest())
    finally:
        joe.restore_tts_optimization()
    assert _rel(enc_fused, enc_native) <= TOL
    # Same durations (so the same length) and the same audio within fp32 tolerance.
    assert fused.shape == native.shape and _rel(fused, native) <= 1e-4
    assert manifest["applied"] == [
        {"name": "vits.attention.sdpa", "feature": "attention", "technique": "sdpa"}
    ]
    assert np.array_equal(joe.generate("The weather turned cold overnight.", seed=4).audio, native)


def test_compile_transform_is_exact_and_restores(joe, monkeypatch):
    monkeypatch.setattr(optimization, "COMPILE_BACKEND", "aot_eager")
    net = joe.network
    native = joe.generate("The weather turned cold overnight.", seed=4).audio
    result = joe.optimize(TTSOptimizationConfig(compile="required"))
    try:
        assert is_compiled(net.dec) and is_compiled(net.flow, "reverse")
        compiled = joe.generate("The weather turned cold overnight.", seed=4).audio
        (applied,) = json.loads(result.manifest())["applied"]
    finally:
        joe.restore_tts_optimization()
    assert compiled.shape == native.shape and _rel(compiled, native) <= TOL
    assert applied["details"] == {"backend": "aot_eager", "modules": ["dec", "flow.reverse"]}
    assert not is_compiled(net.dec) and not is_compiled(net.flow, "reverse")
    assert np.array_equal(joe.generate("The weather turned cold overnight.", seed=4).audio, native)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_declared_vits_kernels_raise_not_implemented(joe, backend):
    with pytest.raises(OptimizationNotImplementedError, match="not implemented yet for vits"):
        joe.optimize(TTSOptimizationConfig(kernel_backend=backend))
    assert joe.optimization_result is None


def test_lazy_voice_applies_the_config_when_its_weights_load():
    lazy = load(resolve("en_US-joe-medium"), lazy_load=True)
    assert apply_load_time_config(lazy, TTSOptimizationConfig(attn_implementation="sdpa")) is None
    assert not lazy.is_runtime_loaded
    layers = lazy.network.enc_p.encoder.attn_layers  # reading the weights applies the pending config
    assert all(layer.attend is relative_attention_sdpa for layer in layers)
    assert [a.technique for a in lazy.optimization_result.applied] == ["sdpa"]


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-3), (torch.float16, 1e-2)])
def test_cuda_fused_relative_attention_equals_native(dtype, tol):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    dev = torch.device("cuda")
    assert sdpa_unavailable(dev, dtype) is None
    for t in (1, 7, 37, 130, 301):
        q, k, v, rel_k, rel_v = (x.to(dev, dtype) for x in _attention_inputs(1, 2, t, 96, 4, 1, seed=t))
        mask = torch.ones(1, 1, t, t, device=dev, dtype=dtype)
        fused = relative_attention_sdpa(q, k, v, rel_k, rel_v, mask)
        native = relative_attention_native(
            q.float(), k.float(), v.float(), rel_k.float(), rel_v.float(), mask.float()
        )
        assert _rel(fused.float().cpu(), native.cpu()) <= tol, t
