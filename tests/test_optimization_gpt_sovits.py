"""The optimization layer on a real GPT-SoVITS v3 model (tiny set, CPU): kernel transforms and refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
from gpt_sovits_fixtures import REFERENCE_TEXT, reference_wav, tiny_set  # noqa: F401 (fixtures)

from voicehub.models.gpt_sovits import Voice, load
from voicehub.models.gpt_sovits.bigvgan import anti_alias_snake_torch
from voicehub.models.gpt_sovits.optimization import KernelBackendTransform, OptimizationNotImplementedError
from voicehub.models.gpt_sovits.params import GptSovitsParams
from voicehub.optimization import OptimizationUnsupportedError, TTSOptimizationConfig
from voicehub.optimization.config import KernelBackend
from voicehub.optimization.errors import OptimizationStateError
from voicehub.optimization.families import FAMILY_CAPABILITIES
from voicehub.runtime.kernels import registry
from voicehub.text.options import Language

TOL = 1e-5  # the polyphase torch activation is exact up to float32 rounding


@pytest.fixture(scope="module")
def model(tiny_set):  # noqa: F811
    return load(tiny_set)


def _audio(model, voice) -> np.ndarray:
    pipe = model.pipeline
    sentence = pipe.text_features("A short test sentence.", Language.EN)
    params = GptSovitsParams.build(None, speed=1.0, force_n_tokens=8)
    return pipe.synthesize_sentence(pipe.reference(voice), sentence, params, seed=1).audio


def _activation_kernels(model) -> set:
    return {m.kernel for m in model.pipeline.vocoder.modules() if hasattr(m, "kernel")}


def test_torch_kernels_apply_and_restore(model, reference_wav):  # noqa: F811
    voice = Voice(reference_wav, REFERENCE_TEXT, "en")
    native = _audio(model, voice)
    result = model.optimize(TTSOptimizationConfig(kernel_backend="torch"))
    try:
        polyphase = registry.get(registry.ANTI_ALIAS_SNAKE, "torch")
        assert _activation_kernels(model) == {polyphase} and polyphase is not anti_alias_snake_torch
        optimized = _audio(model, voice)
        assert optimized.shape == native.shape
        np.testing.assert_allclose(optimized, native, rtol=0, atol=TOL)
        manifest = json.loads(result.manifest())
        assert manifest["applied"] == [
            {"name": "gpt_sovits.kernels.torch", "feature": "kernels", "technique": "torch"}
        ]
        assert manifest["plan"]["context"]["cuda_graph_preset"] == "off"
        with pytest.raises(OptimizationStateError):
            model.optimize(TTSOptimizationConfig(kernel_backend="torch"))
    finally:
        model.restore_tts_optimization()
    assert _activation_kernels(model) == {anti_alias_snake_torch}
    assert np.array_equal(_audio(model, voice), native)


def test_explicit_triton_on_cpu_raises_before_anything_changes(model):
    before = _activation_kernels(model)
    with pytest.raises(OptimizationUnsupportedError, match="cuda only"):
        model.optimize(TTSOptimizationConfig(kernel_backend="triton"))
    assert _activation_kernels(model) == before and model.optimization_result is None


def test_triton_transform_validate_gives_the_registry_reason(model, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    reason = registry.available(registry.ANTI_ALIAS_SNAKE, "triton", "cpu")
    assert reason is not None
    transform = KernelBackendTransform(model, KernelBackend.TRITON)
    with pytest.raises(OptimizationUnsupportedError) as info:
        transform.validate()
    assert reason in str(info.value)


@pytest.mark.parametrize(
    "config",
    [
        {"attn_implementation": "sdpa"},
        {"compile": "required"},
        {"diffusion_sampling": "required"},
        {"diffusion_cache": "required"},
    ],
)
def test_declared_but_not_implemented_techniques_raise(model, config):
    before = _activation_kernels(model)
    with pytest.raises(OptimizationNotImplementedError, match="not implemented yet"):
        model.optimize(TTSOptimizationConfig(kernel_backend="torch", **config))
    assert _activation_kernels(model) == before and model.optimization_result is None


def test_every_declared_technique_has_a_transform(model):
    caps = FAMILY_CAPABILITIES["gpt-sovits-v3"]
    offered = {(str(t.feature), t.technique) for t in model.optimization_targets()}
    assert offered == {(str(t.feature), t.name) for t in caps.techniques}
    implemented = {t.name for t in caps.techniques if t.not_implemented is None}
    assert implemented == {"torch", "triton"}
