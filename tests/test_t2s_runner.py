"""The graph-captured T2S decoder gives the eager reference's tokens (CPU: preset off; GPU: captured)."""

from __future__ import annotations

import pytest
import torch

from voicehub.models.gpt_sovits.t2s.checkpoint import load_t2s
from voicehub.models.gpt_sovits.t2s.decode import T2SSamplingParams, decode
from voicehub.models.gpt_sovits.t2s.make_checkpoint import make_t2s_checkpoint, random_prompt
from voicehub.models.gpt_sovits.t2s.runner import T2SGraphDecoder
from voicehub.models.gpt_sovits.t2s.static import StaticDecodeConfig, T2SRequest

ENGINE = StaticDecodeConfig(max_batch=2, max_seq_len=160, kv_buckets=(32, 64, 96), stop_check_interval=4)
CASES = [
    T2SSamplingParams.greedy(force_n_tokens=60),
    T2SSamplingParams.greedy(repetition_penalty=1.35, max_new_tokens=50),
    T2SSamplingParams(seed=5, top_k=5, top_p=1.0, temperature=1.0, force_n_tokens=60),
    T2SSamplingParams(seed=3, max_new_tokens=50),
]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_t2s_checkpoint(tmp_path_factory.mktemp("t2s") / "tiny.ckpt", "tiny", seed=0)


def _check_against_eager(model, config, decoder):
    for i, params in enumerate(CASES):
        req = T2SRequest(*random_prompt(config, 14 + i, 17, i), params)
        eager = decode(model, req.phone_ids, req.bert, req.prompt_tokens, params)
        (got,) = decoder.decode([req])
        assert got.tokens.tolist() == eager.tokens.tolist(), params
        assert got.stop_reason == eager.stop_reason


def test_preset_off_runs_eagerly_with_eager_tokens(ckpt):
    model, config = load_t2s(ckpt, dtype="float32")
    decoder = T2SGraphDecoder(model, ENGINE, preset="off")
    _check_against_eager(model, config, decoder)
    assert decoder.graphs.captured_buckets == []


def test_capturing_presets_need_cuda(ckpt):
    model, _ = load_t2s(ckpt, dtype="float32")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        T2SGraphDecoder(model, ENGINE, preset="full")
    with pytest.raises(ValueError, match="full, minimal, lazy, off"):
        T2SGraphDecoder(model, ENGINE, preset="sometimes")


@pytest.mark.gpu
@pytest.mark.parametrize("preset, n_at_load", [("full", 16), ("minimal", 2), ("lazy", 0)])
def test_graph_replays_give_eager_tokens_on_cuda(ckpt, preset, n_at_load):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model, config = load_t2s(ckpt, device="cuda", dtype="float32")
    decoder = T2SGraphDecoder(model, ENGINE, preset=preset)
    assert len(decoder.graphs.captured_buckets) == n_at_load  # 2 rows x 4 KV buckets x 2 EOS phases
    _check_against_eager(model, config, decoder)
    _check_against_eager(model, config, decoder)  # replays again after reseeding: same tokens
