"""Load-time warm-up of GPT-SoVITS v3 (warmup.py): the text frontend and the default voice's reference are
built when the model loads, and a first request builds nothing more (tiny `make-checkpoint` set, CPU)."""

from __future__ import annotations

import json

import pytest
import torch
from gpt_sovits_fixtures import REFERENCE_TEXT

from voicehub.models.gpt_sovits import Voice, load
from voicehub.models.gpt_sovits.model import _sync_if_initialized
from voicehub.models.gpt_sovits.warmup import LoadTimeline, voice_languages
from voicehub.text.frontend import TextFrontend

KW = dict(seed=0, force_n_tokens=8, speed=1.0)


@pytest.fixture
def built(monkeypatch) -> list[str]:
    """The g2p languages every TextFrontend builds from now on, in order."""
    languages: list[str] = []
    build = TextFrontend._build

    def recording(self, language):
        languages.append(language)
        return build(self, language)

    monkeypatch.setattr(TextFrontend, "_build", recording)
    return languages


def test_load_builds_the_english_frontend_not_the_first_request(tiny_set, reference_wav, built):
    model = load(tiny_set)
    assert built == ["en"]
    assert model.describe()["warm_up"]["load"]["g2p"] == ["en"]
    english = model.frontend.g2p("en")
    model.generate(
        "A first request, with 2 numbers: 3.", voice=Voice(reference_wav, REFERENCE_TEXT, "en"), **KW
    )
    assert built == ["en"] and model.frontend.g2p("en") is english  # nothing was built in the request


def test_lazy_load_warms_up_when_the_weights_load(tiny_set, built):
    model = load(tiny_set, lazy_load=True)
    assert built == []
    model.pipeline  # noqa: B018 (reads the weights)
    assert built == ["en"]


def test_default_voice_warms_its_languages_and_reference(tiny_set, reference_wav, built):
    voice = Voice(reference_wav, "你好，世界。今天天气很好。", "zh")
    model = load(tiny_set, default_voice=voice)
    assert sorted(built) == ["en", "zh"]
    warm = model.describe()["warm_up"]["load"]
    assert warm["reference"] and not warm["chain"]  # the chain runs on CUDA only
    cache = model.reference_cache
    assert (cache.misses, cache.hits) == (1, 0)
    model.generate("你好。", **KW)  # the default voice
    assert cache.misses == 1 and cache.hits >= 1
    assert sorted(built) == ["en", "zh"]


def test_an_unknown_default_voice_name_is_left_to_requests(tiny_set, built, caplog):
    model = load(tiny_set, default_voice="nobody")  # no registry: a request naming no voice would raise
    assert built == ["en"] and "not warmed up at load" in caplog.text
    assert model.describe()["warm_up"]["load"]["reference"] is False


@pytest.mark.parametrize(
    "prompt, language, expect",
    [
        (REFERENCE_TEXT, "en", (["en"], [])),
        ("你好，世界。", "all_zh", (["zh"], ["en"])),
        ("你好 world。", "zh", (["en", "zh"], [])),
        ("こんにちは、世界。", "ja", (["ja"], ["en"])),
        ("你好，こんにちは。", "auto", (["ja", "zh"], ["en"])),
    ],
)
def test_voice_languages(reference_wav, prompt, language, expect):
    assert voice_languages(Voice(reference_wav, prompt, language)) == expect
    assert voice_languages(None) == ([], ["en"])


# The main thread's phases of a CPU load with a default voice, in order (no graphs on the CPU).
MAIN_PHASES = ["weights.read", "weights.t2s", "weights.sovits", "weights.bigvgan", "weights.hubert",
               "weights.bert", "t2s_decoder_build", "wait_text", "optimization_apply", "voice.reference",
               "wait_text_deferred"]  # fmt: skip


def test_load_records_its_timeline_and_reads_the_deferred_text_parts(tiny_set, reference_wav, monkeypatch):
    from voicehub.text.en import g2p as english

    steps: list[str] = []
    load_deferred = english.EnglishG2P.load_deferred

    def recording():
        steps.append("start")
        load_deferred()
        steps.append("done")

    monkeypatch.setattr(english.EnglishG2P, "load_deferred", staticmethod(recording))
    model = load(tiny_set, default_voice=Voice(reference_wav, REFERENCE_TEXT, "en"))
    assert steps == ["start", "done"]  # wordsegment read during the load, not by a request
    info = json.loads(json.dumps(model.describe()["warm_up"]["load"]))  # JSON-ready
    seconds, starts = info["timeline_s"], info["timeline_start_s"]
    threads = {"text_thread.en", "text_thread.en_deferred"}
    assert set(MAIN_PHASES) | threads <= set(seconds)
    assert "runtime_thread.cuda_init" not in seconds  # a CPU load makes no CUDA context
    assert all(seconds[name] >= 0 for name in seconds)
    main = [name for name in seconds if not name.startswith(("text_thread.", "runtime_thread."))]
    assert [name for name in main if name in MAIN_PHASES] == MAIN_PHASES  # ordered by start
    for before, after in zip(main, main[1:]):  # the main thread's phases do not overlap
        assert starts[before] + seconds[before] <= starts[after] + 1e-3, (before, after)
    assert sum(seconds[name] for name in main) <= info["total_s"] + 1e-3
    # one text thread: the deferred parts after the languages
    assert starts["text_thread.en_deferred"] >= starts["text_thread.en"] + seconds["text_thread.en"] - 1e-3
    assert info["text_deferred_s"] >= seconds["text_thread.en_deferred"] - 1e-3


# A fresh process: load with an English default voice, then a request with numbers and a Chinese one.
NO_IMPORT_SCRIPT = r"""
import sys
from voicehub.models.gpt_sovits import Voice, load
model = load(sys.argv[1], default_voice=Voice(sys.argv[2], sys.argv[3], "en"))
model.generate("It costs $3.50, on May 21st 1984.", seed=0, force_n_tokens=8, speed=1.0)
print(sorted({m.split(".")[0] for m in sys.modules} & {"transformers", "inflect"}))
"""


def test_a_load_and_a_request_import_neither_transformers_nor_inflect(tiny_set, reference_wav):
    # both cost seconds of process start (their import alone, and the lock they hold beside the weight
    # loads): HuBERT/BERT and English numbers are our own
    import subprocess
    import sys

    args = [sys.executable, "-c", NO_IMPORT_SCRIPT, str(tiny_set), str(reference_wav), REFERENCE_TEXT]
    out = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_a_timeline_syncs_before_it_stamps_a_phase_end():
    calls: list[str] = []
    timeline = LoadTimeline(sync=lambda: calls.append("sync"))
    with timeline.phase("gpu"):
        calls.append("work")
    with timeline.phase("text_thread.en", sync=False):
        pass
    assert calls == ["work", "sync"]
    assert list(timeline.info()["timeline_s"]) == ["gpu", "text_thread.en"]


def test_a_cuda_load_syncs_its_own_device_once_cuda_is_initialised(monkeypatch):
    # a bare torch.cuda.synchronize() waits for cuda:0 (and makes a context there) whatever the model's device
    synced: list = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    _sync_if_initialized(torch.device("cuda:1"))
    assert synced == []  # nothing queued before the context exists
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    _sync_if_initialized(torch.device("cuda:1"))
    assert synced == [torch.device("cuda:1")]


def test_a_failed_warm_up_leaves_no_pipeline_and_the_next_use_loads_again(tiny_set, reference_wav, tmp_path):
    from voicehub.optimization.config import TTSOptimizationConfig
    from voicehub.optimization.mixin import PENDING_ATTR, apply_load_time_config

    ref = tmp_path / "ref.wav"
    ref.write_bytes(b"not audio")  # the default voice's reference cannot be read at load
    model = load(tiny_set, lazy_load=True, default_voice=Voice(ref, REFERENCE_TEXT, "en"))
    apply_load_time_config(model, TTSOptimizationConfig(kernel_backend="torch"))
    with pytest.raises(Exception, match="ref.wav"):
        model.load_runtime()
    assert model._pipeline is None  # not a loaded-but-never-warmed pipeline for the next use
    assert model.optimization_result is None and getattr(model, PENDING_ATTR) is not None
    ref.write_bytes(reference_wav.read_bytes())
    model.load_runtime()  # loads again, applies the config, warms the voice up
    assert model.warm_up_info["load"]["reference"] and model.optimization_result is not None


def _pending_model(config):
    from voicehub.models.gpt_sovits.model import GptSovitsModel
    from voicehub.optimization.config import OptimizationContext
    from voicehub.optimization.mixin import PENDING_ATTR

    model = GptSovitsModel.__new__(GptSovitsModel)  # no weights: only the pending config is read
    context = OptimizationContext(device="cuda:0", dtype="float16", gpu_arch="sm_90")
    setattr(model, PENDING_ATTR, None if config is None else (config, context))
    return model


@pytest.mark.parametrize(
    "backend, runs", [("triton", True), ("auto", True), ("torch", False), ("native", False), (None, False)]
)
def test_a_load_warms_triton_only_when_its_config_selects_triton(backend, runs):
    # auto selects triton for fp16 on sm_90: the shipped evidence validates it there
    from voicehub.optimization.config import TTSOptimizationConfig

    config = None if backend is None else TTSOptimizationConfig(kernel_backend=backend)
    assert _pending_model(config)._load_runs_triton() is runs


def test_warm_triton_names_what_it_skips_when_triton_lacks_an_internal(monkeypatch):
    import sys

    from voicehub.models.gpt_sovits.warmup import warm_triton

    monkeypatch.setitem(sys.modules, "triton.runtime.cache", None)  # import of it raises ImportError
    timeline = LoadTimeline()
    warm_triton(timeline)
    info = timeline.info()
    assert "runtime_thread.triton" in info["timeline_s"]
    assert "triton.runtime.cache" in info["notes"]["runtime_thread.triton_skipped"]


@pytest.mark.gpu
def test_a_triton_load_warms_triton_on_the_runtime_thread_before_its_first_kernel(tiny_set, reference_wav):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from triton.runtime.cache import triton_key

    from voicehub import AutoModelForTextToSpeech
    from voicehub.optimization.config import TTSOptimizationConfig

    model = AutoModelForTextToSpeech.from_pretrained(
        tiny_set,
        model_type="gpt-sovits-v3",
        device="cuda",
        cuda_graph_preset="minimal",
        optimization_config=TTSOptimizationConfig(kernel_backend="triton", compile="disabled"),
        default_voice=Voice(reference_wav, REFERENCE_TEXT, "en"),
    )
    info = model.describe()["warm_up"]["load"]
    seconds, starts = info["timeline_s"], info["timeline_start_s"]
    assert "notes" not in info, info.get("notes")
    # after the context on the same thread, and done before the main thread's first Triton kernel
    assert (
        starts["runtime_thread.triton"]
        >= starts["runtime_thread.cuda_init"] + seconds["runtime_thread.cuda_init"] - 1e-3
    )
    waited = starts["wait_runtime_thread"] + seconds["wait_runtime_thread"]
    assert starts["runtime_thread.triton"] + seconds["runtime_thread.triton"] <= waited + 1e-3
    assert waited <= starts["optimization_apply"] + 1e-3
    assert triton_key.cache_info().currsize == 1
