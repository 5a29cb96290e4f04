"""Loading does each piece of work once (tiny `make-checkpoint` set, CPU): a load-time optimization config
is applied before the T2S graphs are captured and before the warm-up, so both run once; the English
frontend's word segmenter reads its tables once per process."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gpt_sovits_fixtures import REFERENCE_TEXT

from voicehub import AutoModelForTextToSpeech
from voicehub.models.gpt_sovits import Voice, load
from voicehub.models.gpt_sovits import model as model_module
from voicehub.models.gpt_sovits.files import find_model_files
from voicehub.models.gpt_sovits.model import GptSovitsModel
from voicehub.models.gpt_sovits.optimization import KernelBackendTransform
from voicehub.optimization import TTSOptimizationConfig
from voicehub.optimization.config import OptimizationContext
from voicehub.optimization.mixin import apply_load_time_config
from voicehub.runtime.cuda_graphs import BucketedGraphRunner, GraphPreset
from voicehub.runtime.kernels import registry
from voicehub.text.en import g2p as english

KW = dict(seed=0, force_n_tokens=8, speed=1.0)


@pytest.fixture
def warm_ups(monkeypatch) -> list[str]:
    """The pipelines' ids of every default-voice warm-up (the function that runs the chain on CUDA)."""
    calls: list[str] = []
    warm_voice = model_module.warm_voice

    def counting(pipe, voice, *timeline):
        calls.append(pipe.model_id)
        return warm_voice(pipe, voice, *timeline)

    monkeypatch.setattr(model_module, "warm_voice", counting)
    return calls


def test_a_load_time_config_warms_up_once_and_gives_the_same_audio(tiny_set, reference_wav, warm_ups):
    voice = Voice(reference_wav, REFERENCE_TEXT, "en")
    config = TTSOptimizationConfig(kernel_backend="torch")
    model = AutoModelForTextToSpeech.from_pretrained(
        tiny_set, model_type="gpt-sovits-v3", default_voice=voice, optimization_config=config
    )
    assert len(warm_ups) == 1 and model.is_runtime_loaded
    assert [a["technique"] for a in model.optimization_result.to_dict()["applied"]] == ["torch"]
    assert model.pending_optimization_config is None
    # The same model optimized after loading: the same audio (its optimize() warms up again, by design).
    later = load(tiny_set, default_voice=voice)
    later.optimize(config)
    assert len(warm_ups) == 3
    np.testing.assert_array_equal(
        model.generate("A test.", **KW).audio, later.generate("A test.", **KW).audio
    )


def test_a_failing_load_time_config_fails_the_load_and_leaves_it_pending(tiny_set, monkeypatch):
    def broken(self):
        raise RuntimeError("kernel failed")

    monkeypatch.setattr(KernelBackendTransform, "apply", broken)
    model = GptSovitsModel(find_model_files(tiny_set), torch.device("cpu"), torch.float32, lazy_load=True)
    apply_load_time_config(model, TTSOptimizationConfig(kernel_backend="torch"))
    with pytest.raises(RuntimeError, match="kernel failed"):
        model.load_runtime()
    assert not model.is_runtime_loaded and model.pending_optimization_config is not None
    assert model.optimization_result is None


def test_a_load_time_kernel_change_captures_the_graphs_once(tiny_set, monkeypatch):
    # Capture needs CUDA: here the graph runner records what it would capture, and the triton transform
    # swaps in stand-in functions (nothing runs a decode step: no default voice, so no warm-up chain).
    captured: list = []
    init = BucketedGraphRunner.__init__

    def on_cuda(self, step, buckets, preset, device, **kw):
        init(self, step, buckets, preset, torch.device("cuda"), **kw)

    monkeypatch.setattr(BucketedGraphRunner, "__init__", on_cuda)
    monkeypatch.setattr(BucketedGraphRunner, "_capture", lambda self, key: captured.append(key))
    monkeypatch.setattr(
        model_module, "uses_graph_decoder", lambda device, preset: preset is not GraphPreset.OFF
    )
    monkeypatch.setattr(KernelBackendTransform, "validate", lambda self: None)
    stand_ins = {op: (lambda *a, **k: None) for op in registry.ops()}
    monkeypatch.setattr(registry, "resolve", lambda op, backend, device: stand_ins[op])

    files = find_model_files(tiny_set)
    model = GptSovitsModel(
        files, torch.device("cpu"), torch.float32, cuda_graph_preset="full", lazy_load=True
    )
    gpu = OptimizationContext(mode="inference", device="cuda", dtype="float16", gpu_arch="sm_90",
                              cuda_graph_preset="full")  # fmt: skip
    apply_load_time_config(
        model, TTSOptimizationConfig(kernel_backend="triton", compile="disabled"), context=gpu
    )
    model.load_runtime()
    decoder = model.pipeline.t2s_decoder
    assert decoder.kernels.layer_stack is stand_ins[registry.T2S_LAYER_STACK]
    assert decoder.preset is GraphPreset.FULL and decoder.graphs.preset is GraphPreset.FULL
    # every key of the decode step and of the prompt prefill, each once
    assert decoder.prefill is not None
    assert sorted(captured) == sorted([*decoder.graphs.buckets, *decoder.prefill.graphs.buckets])


def test_wordsegment_loads_once_per_process(monkeypatch):
    loads: list[int] = []
    read_tables = english._segmenter_counts
    monkeypatch.setattr(english, "_segmenter_counts", lambda: loads.append(1) or read_tables())
    english._segmenter_tables.cache_clear()
    first, second = english.EnglishG2P(), english.EnglishG2P()
    assert loads == []  # read on the first unknown word, not when a frontend is built
    text = first.normalize("Wordsegmenting helps unknownwords.")
    assert first.g2p(text) == second.g2p(text) and first.g2p(text)[0]
    assert loads == [1]
