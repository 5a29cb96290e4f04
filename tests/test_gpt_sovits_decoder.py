"""Which T2S decoder the GPT-SoVITS v3 pipeline uses, and that both give the eager reference's tokens.

CPU: preset 'off' keeps the eager reference; with the CUDA condition monkeypatched true the model
builds one graph decoder (run here with preset 'off', i.e. the static-KV step eagerly) and the
pipeline's greedy and fixed-seed tokens equal eager's. GPU (marked): real capture, same tokens.
"""

from __future__ import annotations

import logging

import pytest
import torch
from gpt_sovits_fixtures import REFERENCE_TEXT

import voicehub.models.gpt_sovits.model as model_module
from voicehub.models.gpt_sovits import Voice, load
from voicehub.models.gpt_sovits.files import find_model_files
from voicehub.models.gpt_sovits.model import GptSovitsModel
from voicehub.models.gpt_sovits.params import GptSovitsParams
from voicehub.models.gpt_sovits.t2s import StaticDecodeConfig, T2SConfig, decode, read_t2s_checkpoint
from voicehub.models.gpt_sovits.t2s.runner import T2SGraphDecoder
from voicehub.runtime.cuda_graphs import GraphPreset
from voicehub.text.options import Language

SENTENCES = ["A short test sentence.", "Another one, a little longer than the first one was."]
GREEDY = dict(top_k=1, top_p=1.0, temperature=1.0, repetition_penalty=1.0, max_new_tokens=30)
SAMPLED = dict(top_k=5, top_p=0.8, temperature=0.8, repetition_penalty=1.35, force_n_tokens=24)
SMALL_ENGINE = StaticDecodeConfig(max_seq_len=320, kv_buckets=(128, 256), stop_check_interval=4)


def _eager_tokens(pipe, ref, sentence, params, seed):
    phone_ids = torch.tensor(ref.phone_ids + sentence.phone_ids, dtype=torch.long, device=pipe.device)
    bert = torch.cat([ref.bert, sentence.bert], dim=1)
    return decode(pipe.t2s, phone_ids, bert, ref.prompt_tokens, params.sampling(seed)).tokens


def _compare_with_eager(pipe, voice, values):
    ref = pipe.reference(voice)
    params = GptSovitsParams.build(None, **values)
    for seed, text in enumerate(SENTENCES):
        sentence = pipe.text_features(text, Language.EN)
        got = pipe.decode_tokens(ref, sentence, params, seed).tokens
        want = _eager_tokens(pipe, ref, sentence, params, seed)
        assert got.tolist() == want.tolist(), (text, values)


def test_engine_sizes_come_from_the_checkpoint_cap():
    full = T2SConfig(512, 512, 16, 24, 1025, 732, 1024, 2048)  # max_sec 54: cap 2700, loop bound 1500
    engine = StaticDecodeConfig.for_checkpoint(full)
    assert engine.max_seq_len == 2048 and engine.max_seq_len >= 512 + 1500
    assert engine.buckets == (256, 512, 1024, 2048) and engine.max_batch == 1
    short = StaticDecodeConfig.for_checkpoint(T2SConfig(512, 512, 16, 24, 1025, 732, 1024, 2048, max_sec=4))
    assert short.max_seq_len == 768 and short.buckets == (256, 512, 768)  # 512 + 201 rounded up


def test_cpu_and_preset_off_keep_the_eager_reference(tiny_set, reference_wav):
    model = load(tiny_set)  # no preset named: 'auto', which is 'off' on the CPU
    assert model.pipeline.t2s_decoder is None
    assert model.describe()["cuda_graph_preset"] == "off"
    assert model.describe()["t2s_decode"] == {"path": "eager", "reason": "no CUDA graphs on cpu"}
    _compare_with_eager(model.pipeline, Voice(reference_wav, REFERENCE_TEXT, "en"), GREEDY)
    assert not model_module.uses_graph_decoder(torch.device("cuda"), GraphPreset.OFF)
    assert model_module.uses_graph_decoder(torch.device("cuda"), GraphPreset.LAZY)


@pytest.fixture(scope="module")
def graph_model(tiny_set):
    """A CPU model built as if on CUDA with preset 'lazy': the graph decoder runs its step eagerly."""
    built: list[tuple[StaticDecodeConfig, str]] = []

    def fake_decoder(t2s, engine, preset):
        built.append((engine, preset))
        return T2SGraphDecoder(t2s, SMALL_ENGINE, "off")  # no CUDA here: same step, not captured

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(model_module, "uses_graph_decoder", lambda device, preset: True)
        mp.setattr(model_module, "T2SGraphDecoder", fake_decoder)
        # the load's one capture (after any load-time kernel choice) needs CUDA: the fake keeps 'off'
        mp.setattr(model_module, "capture_t2s_graphs", lambda decoder, preset: None)
        model = GptSovitsModel(
            find_model_files(tiny_set), torch.device("cpu"), torch.float32, cuda_graph_preset=GraphPreset.LAZY
        )
        info = model.describe()
    return model, built, info


def test_graph_decoder_is_built_once_with_checkpoint_sizes(graph_model):
    model, built, info = graph_model
    assert len(built) == 1 and built[0][1] == "lazy"
    _, t2s_config, _ = read_t2s_checkpoint(model.files.gpt)
    assert built[0][0] == StaticDecodeConfig.for_checkpoint(t2s_config)
    assert isinstance(model.pipeline.t2s_decoder, T2SGraphDecoder)
    assert info["cuda_graph_preset"] == "lazy"
    assert info["t2s_decode"]["path"] == "cuda_graphs" and info["t2s_decode"]["max_seq_len"] == 320


@pytest.mark.parametrize("values", [GREEDY, SAMPLED], ids=["greedy", "fixed_seed"])
def test_graph_decoder_path_gives_eager_tokens(graph_model, reference_wav, values, monkeypatch):
    model, _, _ = graph_model
    calls = []
    decoder = model.pipeline.t2s_decoder
    monkeypatch.setattr(
        decoder, "decode", lambda reqs: calls.append(reqs) or type(decoder).decode(decoder, reqs)
    )
    _compare_with_eager(model.pipeline, Voice(reference_wav, REFERENCE_TEXT, "en"), values)
    assert len(calls) == len(SENTENCES)  # every sentence went through the static decoder


def test_request_beyond_the_static_cache_decodes_eagerly(graph_model, reference_wav, caplog):
    model, _, _ = graph_model
    with caplog.at_level(logging.WARNING, logger="voicehub.models.gpt_sovits"):
        _compare_with_eager(
            model.pipeline, Voice(reference_wav, REFERENCE_TEXT, "en"), dict(GREEDY, force_n_tokens=400)
        )
    assert "decoding it eagerly" in caplog.text


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["full", "minimal", "lazy"])
def test_cuda_graph_path_gives_eager_tokens(tiny_set, reference_wav, preset):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = load(tiny_set, device="cuda", dtype="float32", cuda_graph_preset=preset)
    decoder = model.pipeline.t2s_decoder
    assert isinstance(decoder, T2SGraphDecoder) and decoder.preset.value == preset
    assert model.describe()["t2s_decode"]["path"] == "cuda_graphs"
    voice = Voice(reference_wav, REFERENCE_TEXT, "en")
    _compare_with_eager(model.pipeline, voice, GREEDY)
    _compare_with_eager(model.pipeline, voice, SAMPLED)
    assert decoder.graphs.captured_buckets  # the decodes replayed captured graphs
