"""optimize / restore on a tiny fake model: validation first, rollback, state rules, lazy load."""

from __future__ import annotations

import json

import pytest
import torch
from optimization_fakes import CAPS, FAKE

from voicehub.optimization import (
    EvidenceStore,
    OptimizableModelMixin,
    OptimizationResult,
    OptimizationRollbackError,
    OptimizationStateError,
    OptimizationUnsupportedError,
    TrainingModeUnsupportedError,
    TTSOptimizationConfig,
    apply_load_time_config,
    optimize,
)

EXPLICIT = TTSOptimizationConfig(attn_implementation="sdpa", kernel_backend="torch", compile="required")


@pytest.fixture(autouse=True)
def fake_family(monkeypatch):
    """FakeModel is of the test-local family FAKE: resolution inside optimize() sees it."""
    monkeypatch.setattr("voicehub.optimization.plan.FAMILY_CAPABILITIES", CAPS)


class FakeTransform:
    """Records its change in the model's `state`; can fail in validate, apply or undo."""

    def __init__(self, model, feature, technique, fail_validate=None, fail_apply=None, fail_undo=None):
        self.model, self.feature, self.technique = model, feature, technique
        self.name = f"fake-{feature}-{technique}"
        self.fail_validate, self.fail_apply, self.fail_undo = fail_validate, fail_apply, fail_undo

    def validate(self):
        self.model.log.append(("validate", self.name))
        if self.fail_validate:
            raise self.fail_validate

    def apply(self):
        self.model.log.append(("apply", self.name))
        if self.fail_apply:
            raise self.fail_apply  # a transform's own apply is atomic: it fails before changing anything
        self.model.state[self.feature] = self.technique

        def undo():
            self.model.log.append(("undo", self.name))
            if self.fail_undo:
                raise self.fail_undo
            del self.model.state[self.feature]

        return undo


class FakeModel(OptimizableModelMixin):
    model_type = FAKE.model_type

    def __init__(self, failures=None, loaded=True):
        self.device, self.dtype = "cpu", torch.float32
        self.state, self.log = {}, []
        self._loaded = loaded
        failures = failures or {}
        self.transforms = [
            FakeTransform(self, "attention", "sdpa", **failures.get("attention", {})),
            FakeTransform(self, "kernels", "torch", **failures.get("kernels", {})),
            FakeTransform(self, "compile", "torch_compile", **failures.get("compile", {})),
        ]

    def optimization_targets(self):
        return self.transforms

    @property
    def is_runtime_loaded(self):
        return self._loaded

    def load(self):  # what a lazy family does once its weights are in
        self._loaded = True
        self.apply_pending_optimization()


def test_optimize_applies_in_feature_order_and_restore_undoes_in_reverse():
    model = FakeModel()
    result = model.optimize(EXPLICIT)
    assert model.state == {"attention": "sdpa", "kernels": "torch", "compile": "torch_compile"}
    names = [t.name for t in model.transforms]
    assert model.log == [("validate", n) for n in names] + [("apply", n) for n in names]
    assert [a.technique for a in result.applied] == ["sdpa", "torch", "torch_compile"]
    assert model.optimization_result == result
    model.log.clear()
    assert model.restore_tts_optimization(mode="inference") == result
    assert model.state == {} and model.log == [("undo", n) for n in reversed(names)]
    assert model.optimization_result is None


def test_validation_failure_changes_nothing():
    model = FakeModel({"compile": {"fail_validate": OptimizationUnsupportedError("compile cannot run here")}})
    with pytest.raises(OptimizationUnsupportedError, match="compile cannot run"):
        model.optimize(EXPLICIT)
    assert model.state == {} and not any(step == "apply" for step, _ in model.log)
    assert model.optimization_result is None


def test_apply_failure_rolls_back_everything_applied_and_reraises():
    boom = RuntimeError("kernel build failed")
    model = FakeModel({"compile": {"fail_apply": boom}})
    with pytest.raises(RuntimeError) as info:
        model.optimize(EXPLICIT)
    assert info.value is boom
    assert model.state == {}
    assert [s for s in model.log if s[0] == "undo"] == [
        ("undo", "fake-kernels-torch"),
        ("undo", "fake-attention-sdpa"),
    ]
    assert model.optimization_result is None
    model.transforms[2].fail_apply = None
    model.optimize(EXPLICIT)  # no stale state: a fresh attempt is allowed


def test_out_of_memory_is_reraised_with_its_type():
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    model = FakeModel({"kernels": {"fail_apply": oom}})
    with pytest.raises(torch.OutOfMemoryError) as info:
        model.optimize(EXPLICIT)
    assert info.value is oom and "attention" not in model.state


def test_failed_rollback_says_the_model_may_be_half_optimized():
    model = FakeModel(
        {"attention": {"fail_undo": RuntimeError("cannot undo")}, "compile": {"fail_apply": ValueError("x")}}
    )
    with pytest.raises(OptimizationRollbackError, match="reload it") as info:
        model.optimize(EXPLICIT)
    assert isinstance(info.value.__cause__, ValueError)
    assert any("cannot undo" in note for note in info.value.__cause__.__notes__)


def test_second_optimize_without_restore_raises_and_changes_nothing():
    model = FakeModel()
    model.optimize(EXPLICIT)
    before = dict(model.state)
    with pytest.raises(OptimizationStateError, match="restore_tts_optimization"):
        model.optimize(TTSOptimizationConfig.eager())
    assert model.state == before


def test_restore_twice_raises():
    model = FakeModel()
    with pytest.raises(OptimizationStateError, match="nothing to restore"):
        model.restore_tts_optimization()
    model.optimize(EXPLICIT)
    model.restore_tts_optimization()
    with pytest.raises(OptimizationStateError, match="nothing to restore"):
        model.restore_tts_optimization()
    model.optimize(EXPLICIT)  # and the model can be optimized again after a restore
    assert model.state["kernels"] == "torch"


def test_restore_in_training_mode_raises():
    model = FakeModel()
    model.optimize(EXPLICIT)
    with pytest.raises(TrainingModeUnsupportedError):
        model.restore_tts_optimization(mode="training")
    assert model.state["attention"] == "sdpa"


def test_explicit_unsupported_request_raises_before_any_change():
    model = FakeModel()
    with pytest.raises(OptimizationUnsupportedError):
        model.optimize(
            TTSOptimizationConfig(attn_implementation="sdpa", kernel_backend="triton")
        )  # triton: cuda
    assert model.log == [] and model.state == {}


def test_missing_transform_for_a_selected_technique_raises_before_any_change():
    model = FakeModel()
    model.transforms = model.transforms[:2]  # the capability record offers compile, this model does not
    with pytest.raises(OptimizationUnsupportedError, match="no transform for compile"):
        model.optimize(EXPLICIT)
    assert model.state == {}


def test_auto_with_no_evidence_applies_nothing_and_records_why():
    model = FakeModel()
    result = optimize(model, TTSOptimizationConfig(), evidence=EvidenceStore())
    assert result.applied == () and model.state == {} and model.log == []
    data = json.loads(result.manifest())
    assert data["applied"] == [] and {s["feature"] for s in data["skipped"]} == {
        "attention", "kernels", "compile", "diffusion_cache", "diffusion_sampling",
    }  # fmt: skip


def test_result_manifest_joins_plan_and_applied_and_round_trips():
    model = FakeModel()
    result = model.optimize(TTSOptimizationConfig(attn_implementation="sdpa"))
    data = json.loads(result.manifest())
    assert data["schema"] == "voicehub.optimization.result/1"
    assert data["plan"]["target"]["model_type"] == FAKE.model_type
    assert data["plan"]["context"] == {
        "mode": "inference", "device": "cpu", "dtype": "float32", "gpu_arch": None, "cuda_graph_preset": None,
    }  # fmt: skip
    assert data["applied"] == [{"name": "fake-attention-sdpa", "feature": "attention", "technique": "sdpa"}]
    assert OptimizationResult.from_manifest(result.manifest()) == result


def test_clear_optimization_config_restores_and_is_idempotent():
    model = FakeModel()
    model.optimize(EXPLICIT)
    model.clear_optimization_config()
    assert model.state == {} and model.optimization_result is None
    model.clear_optimization_config()


def test_load_time_config_on_a_loaded_model_applies_now():
    model = FakeModel()
    result = apply_load_time_config(model, EXPLICIT)
    assert result is not None and model.state["compile"] == "torch_compile"


def test_lazy_load_applies_the_config_when_the_runtime_loads():
    model = FakeModel(loaded=False)
    assert apply_load_time_config(model, EXPLICIT) is None
    assert model.state == {} and model.pending_optimization_config == EXPLICIT
    with pytest.raises(OptimizationStateError, match="clear_optimization_config"):
        model.optimize(TTSOptimizationConfig.eager())
    model.load()
    assert model.state == {"attention": "sdpa", "kernels": "torch", "compile": "torch_compile"}
    assert model.pending_optimization_config is None and model.optimization_result is not None


def test_lazy_load_checks_explicit_requests_before_loading():
    model = FakeModel(loaded=False)
    with pytest.raises(OptimizationUnsupportedError):
        apply_load_time_config(model, TTSOptimizationConfig(kernel_backend="triton"))
    assert model.pending_optimization_config is None


def test_lazy_load_failure_rolls_back_and_keeps_the_config_pending():
    model = FakeModel({"compile": {"fail_apply": RuntimeError("no compiler")}}, loaded=False)
    apply_load_time_config(model, EXPLICIT)
    with pytest.raises(RuntimeError, match="no compiler"):
        model.load()
    assert model.state == {} and model.pending_optimization_config == EXPLICIT


def test_clear_optimization_config_drops_a_pending_config():
    model = FakeModel(loaded=False)
    apply_load_time_config(model, EXPLICIT)
    model.clear_optimization_config()
    model.load()
    assert model.state == {} and model.optimization_result is None


def test_load_time_config_type_and_model_checks():
    assert apply_load_time_config(FakeModel(), None) is None
    with pytest.raises(TypeError, match="TTSOptimizationConfig"):
        apply_load_time_config(FakeModel(), {"compile": "required"})

    class Plain:
        model_type = "vits"

    with pytest.raises(OptimizationUnsupportedError, match="load it without one"):
        apply_load_time_config(Plain(), EXPLICIT)


def test_two_models_do_not_share_state():
    a, b = FakeModel(), FakeModel()
    a.optimize(EXPLICIT)
    assert b.optimization_result is None
    b.optimize(EXPLICIT)
    a.restore_tts_optimization()
    assert b.state["attention"] == "sdpa"
