"""The optimization config, plan resolution, manifest and support table (CPU, no model)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from optimization_fakes import CAPS

from voicehub.errors import MissingDependencyError, VoiceHubError
from voicehub.optimization import (
    EvidenceStore,
    Feature,
    OptimizationContext,
    OptimizationDependencyError,
    OptimizationNotImplementedError,
    OptimizationPlan,
    OptimizationUnsupportedError,
    TrainingModeUnsupportedError,
    TTSOptimizationConfig,
    get_tts_optimization_support,
    list_tts_optimization_support,
)
from voicehub.optimization.families import (
    FAMILY_CAPABILITIES,
)

EMPTY = EvidenceStore()
CPU32 = OptimizationContext(mode="inference", device="cpu", dtype="float32")
H200_FP16 = OptimizationContext(mode="inference", device="cuda", dtype="float16", gpu_arch="sm_90")

# FAKE: a test-local family whose every control has an implemented technique (optimization_fakes.py).


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("attn_implementation", "flash"),
        ("kernel_backend", "cuda"),
        ("compile", "yes"),
        ("diffusion_cache", "on"),
        ("diffusion_sampling", True),
    ],
)
def test_config_rejects_unknown_values_and_lists_valid_ones(field, value):
    with pytest.raises(ValueError, match="valid values") as info:
        TTSOptimizationConfig(**{field: value})
    assert "valid values: auto, " in str(info.value)


def test_config_normalises_strings_to_enums_and_is_frozen():
    config = TTSOptimizationConfig(attn_implementation="sdpa", compile="disabled")
    assert (
        config.attn_implementation == "sdpa"
        and type(config.attn_implementation).__name__ == "AttentionImplementation"
    )
    with pytest.raises(AttributeError):
        config.compile = "required"  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"device": "tpu"},
        {"dtype": "int8"},
        {"mode": "serving"},
        {"device": "cuda", "gpu_arch": "hopper"},
        {"device": "cpu", "gpu_arch": "sm_90"},
        {"device": "cuda", "cuda_graph_preset": "everything"},
    ],
)
def test_context_validates_each_field(kwargs):
    with pytest.raises(ValueError):
        OptimizationContext(**kwargs)


def test_context_accepts_dtype_aliases():
    assert OptimizationContext(device="cuda:1", dtype="fp16").dtype == "float16"
    assert OptimizationContext(dtype="torch.bfloat16").dtype == "bfloat16"


def test_fake_family_is_visible_only_through_the_capabilities_argument():
    assert "fake-tts" not in FAMILY_CAPABILITIES
    with pytest.raises(OptimizationUnsupportedError, match="gpt-sovits-v3, vits"):
        TTSOptimizationConfig().resolve("fake-tts", context=CPU32, evidence=EMPTY)
    assert TTSOptimizationConfig().resolve("fake-tts", context=CPU32, evidence=EMPTY, capabilities=CAPS)


def test_auto_stays_native_without_evidence_and_says_why():
    plan = TTSOptimizationConfig().resolve("fake-tts", context=H200_FP16, evidence=EMPTY, capabilities=CAPS)
    assert plan.selected == ()
    for d in plan.decisions:
        assert d.requested == "auto" and d.selected == "native"
        assert d.reason.startswith("stays native") and "no evidence" in d.reason


def test_auto_on_cuda_with_unknown_arch_stays_native():
    ctx = OptimizationContext(device="cuda", dtype="float16")
    plan = TTSOptimizationConfig().resolve("vits", context=ctx, evidence=EMPTY)
    assert "GPU architecture unknown" in plan.decision("attention").reason


def test_vits_offers_no_diffusion_and_auto_says_so():
    plan = TTSOptimizationConfig().resolve("vits", context=CPU32, evidence=EMPTY)
    assert plan.decision(Feature.DIFFUSION_CACHE).reason == "vits offers no diffusion_cache technique"


def test_explicit_supported_requests_are_selected():
    config = TTSOptimizationConfig(attn_implementation="sdpa", kernel_backend="torch", compile="required")
    plan = config.resolve("fake-tts", context=CPU32, evidence=EMPTY, capabilities=CAPS)
    assert [(d.feature, d.selected) for d in plan.selected] == [
        ("attention", "sdpa"),
        ("kernels", "torch"),
        ("compile", "torch_compile"),
    ]
    assert all(d.reason == "requested explicitly" for d in plan.selected)


def test_explicit_approximate_request_is_marked_approximate():
    plan = TTSOptimizationConfig(diffusion_sampling="required").resolve(
        "fake-tts", context=CPU32, evidence=EMPTY, capabilities=CAPS
    )
    d = plan.decision("diffusion_sampling")
    assert d.selected == "cfm_short_schedule" and d.kind == "approximate" and "approximate" in d.reason


@pytest.mark.parametrize(
    ("model_type", "config", "ctx", "match"),
    [
        ("vits", {"attn_implementation": "flash_attention_4"}, H200_FP16, "does not support"),
        ("vits", {"diffusion_cache": "required"}, CPU32, "does not support"),
        ("gpt-sovits-v3", {"kernel_backend": "cuda_extension"}, H200_FP16, "does not support"),
        ("gpt-sovits-v3", {"kernel_backend": "triton"}, CPU32, "cuda only"),
        ("fake-tts", {"attn_implementation": "flash_attention_4"}, CPU32, "cuda only"),
        (
            "fake-tts",
            {"attn_implementation": "flash_attention_4"},
            OptimizationContext(device="cuda", dtype="float32", gpu_arch="sm_90"),
            "not float32",
        ),
        (
            "fake-tts",
            {"attn_implementation": "flash_attention_4"},
            OptimizationContext(device="cuda", dtype="float16", gpu_arch="sm_80"),
            "architecture",
        ),
    ],
)
def test_explicit_unsupported_requests_raise_typed_errors(model_type, config, ctx, match):
    with pytest.raises(OptimizationUnsupportedError, match=match):
        TTSOptimizationConfig(**config).resolve(model_type, context=ctx, evidence=EMPTY, capabilities=CAPS)


@pytest.mark.parametrize(
    ("model_type", "config", "ctx"),
    [
        ("gpt-sovits-v3", {"attn_implementation": "sdpa"}, CPU32),
        ("gpt-sovits-v3", {"attn_implementation": "flash_attention_4"}, H200_FP16),
        ("vits", {"kernel_backend": "torch"}, CPU32),
        ("vits", {"kernel_backend": "triton"}, H200_FP16),
    ],
)
def test_explicit_not_implemented_technique_raises_at_resolve(model_type, config, ctx):
    with pytest.raises(OptimizationNotImplementedError, match="not implemented yet") as info:
        TTSOptimizationConfig(**config).resolve(model_type, context=ctx, evidence=EMPTY)
    assert isinstance(info.value, OptimizationUnsupportedError)
    assert "native" in str(info.value) or "disabled" in str(info.value)  # names the fix


class _ValidatingStore:
    """An evidence store that claims every technique validated: only the not-implemented rule
    can then keep `auto` native."""

    class _Ev:
        is_validated, source = True, "stub.json"

        def can_validate(self, kind):
            return True

        def citation(self):
            return {"file": self.source}

    def find(self, *key):
        return self._Ev()


@pytest.mark.parametrize("evidence", [EMPTY, _ValidatingStore()], ids=["no-evidence", "validated"])
@pytest.mark.parametrize(
    ("model_type", "feature", "names", "implemented"),
    [
        ("gpt-sovits-v3", "attention", ("flash_attention_4", "sdpa"), ("kernels", ("triton", "torch"))),
        ("vits", "kernels", ("triton", "torch"), ("attention", ("sdpa",))),
    ],
)
def test_auto_skips_not_implemented_techniques_and_records_why(
    evidence, model_type, feature, names, implemented
):
    plan = TTSOptimizationConfig().resolve(model_type, context=H200_FP16, evidence=evidence)
    by_feature = {d["feature"]: d for d in json.loads(plan.manifest())["decisions"]}
    d = by_feature[feature]
    assert d["requested"] == "auto" and d["selected"] == "native", d
    for name in names:
        assert f"{name}: not implemented yet" in d["reason"], d
    if isinstance(evidence, _ValidatingStore):  # the implemented techniques are still chosen
        assert by_feature[implemented[0]]["selected"] in implemented[1]


def test_flash_attention_4_without_its_package_raises_dependency_error(monkeypatch):
    from importlib import metadata

    real = metadata.distribution

    def no_fa4(name):
        if name == "flash-attn-4":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "distribution", no_fa4)
    config = TTSOptimizationConfig(attn_implementation="flash_attention_4")
    with pytest.raises(OptimizationDependencyError, match="pip install flash-attn-4") as info:
        config.resolve("fake-tts", context=H200_FP16, evidence=EMPTY, capabilities=CAPS)
    assert isinstance(info.value, MissingDependencyError) and isinstance(info.value, VoiceHubError)


@pytest.mark.parametrize("model_type", sorted(FAMILY_CAPABILITIES))
def test_training_mode_raises_for_every_family(model_type):
    with pytest.raises(TrainingModeUnsupportedError, match="mode='inference'"):
        TTSOptimizationConfig().resolve(model_type, mode="training", evidence=EMPTY)
    with pytest.raises(TrainingModeUnsupportedError):
        TTSOptimizationConfig().resolve(
            model_type, context=OptimizationContext(mode="training"), evidence=EMPTY
        )


def test_unknown_family_raises_and_lists_known():
    with pytest.raises(OptimizationUnsupportedError, match="gpt-sovits-v3, vits"):
        TTSOptimizationConfig().resolve("tacotron", evidence=EMPTY)


def test_plan_manifest_is_canonical_and_round_trips():
    ctx = OptimizationContext(device="cuda", dtype="float16", gpu_arch="sm_90", cuda_graph_preset="minimal")
    config = TTSOptimizationConfig(attn_implementation="sdpa", diffusion_cache="disabled")
    plan = config.resolve("vits", context=ctx, evidence=EMPTY)
    text = plan.manifest()
    data = json.loads(text)
    assert text == json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert data["schema"] == "voicehub.optimization.plan/1"
    assert data["target"] == {"model_type": "vits", "mode": "inference"}
    assert data["context"]["cuda_graph_preset"] == "minimal"
    assert {"feature", "requested", "selected", "reason"} <= set(data["decisions"][0])
    again = OptimizationPlan.from_manifest(text)
    assert again == plan and again.manifest() == text


def test_from_manifest_rejects_other_schema():
    with pytest.raises(ValueError, match="schema"):
        OptimizationPlan.from_manifest({"schema": "voicehub.optimization.plan/999"})


def test_support_table_lists_each_family():
    items = {s.model_type: s for s in list_tts_optimization_support()}
    assert set(items) == {"gpt-sovits-v3", "vits"}
    g = get_tts_optimization_support("gpt-sovits-v3")
    assert g == items["gpt-sovits-v3"]
    assert g.attention_implementations == ("auto", "native", "flash_attention_4", "sdpa")
    assert "required" in g.diffusion_cache and "required" in g.diffusion_sampling
    v = items["vits"].to_dict()
    assert set(v) == {
        "model_type", "attention_implementations", "kernel_backends", "compile",
        "diffusion_cache", "diffusion_sampling", "training", "notes",
    }  # fmt: skip
    assert v["training"] is False and "required" not in v["diffusion_cache"]
    json.dumps(v)  # plain data


FEATURE_OF_FIELD = {
    "attn_implementation": Feature.ATTENTION,
    "kernel_backend": Feature.KERNELS,
    "compile": Feature.COMPILE,
    "diffusion_cache": Feature.DIFFUSION_CACHE,
    "diffusion_sampling": Feature.DIFFUSION_SAMPLING,
}


def test_every_value_the_support_table_lists_resolves_on_some_context():
    """...or is declared not implemented yet, which resolution refuses with its own typed error."""
    contexts = [CPU32, H200_FP16]
    for s in list_tts_optimization_support():
        caps = FAMILY_CAPABILITIES[s.model_type]
        for field, values in [
            ("attn_implementation", s.attention_implementations),
            ("kernel_backend", s.kernel_backends),
            ("compile", s.compile),
            ("diffusion_cache", s.diffusion_cache),
            ("diffusion_sampling", s.diffusion_sampling),
        ]:
            for value in values:
                resolved = False
                for ctx in contexts:
                    try:
                        TTSOptimizationConfig(**{field: value}).resolve(
                            s.model_type, context=ctx, evidence=EMPTY
                        )
                        resolved = True
                    except OptimizationDependencyError:
                        resolved = True  # supported, but this machine lacks the package
                    except OptimizationNotImplementedError:
                        offered = caps.for_feature(FEATURE_OF_FIELD[field])
                        declared = [t for t in offered if value in (t.name, "required")][:1]
                        resolved = bool(declared) and declared[0].not_implemented is not None
                    except OptimizationUnsupportedError:
                        pass
                assert resolved, (s.model_type, field, value)


def test_resolve_imports_no_optional_gpu_package_and_changes_nothing():
    code = textwrap.dedent(
        """
        import json, sys
        before = set(sys.modules)
        from voicehub.optimization import TTSOptimizationConfig, OptimizationContext
        ctx = OptimizationContext(mode="inference", device="cuda", dtype="float16", gpu_arch="sm_90")
        explicit = {"gpt-sovits-v3": {"kernel_backend": "torch"}, "vits": {"attn_implementation": "sdpa"}}
        for t in ("gpt-sovits-v3", "vits"):
            TTSOptimizationConfig().resolve(t, mode="inference", context=ctx).manifest()
            TTSOptimizationConfig(**explicit[t]).resolve(t, context=ctx)
        new = sorted(set(sys.modules) - before)
        print(json.dumps(new))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    new = json.loads(out)
    heavy = (
        "torch",
        "triton",
        "flash_attn",
        "cuda",
        "tensorrt",
    )  # numpy is core; torch is not needed to plan
    assert not [m for m in new if m.split(".")[0] in heavy]
    assert "voicehub.optimization.plan" in new  # the probe did run the code it claims to check
