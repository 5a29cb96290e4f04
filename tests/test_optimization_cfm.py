"""GPT-SoVITS v3's CFM short schedule, DiT step cache and compile through optimize() (tiny set, CPU).

The approximate techniques must change the audio measurably but within the difference that
doubling the uniform step count makes; restore must give the native audio bit for bit; the
manifest must say what was applied and that it is approximate. compile runs the 'aot_eager'
backend here (inductor needs ~30 s per compile on this CPU; the GPU evidence run uses inductor).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from gpt_sovits_fixtures import REFERENCE_TEXT
from torch._dynamo.backends.registry import lookup_backend

from voicehub.models.gpt_sovits import Voice, load, techniques
from voicehub.models.gpt_sovits.cfm.schedule import StepCache, dyadic_steps, uniform_steps
from voicehub.models.gpt_sovits.params import GptSovitsParams
from voicehub.optimization import (
    EvidenceStore,
    OptimizationCompileError,
    OptimizationContext,
    OptimizationUnsupportedError,
    TTSOptimizationConfig,
    apply_load_time_config,
)
from voicehub.runtime.compile import compile_unavailable, is_compiled
from voicehub.text.options import Language

STEPS = 8  # requested CFM steps: the dyadic schedule takes 4


@pytest.fixture
def fresh_dynamo():
    """No compiled graph of DiTBlock.forward from an earlier test: every block instance shares that code
    object, and its cache entries (8 at most, per backend and batch) would be reused or run out."""
    import torch

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _audio(model, voice, steps: int = STEPS) -> np.ndarray:
    pipe = model.pipeline
    sentence = pipe.text_features("A short test sentence.", Language.EN)
    params = GptSovitsParams.build(None, speed=1.0, force_n_tokens=8, sample_steps=steps)
    return pipe.synthesize_sentence(pipe.reference(voice), sentence, params, seed=1).audio


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _count_calls(module, counts: list[int]):
    return module.register_forward_hook(lambda *_: counts.append(1))


def test_dyadic_schedule_takes_fewer_steps_and_reaches_one():
    assert dyadic_steps(4) == (0.25, 0.25, 0.5)
    assert [len(dyadic_steps(n)) for n in (1, 2, 3, 4, 8, 16, 32)] == [1, 2, 3, 3, 4, 5, 6]
    for n in range(1, 40):
        steps = dyadic_steps(n)
        assert abs(sum(steps) - 1) < 1e-9 and steps[0] == 1 / n and len(steps) <= n
    assert uniform_steps(4) == (0.25,) * 4


def test_step_cache_settings_are_checked():
    assert StepCache().reuses(5) == (False, True, False, True, False)
    assert StepCache(start_fraction=0.5).start_block(22) == 11 and StepCache().start_block(2) == 1
    with pytest.raises(ValueError, match="interval"):
        StepCache(interval=0)
    with pytest.raises(ValueError, match="start_fraction"):
        StepCache(start_fraction=1.0)


@pytest.mark.parametrize(
    ("config", "technique"),
    [
        ({"diffusion_sampling": "required"}, "cfm_short_schedule"),
        ({"diffusion_cache": "required"}, "dit_step_cache"),
    ],
)
def test_approximate_technique_changes_audio_boundedly_and_restore_is_exact(model, voice, config, technique):
    native = _audio(model, voice)
    finer = _audio(model, voice, 2 * STEPS)  # how much the step count alone moves the audio
    result = model.optimize(TTSOptimizationConfig(**config))
    try:
        manifest = json.loads(result.manifest())
        optimized = _audio(model, voice)
    finally:
        model.restore_tts_optimization()
    assert optimized.shape == native.shape and np.isfinite(optimized).all()
    change = _rel(optimized, native)
    assert 1e-4 < change < 2 * _rel(finer, native), (change, _rel(finer, native))
    (applied,) = manifest["applied"]
    assert applied["technique"] == technique and applied["details"]
    decision = next(d for d in manifest["plan"]["decisions"] if d["selected"] == technique)
    assert decision["kind"] == "approximate" and "approximate" in decision["reason"]
    assert np.array_equal(_audio(model, voice), native)


def test_short_schedule_calls_the_dit_fewer_times(model, voice):
    est = model.pipeline.sovits.cfm.estimator
    counts: list[int] = []
    hook = _count_calls(est, counts)
    try:
        _audio(model, voice)
        native_calls = len(counts)
        model.optimize(TTSOptimizationConfig(diffusion_sampling="required"))
        counts.clear()
        _audio(model, voice)
    finally:
        hook.remove()
        model.restore_tts_optimization()
    n_chunks = native_calls // STEPS
    assert native_calls == STEPS * n_chunks and len(counts) == len(dyadic_steps(STEPS)) * n_chunks


def test_step_cache_skips_the_deep_blocks_on_reuse_steps(model, voice):
    est = model.pipeline.sovits.cfm.estimator
    first, last = [], []
    hooks = [_count_calls(est.transformer_blocks[0], first), _count_calls(est.transformer_blocks[-1], last)]
    try:
        model.optimize(TTSOptimizationConfig(diffusion_cache="required"))
        _audio(model, voice)
    finally:
        for h in hooks:
            h.remove()
        model.restore_tts_optimization()
    assert len(first) % STEPS == 0 and len(last) == len(first) // 2  # every other step refreshes


def test_auto_keeps_the_approximate_techniques_off_and_says_why(model, voice):
    native = _audio(model, voice)
    result = model.optimize(TTSOptimizationConfig())
    try:
        skipped = {s["feature"]: s["reason"] for s in json.loads(result.manifest())["skipped"]}
        assert np.array_equal(_audio(model, voice), native)
    finally:
        model.restore_tts_optimization()
    for feature in ("diffusion_sampling", "diffusion_cache"):
        assert "approximate" in skipped[feature] and "real checkpoint" in skipped[feature]
    assert "no evidence" in skipped["compile"]


def test_lazy_model_applies_the_schedule_when_its_weights_load(tiny_set):
    lazy = load(tiny_set, lazy_load=True)
    assert apply_load_time_config(lazy, TTSOptimizationConfig(diffusion_sampling="required")) is None
    assert not lazy.is_runtime_loaded and lazy.optimization_result is None
    assert lazy.pipeline.sovits.cfm.estimator.schedule is dyadic_steps
    assert [a.technique for a in lazy.optimization_result.applied] == ["cfm_short_schedule"]
    lazy.restore_tts_optimization()
    assert lazy.pipeline.sovits.cfm.estimator.schedule is uniform_steps


def test_compile_is_exact_within_tolerance_and_restores(model, voice, monkeypatch, fresh_dynamo):
    graphs = []  # one entry per graph the backend compiles

    def counting_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return lookup_backend("aot_eager")(graph_module, example_inputs)

    monkeypatch.setattr(techniques, "COMPILE_BACKEND", counting_backend)
    pipe = model.pipeline
    blocks = list(pipe.sovits.cfm.estimator.transformer_blocks)
    assert len(blocks) > 1
    native = _audio(model, voice)
    result = model.optimize(TTSOptimizationConfig(compile="required"))
    try:
        assert all(is_compiled(b) for b in blocks) and not is_compiled(pipe.vocoder)
        # regional: the blocks are identical, one compiled graph (unmasked and masked, batch 1) serves
        # them all, and real calls of other lengths reuse it
        assert len(graphs) == 2
        compiled = _audio(model, voice)
        assert len(graphs) == 2
        # an engine's batched solve compiles once at its first call (batch 1 only is warmed: warming
        # batch 2 slowed the one-stream sentence on the GPU), then other batches and lengths reuse it
        _batched_dit_call(pipe.sovits.cfm.estimator, batch=5, frames=37)
        assert len(graphs) == 3
        _batched_dit_call(pipe.sovits.cfm.estimator, batch=3, frames=41)
        assert len(graphs) == 3
        (applied,) = json.loads(result.manifest())["applied"]
    finally:
        model.restore_tts_optimization()
    assert _rel(compiled, native) <= 1e-5  # fp32: aot_eager runs the same ops as eager
    labels = [f"cfm.estimator.transformer_blocks.{i}" for i in range(len(blocks))]
    assert applied["details"] == {"backend": "counting_backend", "modules": labels}
    assert not any(is_compiled(b) for b in blocks)
    assert np.array_equal(_audio(model, voice), native)


def _batched_dit_call(est, batch: int, frames: int) -> None:
    import torch

    mel_dim, dim = est.proj_out.out_features, est.proj_out.in_features
    text_dim = est.input_embed.proj.in_features - 2 * mel_dim
    with torch.inference_mode():  # as the pipeline and the engine make their inputs
        x = torch.randn(batch, mel_dim, frames).transpose(1, 2)
        text = torch.randn(batch, text_dim, frames).transpose(1, 2)
        mask = torch.ones(batch, frames, dtype=torch.bool)
        mask[0, frames // 2 :] = False
        est(x, torch.zeros_like(x), text, torch.rand(batch), torch.randn(batch, dim), mask)


def test_compile_with_the_step_cache_equals_the_step_cache_alone(model, voice, monkeypatch, fresh_dynamo):
    monkeypatch.setattr(techniques, "COMPILE_BACKEND", "aot_eager")
    model.optimize(TTSOptimizationConfig(diffusion_cache="required"))
    try:
        cached = _audio(model, voice)
    finally:
        model.restore_tts_optimization()
    model.optimize(TTSOptimizationConfig(diffusion_cache="required", compile="required"))
    try:
        both = _audio(model, voice)
    finally:
        model.restore_tts_optimization()
    assert _rel(both, cached) <= 1e-5


def test_a_compile_failure_raises_typed_and_rolls_back(model, monkeypatch, fresh_dynamo):
    def failing_backend(graph_module, example_inputs):
        raise RuntimeError("this backend cannot compile anything")

    monkeypatch.setattr(techniques, "COMPILE_BACKEND", failing_backend)
    pipe = model.pipeline
    config = TTSOptimizationConfig(diffusion_sampling="required", compile="required")
    with pytest.raises(OptimizationCompileError, match="compile='disabled'") as info:
        model.optimize(config)
    assert "cannot compile anything" in repr(info.value.__cause__.__cause__ or info.value.__cause__)
    assert model.optimization_result is None
    assert not any(is_compiled(b) for b in pipe.sovits.cfm.estimator.transformer_blocks)
    assert pipe.sovits.cfm.estimator.schedule is uniform_steps  # the transform before it was undone


def test_compile_that_cannot_run_raises_before_anything_changes(model, monkeypatch, fresh_dynamo):
    monkeypatch.setattr(techniques, "COMPILE_BACKEND", "no-such-backend")
    with pytest.raises(OptimizationUnsupportedError, match="no backend 'no-such-backend'"):
        model.optimize(TTSOptimizationConfig(diffusion_sampling="required", compile="required"))
    assert model.optimization_result is None
    assert model.pipeline.sovits.cfm.estimator.schedule is uniform_steps


def test_inductor_needs_a_cpu_compiler(monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert "C++ compiler" in compile_unavailable("inductor", "cpu")
    assert compile_unavailable("aot_eager", "cpu") is None


def test_compile_auto_stays_off_without_evidence():
    ctx = OptimizationContext(device="cuda", dtype="float16", gpu_arch="sm_90")
    d = (
        TTSOptimizationConfig()
        .resolve("gpt-sovits-v3", context=ctx, evidence=EvidenceStore())
        .decision("compile")
    )
    assert d.is_native and "torch_compile" in d.reason


@pytest.mark.gpu
def test_cuda_short_schedule_and_step_cache_stay_graph_capturable(tiny_set):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from voicehub.models.gpt_sovits.cfm import solve
    from voicehub.models.gpt_sovits.sovits import load_sovits_v3

    sovits = load_sovits_v3(tiny_set / "sovits.pth").to("cuda", torch.float16).eval()
    est = sovits.cfm.estimator
    est.set_schedule(dyadic_steps)
    est.set_step_cache(StepCache())
    g = torch.Generator(device="cuda").manual_seed(0)
    mu = torch.randn(1, 120, sovits.arch.inter2, device="cuda", dtype=torch.float16, generator=g)
    prompt = torch.randn(1, sovits.arch.mel_dim, 40, device="cuda", dtype=torch.float16, generator=g)
    noise = torch.randn(1, sovits.arch.mel_dim, 120, device="cuda", dtype=torch.float16, generator=g)
    with torch.inference_mode():
        eager = solve(est, mu, prompt, noise, 8)
        out = torch.empty_like(eager)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            out.copy_(solve(est, mu, prompt, noise, 8))  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out.copy_(solve(est, mu, prompt, noise, 8))
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(out, eager)


@pytest.mark.gpu
@pytest.mark.parametrize("kernels", ["native", "torch", "triton"])
def test_cuda_inductor_compile_is_within_fp16_tolerance(tiny_set, reference_wav, kernels):
    """Inductor on the DiT blocks beside each kernel set. With 'triton' (what kernel_backend 'auto' picks on
    sm_90 fp16) torch 2.11 failed twice on an H100: in AOT autograd on the rotary kernel's in-place writes
    to two views of one buffer (session 20), then in dynamo on a symbolic launch width after a graph break
    at each kernel launch (session 21); the triton ops are now opaque custom ops under torch.compile."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = load(tiny_set, device="cuda", dtype="float16")
    voice = Voice(reference_wav, REFERENCE_TEXT, "en")
    native = _audio(model, voice)
    model.optimize(TTSOptimizationConfig(kernel_backend=kernels, compile="required"))  # compiles now
    try:
        compiled = _audio(model, voice)
    finally:
        model.restore_tts_optimization()
    assert compiled.shape == native.shape and _rel(compiled, native) <= 1e-2
