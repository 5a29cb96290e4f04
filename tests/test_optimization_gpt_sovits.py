"""The optimization layer on a real GPT-SoVITS v3 model (tiny set, CPU): kernel transforms and refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
from gpt_sovits_fixtures import REFERENCE_TEXT

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


def _audio(model, voice) -> np.ndarray:
    pipe = model.pipeline
    sentence = pipe.text_features("A short test sentence.", Language.EN)
    params = GptSovitsParams.build(None, speed=1.0, force_n_tokens=8)
    return pipe.synthesize_sentence(pipe.reference(voice), sentence, params, seed=1).audio


def _activation_kernels(model) -> set:
    return {m.kernel for m in model.pipeline.vocoder.modules() if hasattr(m, "kernel")}


def test_torch_kernels_apply_and_restore(model, reference_wav):
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
    "config", [{"attn_implementation": "sdpa"}, {"attn_implementation": "flash_attention_4"}]
)
def test_declared_but_not_implemented_techniques_raise(model, config):
    before = _activation_kernels(model)
    with pytest.raises(OptimizationNotImplementedError, match="not implemented yet"):
        model.optimize(TTSOptimizationConfig(kernel_backend="torch", **config))
    assert _activation_kernels(model) == before and model.optimization_result is None


def test_not_implemented_error_is_the_optimization_layers_own():
    from voicehub.optimization import errors

    assert OptimizationNotImplementedError is errors.OptimizationNotImplementedError  # re-exported here
    assert issubclass(OptimizationNotImplementedError, errors.OptimizationUnsupportedError)


def test_every_declared_technique_has_a_transform(model):
    caps = FAMILY_CAPABILITIES["gpt-sovits-v3"]
    offered = {(str(t.feature), t.technique) for t in model.optimization_targets()}
    assert offered == {(str(t.feature), t.name) for t in caps.techniques}
    implemented = {t.name for t in caps.techniques if t.not_implemented is None}
    assert implemented == {"torch", "triton", "torch_compile", "cfm_short_schedule", "dit_step_cache"}


def test_triton_transform_routes_the_t2s_graph_decoder_and_undoes(model, monkeypatch):
    """Wiring only (the kernels' results are held by test_t2s_runner and test_kernels_triton): the
    registry is stubbed so the Triton transform can be applied on the CPU to a graph decoder."""
    from voicehub.models.gpt_sovits.t2s import StaticDecodeConfig
    from voicehub.models.gpt_sovits.t2s.runner import T2SGraphDecoder
    from voicehub.models.gpt_sovits.t2s.static import NATIVE_KERNELS, StepKernels

    def stub(op):
        return lambda *args: None

    stubs = {op: stub(op) for op in registry.ops()}
    monkeypatch.setattr(registry, "available", lambda op, backend, device: None)
    monkeypatch.setattr(registry, "resolve", lambda op, backend, device: stubs[op])
    pipe = model.pipeline
    engine = StaticDecodeConfig(max_seq_len=64, kv_buckets=(32,))
    monkeypatch.setattr(pipe, "t2s_decoder", T2SGraphDecoder(pipe.t2s, engine, "off"))
    transform = KernelBackendTransform(model, KernelBackend.TRITON)
    transform.validate()
    undo = transform.apply()
    want = StepKernels(
        layer_stack=stubs[registry.T2S_LAYER_STACK],
        layer_stack_rows=stubs[registry.T2S_LAYER_STACK_ROWS],
        embed_stack_rows=stubs[registry.T2S_EMBED_STACK_ROWS],
        sampler=stubs[registry.T2S_SAMPLE_STEP],
        row_noise=stubs[registry.ROW_NOISE],
    )
    assert pipe.t2s_decoder.kernels == want
    assert _activation_kernels(model) == {stubs[registry.ANTI_ALIAS_SNAKE]}
    undo()
    assert pipe.t2s_decoder.kernels is NATIVE_KERNELS
    assert _activation_kernels(model) == {anti_alias_snake_torch}


@pytest.mark.gpu
def test_cuda_triton_kernels_keep_tokens_and_audio_close(tiny_set, reference_wav):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = load(tiny_set, device="cuda", dtype="float32", cuda_graph_preset="minimal")
    voice = Voice(reference_wav, REFERENCE_TEXT, "en")
    pipe = model.pipeline
    sentence = pipe.text_features("A short test sentence.", Language.EN)
    params = GptSovitsParams.build(None, speed=1.0, top_k=1, top_p=1.0, temperature=1.0,
                                   repetition_penalty=1.0, max_new_tokens=40)  # fmt: skip
    native = pipe.synthesize_sentence(pipe.reference(voice), sentence, params, seed=1)
    result = model.optimize(TTSOptimizationConfig(kernel_backend="triton"))
    try:
        assert [a["technique"] for a in json.loads(result.manifest())["applied"]] == ["triton"]
        fast = pipe.synthesize_sentence(pipe.reference(voice), sentence, params, seed=1)
        assert fast.tokens.tolist() == native.tokens.tolist()
        err = np.linalg.norm(fast.audio - native.audio) / max(np.linalg.norm(native.audio), 1e-9)
        assert err <= 1e-3, err  # rel. L2, fp32 (the kernels' own tolerance)
    finally:
        model.restore_tts_optimization()
