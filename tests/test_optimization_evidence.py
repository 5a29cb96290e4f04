"""Evidence files: the schema checks, the consistency rule, and what `auto` does with them."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from types import MappingProxyType

import pytest

from voicehub.bench.quality import GATE_THRESHOLDS, AudioMetrics, QualityReport
from voicehub.optimization import (
    EvidenceError,
    EvidenceStore,
    OptimizationContext,
    TTSOptimizationConfig,
    check_evidence,
)
from voicehub.optimization.config import Feature
from voicehub.optimization.families import (
    FAMILY_CAPABILITIES,
    FamilyCapabilities,
    Technique,
    TechniqueKind,
)

H200 = OptimizationContext(device="cuda", dtype="float16", gpu_arch="sm_90")
SHA = "ab" * 32


def exactness(**over):
    data = {
        "schema": "voicehub.optimization.evidence/1",
        "model_type": "vits",
        "feature": "attention",
        "technique": "sdpa",
        "kind": "exactness",
        "dtype": "float16",
        "platform": "sm_90",
        "device_name": "NVIDIA H200",
        "command": "python benchmarks/exactness.py --family vits --technique sdpa",
        "created": "2026-01-02",
        "versions": {"voicehub": "0.1.0", "torch": "2.11.0", "cuda": "12.8"},
        "checkpoint": {"kind": "random", "sha256": {"voice.onnx": SHA}},
        "measurements": {
            "tolerance_rel_l2": 1e-2,
            "margin_epsilon": 1e-3,
            "outputs": [{"name": "audio", "rel_l2": 2e-3}],
            "tokens": [
                {
                    "name": "greedy",
                    "n_steps": 500,
                    "n_compared": 480,
                    "n_mismatched": 0,
                    "first_divergence": None,
                }
            ],
        },
        "decision": "validated",
    }
    data.update(over)
    return data


def metrics(**over):
    base = dict(
        duration_s=12.0, peak=0.8, n_clipped=0, loudness_lufs=-20.0, leading_silence_s=0.1,
        trailing_silence_s=0.2, internal_silence_s=1.0, transcript="hello", error_rate=0.0,
    )  # fmt: skip
    return AudioMetrics(**{**base, **over})


def quality(candidate=None, similarity=0.995, **over):
    report = QualityReport("hello world", "en", 24000, metrics(), candidate or metrics(), similarity)
    data = exactness(
        model_type="gpt-sovits-v3",
        feature="diffusion_sampling",
        technique="cfm_short_schedule",
        kind="quality",
        checkpoint={"kind": "real", "sha256": {"s1v3.ckpt": SHA, "s2Gv3.pth": "cd" * 32}},
        measurements={"thresholds": GATE_THRESHOLDS.to_dict(), "seed": 0, "reports": [report.to_dict()]},
    )
    data.update(over)
    return data


def write(tmp_path, *docs):
    for n, d in enumerate(docs):
        (tmp_path / f"e{n}.json").write_text(json.dumps(d))
    return EvidenceStore.from_directory(tmp_path)


def test_consistent_files_pass():
    check_evidence(exactness())
    check_evidence(quality())


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: d.pop("command"), "missing field"),
        (lambda d: d.update(schema="voicehub.optimization.evidence/0"), "schema"),
        (lambda d: d.update(command=" "), "command"),
        (lambda d: d["versions"].pop("torch"), "versions"),
        (lambda d: d["checkpoint"]["sha256"].update({"x": "nothex"}), "sha256"),
        (lambda d: d.update(dtype="int4"), "dtype"),
        (lambda d: d.update(decision="maybe"), "decision"),
        # the numbers contradict the decision
        (lambda d: d["measurements"]["outputs"][0].update(rel_l2=0.05), "numbers say 'rejected'"),
        (
            lambda d: d["measurements"]["tokens"][0].update(
                n_mismatched=1, first_divergence={"step": 7, "margin": 0.2}
            ),
            "numbers say 'rejected'",
        ),
        # a looser tolerance than the rule allows for the dtype
        (lambda d: d["measurements"].update(tolerance_rel_l2=0.05), "outside"),
        (lambda d: d.update(dtype="float32"), "outside"),  # fp32 allows 1e-3 only
        (lambda d: d["measurements"]["tokens"][0].update(n_compared=600), "n_compared"),
        (
            lambda d: d["measurements"]["tokens"][0].update(n_mismatched=1, first_divergence=None),
            "first_divergence",
        ),
        (lambda d: d["measurements"].pop("tolerance_rel_l2"), "malformed"),
    ],
)
def test_inconsistent_exactness_files_raise(mutate, match):
    data = copy.deepcopy(exactness())
    mutate(data)
    with pytest.raises(EvidenceError, match=match):
        check_evidence(data)


def test_exact_but_slower_is_rejected():
    slower = exactness()
    slower["measurements"]["timing"] = {"eager_ms": 10.0, "optimized_ms": 12.0}
    with pytest.raises(EvidenceError, match="numbers say 'rejected'"):
        check_evidence(slower)
    check_evidence({**slower, "decision": "rejected"})
    faster = exactness()
    faster["measurements"]["timing"] = {"eager_ms": 10.0, "optimized_ms": 4.0}
    check_evidence(faster)
    faster["measurements"]["timing"]["eager_ms"] = 0
    with pytest.raises(EvidenceError, match="timing"):
        check_evidence(faster)


def test_a_rejection_consistent_with_its_numbers_loads():
    data = exactness(decision="rejected")
    data["measurements"]["outputs"][0]["rel_l2"] = 0.03
    check_evidence(data)


def test_quality_file_checks():
    with pytest.raises(EvidenceError, match="numbers say 'rejected'"):
        check_evidence(quality(similarity=0.95))
    check_evidence(quality(similarity=0.95, decision="rejected"))
    loose = quality()
    loose["measurements"]["thresholds"]["min_speaker_similarity"] = 0.9
    with pytest.raises(EvidenceError, match="thresholds"):
        check_evidence(loose)
    edited = quality(candidate=metrics(loudness_lufs=-22.0))
    edited["decision"] = "rejected"
    edited["measurements"]["reports"][0]["reasons"] = []  # reasons that do not follow from the metrics
    with pytest.raises(EvidenceError, match="reasons"):
        check_evidence(edited)
    with pytest.raises(EvidenceError, match="real checkpoint"):
        check_evidence(quality(checkpoint={"kind": "random", "sha256": {"a": SHA}}))


def test_auto_selects_an_exact_technique_validated_by_evidence_and_cites_it(tmp_path):
    store = write(tmp_path, exactness())
    plan = TTSOptimizationConfig().resolve("vits", context=H200, evidence=store)
    d = plan.decision("attention")
    assert d.selected == "sdpa" and d.kind == "exact" and d.evidence["file"].endswith("e0.json")
    assert json.loads(plan.manifest())["evidence"] == [d.evidence]
    # the same evidence says nothing about another dtype or GPU
    for ctx in (replace(H200, dtype="bfloat16"), replace(H200, gpu_arch="sm_80")):
        assert (
            TTSOptimizationConfig()
            .resolve("vits", context=ctx, evidence=store)
            .decision("attention")
            .is_native
        )


def test_auto_respects_a_newer_rejection(tmp_path):
    bad = exactness(created="2026-02-01", decision="rejected")
    bad["measurements"]["outputs"][0]["rel_l2"] = 0.5
    store = write(tmp_path, exactness(), bad)
    d = TTSOptimizationConfig().resolve("vits", context=H200, evidence=store).decision("attention")
    assert d.is_native and "rejected by" in d.reason


# A test-local family with one implemented approximate technique and nothing else.
FAKE = FamilyCapabilities(
    model_type="fake-tts",
    techniques=(
        Technique(
            Feature.DIFFUSION_SAMPLING, "cfm_short_schedule", TechniqueKind.APPROXIMATE, "fake schedule"
        ),
    ),
)
CAPS = MappingProxyType({**FAMILY_CAPABILITIES, FAKE.model_type: FAKE})


def test_approximate_technique_needs_a_real_checkpoint_quality_run(tmp_path):
    proof = exactness(model_type="fake-tts", feature="diffusion_sampling", technique="cfm_short_schedule")
    plan = TTSOptimizationConfig().resolve(
        "fake-tts", context=H200, evidence=write(tmp_path, proof), capabilities=CAPS
    )
    d = plan.decision("diffusion_sampling")
    assert d.is_native and "approximate" in d.reason
    (tmp_path / "e0.json").unlink()
    store = write(tmp_path, quality(model_type="fake-tts"))
    plan = TTSOptimizationConfig().resolve("fake-tts", context=H200, evidence=store, capabilities=CAPS)
    d = plan.decision("diffusion_sampling")
    assert d.selected == "cfm_short_schedule" and d.evidence["kind"] == "quality"


def test_validated_evidence_does_not_select_a_not_implemented_technique(tmp_path):
    store = write(tmp_path, exactness(feature="kernels", technique="torch"))  # vits: declared, not built
    d = TTSOptimizationConfig().resolve("vits", context=H200, evidence=store).decision("kernels")
    assert d.is_native and "torch: not implemented yet" in d.reason


def test_gpt_sovits_cfm_schedule_turns_on_only_with_real_checkpoint_quality_evidence(tmp_path):
    d = TTSOptimizationConfig().resolve("gpt-sovits-v3", context=H200, evidence=EvidenceStore())
    sampling = d.decision("diffusion_sampling")
    assert sampling.is_native and "approximate" in sampling.reason and "real checkpoint" in sampling.reason
    store = write(tmp_path, quality())  # gpt-sovits-v3, cfm_short_schedule, real checkpoint, accepted
    d = TTSOptimizationConfig().resolve("gpt-sovits-v3", context=H200, evidence=store)
    sampling = d.decision("diffusion_sampling")
    assert sampling.selected == "cfm_short_schedule" and sampling.kind == "approximate"
    assert sampling.evidence["kind"] == "quality" and d.decision("diffusion_cache").is_native


def test_a_bad_file_in_the_folder_stops_loading(tmp_path):
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(EvidenceError, match="broken.json"):
        EvidenceStore.from_directory(tmp_path)


def test_packaged_evidence_files_are_consistent():
    """Every committed file in voicehub/optimization/evidence/ passes the checks and names a real technique."""
    store = EvidenceStore.packaged()  # raises EvidenceError on the first inconsistent file
    for ev in store.items:
        model_type, feature, technique, _, _ = ev.key
        names = [t.name for t in FAMILY_CAPABILITIES[model_type].for_feature(feature)]
        assert technique in names, (ev.source, names)
