"""The benchmark protocol and its reports, on the CPU with a fake model and a fake clock."""

from __future__ import annotations

import json

import numpy as np
import pytest

from voicehub.bench.protocol import BenchSettings, Profile, default_profiles, run_benchmark
from voicehub.bench.report import markdown_table, write_reports
from voicehub.optimization import OptimizableModelMixin, TTSOptimizationConfig
from voicehub.types import TTSOutput

RATE = 1000  # Hz: a cheap stand-in for real audio
TEXT = "a text long enough for twelve seconds of audio"


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class Speedup:
    def __init__(self, model, feature, technique, factor):
        self.model, self.feature, self.technique, self.factor = model, feature, technique, factor
        self.name = f"{feature}:{technique}"

    def validate(self):
        pass

    def apply(self):
        self.model.cost /= self.factor

        def undo():
            self.model.cost *= self.factor

        return undo


class FakeModel(OptimizableModelMixin):
    model_type = "vits"

    def __init__(self, clock, seconds=12.0):
        self.device, self.dtype, self.sample_rate = "cpu", "float32", RATE
        self.clock, self.seconds, self.cost, self.n_calls = clock, seconds, 0.6, 0

    def optimization_targets(self):
        return [
            Speedup(self, "attention", "sdpa", 2.0),
            Speedup(self, "kernels", "torch", 1.5),
            Speedup(self, "compile", "torch_compile", 3.0),
        ]

    def generate(self, text, *, seed=None, **params):
        self.n_calls += 1
        self.clock.t += self.cost * (5 if self.n_calls == 1 else 1)  # the first call pays set-up costs
        rng = np.random.default_rng(seed)
        audio = (0.1 * rng.standard_normal(int(self.seconds * RATE))).astype(np.float32)
        return TTSOutput(audio=audio, sample_rate=RATE, text=text)


def bench(seconds=12.0, **kw):
    clock = Clock()
    settings = BenchSettings(model_type="vits", text=TEXT, model="fake-voice", seed=3, **kw)
    return run_benchmark(lambda: FakeModel(clock, seconds), settings, timer=clock)


def test_default_profiles_are_eager_each_technique_alone_then_auto():
    names = [p.name for p in default_profiles("vits")]
    assert names == [
        "eager",
        "attn_implementation=sdpa",
        "kernel_backend=triton",
        "kernel_backend=torch",
        "compile=required",
        "auto",
    ]
    alone = default_profiles("gpt-sovits-v3")[1].config
    assert alone.attn_implementation == "flash_attention_4" and alone.kernel_backend == "native"
    assert alone.compile == alone.diffusion_cache == alone.diffusion_sampling == "disabled"


def test_protocol_measures_each_profile_and_skips_what_cannot_run():
    record = bench()
    rows = {r["name"]: r for r in record["profiles"]}
    for name in ("kernel_backend=triton", "kernel_backend=torch"):  # declared for vits, not built yet
        assert rows[name]["status"] == "skipped" and "not implemented yet" in rows[name]["reason"]
    eager, sdpa, compiled = rows["eager"], rows["attn_implementation=sdpa"], rows["compile=required"]
    assert eager["warm_latencies_s"] == pytest.approx([0.6] * 3) and eager["cold_latency_s"] == pytest.approx(
        3.0
    )
    assert sdpa["warm_latency_median_s"] == pytest.approx(0.3) and sdpa["speedup_vs_eager"] == pytest.approx(
        2.0
    )
    assert compiled["speedup_vs_eager"] == pytest.approx(3.0)
    assert rows["auto"]["speedup_vs_eager"] == pytest.approx(1.0)  # no evidence: auto stays eager
    assert eager["audio_s"] == pytest.approx(12.0) and eager["rtf"] == pytest.approx(0.05)
    assert eager["peak_allocated_bytes"] is None and eager["memory_drop_ratio"] is None  # CPU
    applied = sdpa["manifest"]["applied"]
    assert [a["technique"] for a in applied] == ["sdpa"]
    s = record["settings"]
    assert (s["n_warmup"], s["n_reps"], s["precision"], s["seed"], s["device"]) == (1, 3, "float32", 3, "cpu")
    assert (
        record["environment"]["versions"]["torch"] and "max_memory_allocated" in record["memory_definition"]
    )


def test_extra_warmups_are_not_timed():
    rows = {r["name"]: r for r in bench(n_warmup=3, n_reps=4)["profiles"]}
    assert rows["eager"]["warm_latencies_s"] == pytest.approx([0.6] * 4)


def test_short_text_is_refused():
    with pytest.raises(ValueError, match="needs >= 10.0 s"):
        bench(seconds=4.0)


@pytest.mark.parametrize(
    ("kw", "match"), [({"n_reps": 2}, "n_reps"), ({"n_warmup": 0}, "n_warmup"), ({"text": " "}, "empty")]
)
def test_settings_are_checked(kw, match):
    with pytest.raises(ValueError, match=match):
        BenchSettings(**{"model_type": "vits", "text": TEXT, **kw})


def test_first_profile_must_be_eager():
    settings = BenchSettings(model_type="vits", text=TEXT)
    with pytest.raises(ValueError, match="eager"):
        run_benchmark(lambda: None, settings, profiles=[Profile("auto", TTSOptimizationConfig())])


def test_quality_gate_scores_each_profile_against_eager():
    class Gate:
        def __init__(self):
            self.seen = []

        def compare(self, eager, candidate, rate, text):
            self.seen.append(np.array_equal(eager, candidate))

            class Report:
                def to_dict(self):
                    return {"accepted": True, "reasons": []}

            return Report()

    clock, gate = Clock(), Gate()
    settings = BenchSettings(model_type="vits", text=TEXT, seed=3)
    record = run_benchmark(lambda: FakeModel(clock), settings, quality_gate=gate, timer=clock)
    measured = [r for r in record["profiles"] if r["status"] == "measured"]
    assert "quality" not in measured[0] and all(r["quality"]["accepted"] for r in measured[1:])
    assert gate.seen == [True] * (len(measured) - 1)  # same seed, same audio from the fake


def test_reports_are_written(tmp_path):
    record = bench()
    paths = write_reports(record, tmp_path)
    assert json.loads(paths["json"].read_text()) == record
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = paths["markdown"].read_text()
    assert md == markdown_table(record)
    assert "| attn_implementation=sdpa | measured |" in md and "| kernel_backend=triton | skipped:" in md
    assert "2.00x" in md and "measured repetitions: 3" in md


def test_a_graph_preset_adds_a_graph_profile_and_loads_every_other_profile_with_it():
    profiles = default_profiles("gpt-sovits-v3", "full")
    assert [p.name for p in profiles[:2]] == ["eager", "cuda_graphs"] and profiles[-1].name == "auto"
    assert profiles[0].engine == {"cuda_graph_preset": "off"}
    assert all(p.engine == {"cuda_graph_preset": "full"} for p in profiles[1:])
    assert profiles[1].config == TTSOptimizationConfig.eager()
    assert all(p.engine == {} for p in default_profiles("gpt-sovits-v3"))


def test_engine_and_params_reach_the_loader_and_generate(tmp_path):
    clock, seen = Clock(), []

    class Recording(FakeModel):
        def generate(self, text, *, seed=None, **params):
            seen.append(params)
            return super().generate(text, seed=seed)

    def load(**engine):
        seen.append(engine)
        return Recording(clock)

    profiles = [Profile("eager", TTSOptimizationConfig.eager(), {"cuda_graph_preset": "off"})]
    settings = BenchSettings(model_type="vits", text=TEXT, params={"force_n_tokens": 9})
    record = run_benchmark(load, settings, profiles, timer=clock, audio_dir=tmp_path)
    assert seen[0] == {"cuda_graph_preset": "off"} and seen[1] == {"force_n_tokens": 9}
    row = record["profiles"][0]
    assert row["engine"] == {"cuda_graph_preset": "off"} and (tmp_path / row["audio_file"]).is_file()


def test_saved_audio_is_scored_later_against_eager(tmp_path):
    from voicehub.bench.protocol import score_saved_audio

    clock = Clock()
    settings = BenchSettings(model_type="vits", text=TEXT, seed=3)
    record = run_benchmark(lambda: FakeModel(clock), settings, timer=clock, audio_dir=tmp_path)

    class Gate:
        def compare(self, eager, candidate, rate, text):
            class Report:
                def to_dict(self):
                    return {"accepted": bool(np.array_equal(eager, candidate)), "reasons": [], "text": text}

            return Report()

    scored = score_saved_audio(record, tmp_path, Gate())
    measured = [r for r in scored["profiles"] if r["status"] == "measured"]
    assert len(measured) > 1 and all(r["quality"]["accepted"] for r in measured[1:])


def test_a_profile_that_fails_to_apply_is_recorded_and_the_rest_go_on():
    from voicehub.optimization import OptimizationCompileError

    clock = Clock()

    class Failing(FakeModel):
        def optimization_targets(self):
            targets = super().optimization_targets()
            targets[2].apply = lambda: (_ for _ in ()).throw(OptimizationCompileError("backend failed"))
            return targets

    settings = BenchSettings(model_type="vits", text=TEXT)
    rows = {r["name"]: r for r in run_benchmark(lambda: Failing(clock), settings, timer=clock)["profiles"]}
    assert (
        rows["compile=required"]["status"] == "failed"
        and "backend failed" in rows["compile=required"]["reason"]
    )
    assert rows["auto"]["status"] == "measured"
