"""The padded, masked prefill (t2s/prefill.py) against the eager `encode_prompt` (CPU fp32: logits and
K/V; tokens through the graph decoder's eager twin), and on CUDA its graph replays (fp16)."""

from __future__ import annotations

import pytest
import torch

from voicehub.models.gpt_sovits.t2s.checkpoint import load_t2s
from voicehub.models.gpt_sovits.t2s.decode import T2SSamplingParams, decode, encode_prompt
from voicehub.models.gpt_sovits.t2s.make_checkpoint import make_t2s_checkpoint, random_prompt
from voicehub.models.gpt_sovits.t2s.model import prompt_attention
from voicehub.models.gpt_sovits.t2s.prefill import PaddedPrefill, prefill_buckets, prompt_mask
from voicehub.models.gpt_sovits.t2s.runner import T2SGraphDecoder
from voicehub.models.gpt_sovits.t2s.static import StaticDecodeConfig, T2SRequest
from voicehub.runtime.kv_cache import StaticKVCache

# prompt lengths 13, 31 (one below an edge of 32-position buckets), 32 (on it), 47, 70, 96 (the room)
LENGTHS = [(5, 8), (14, 17), (20, 12), (22, 25), (40, 30), (60, 36)]
ENGINE = StaticDecodeConfig(max_batch=1, max_seq_len=224, kv_buckets=(96, 160), stop_check_interval=4)


def rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = make_t2s_checkpoint(tmp_path_factory.mktemp("t2s") / "tiny.ckpt", "tiny", seed=0)
    return load_t2s(path, dtype="float32")


def _cache(config, n_rows=3, n_slots=128, device="cpu", dtype=torch.float32):
    return StaticKVCache(
        config.n_layer, n_rows, config.n_head, n_slots, config.head_dim, device=device, dtype=dtype
    )


def test_buckets_and_mask():
    assert prefill_buckets(512) == (64, 128, 192, 256, 320, 384, 448, 512)
    assert prefill_buckets(160, 64) == (64, 128, 160)
    n_text, n_audio = torch.tensor([3, 5, 1]), torch.tensor([4, 0, 6])
    mask = prompt_mask(n_text, n_audio, 12)
    assert mask.shape == (3, 1, 12, 12) and mask.any(dim=-1).all()  # no fully masked query
    for r in range(3):
        n = int(n_text[r] + n_audio[r])
        assert torch.equal(mask[r, 0, :n, :n], prompt_attention(int(n_text[r]), int(n_audio[r])))
        assert not mask[r, 0, :n, n:].any()  # real queries never see padding


def _eager(model, phones, bert, tokens):
    logits, keys, values = encode_prompt(model, phones, bert, tokens)
    return logits[0], torch.stack([k[0] for k in keys]), torch.stack([v[0] for v in values])


def test_padded_prefill_equals_encode_prompt(tiny):
    model, config = tiny
    cache = _cache(config)
    prefill = PaddedPrefill(model, cache, 96, "off", row_counts=(1, 2), bucket=32)
    assert prefill.buckets == (32, 64, 96)
    for i, (n_text, n_audio) in enumerate(LENGTHS):
        prompt = random_prompt(config, n_text, n_audio, i)
        want_logits, want_k, want_v = _eager(model, *prompt)
        got = prefill.load([1], [prompt])[0]
        n = n_text + n_audio
        assert int(cache.lengths[1]) == n
        assert rel_l2(got, want_logits) < 1e-5
        assert rel_l2(cache.k[:, 1, :, :n], want_k) < 1e-5 and rel_l2(cache.v[:, 1, :, :n], want_v) < 1e-5
        assert torch.isfinite(cache.k[:, 1]).all() and torch.isfinite(cache.v[:, 1]).all()  # padding too


def test_batched_rows_and_stale_buffers(tiny):
    # Two prompts of different lengths (different buckets alone) in one call, into rows 2 and 0; the
    # buffers hold a longer earlier prompt's ids and features: nothing of it may leak. Row 1 is untouched.
    model, config = tiny
    cache = _cache(config)
    prefill = PaddedPrefill(model, cache, 96, "off", row_counts=(1, 2), bucket=32)
    prefill.load([0, 1], [random_prompt(config, 50, 40, 7), random_prompt(config, 45, 45, 8)])
    row1 = cache.k[:, 1].clone()
    prompts = [random_prompt(config, 14, 17, 1), random_prompt(config, 30, 30, 2)]
    got = prefill.load([2, 0], prompts).clone()
    for row, r, prompt in ((2, 0, prompts[0]), (0, 1, prompts[1])):
        want_logits, want_k, _ = _eager(model, *prompt)
        n = want_k.shape[2]
        assert int(cache.lengths[row]) == n and rel_l2(got[r], want_logits) < 1e-5
        assert rel_l2(cache.k[:, row, :, :n], want_k) < 1e-5
    assert torch.equal(cache.k[:, 1], row1) and int(cache.lengths[1]) == 90
    with pytest.raises(ValueError, match="exact row counts"):
        prefill.load([0, 1, 2], [prompts[0]] * 3)
    with pytest.raises(ValueError, match="room"):
        prefill.load([0], [random_prompt(config, 60, 40, 3)])


def test_the_mask_matters(tiny):
    # Non-degenerate: without the padding mask (all keys of the bucket visible) the logits move.
    model, config = tiny
    cache = _cache(config)
    prefill = PaddedPrefill(model, cache, 96, "off", bucket=32)
    prompt = random_prompt(config, 14, 10, 4)  # 24 of 32 positions
    want = _eager(model, *prompt)[0]
    assert rel_l2(prefill.load([0], [prompt])[0], want) < 1e-5
    import voicehub.models.gpt_sovits.t2s.prefill as module

    saved = module.prompt_mask
    module.prompt_mask = lambda n_text, n_audio, n_slots: torch.ones(1, 1, n_slots, n_slots, dtype=torch.bool)
    try:
        assert rel_l2(prefill.load([0], [prompt])[0], want) > 1e-2
    finally:
        module.prompt_mask = saved


PARAMS = [
    T2SSamplingParams.greedy(force_n_tokens=50),
    T2SSamplingParams.greedy(repetition_penalty=1.35, max_new_tokens=40),
    T2SSamplingParams(seed=5, top_k=5, top_p=1.0, temperature=1.0, force_n_tokens=50),
    T2SSamplingParams(seed=3, max_new_tokens=40),
]


def test_decoder_with_padded_prefill_gives_eager_tokens(tiny):
    # Prompts of 13..96 positions: 64-position buckets 64, 128 (and across the 96/160 KV buckets decoding).
    model, config = tiny
    padded = T2SGraphDecoder(model, ENGINE, "off", padded_prefill=True)
    assert padded.prefill is not None and padded.prefill.buckets == (64, 128, 192, 224)
    assert T2SGraphDecoder(model, ENGINE, "off").prefill is None  # CUDA-less default: eager as before
    for i, (n_text, n_audio) in enumerate(LENGTHS):
        for params in (PARAMS[0], PARAMS[1 + i % 3]):  # greedy, and one of the others in turn
            req = T2SRequest(*random_prompt(config, n_text, n_audio, i), params)
            eager = decode(model, req.phone_ids, req.bert, req.prompt_tokens, params)
            (got,) = padded.decode([req])
            assert got.tokens.tolist() == eager.tokens.tolist(), (n_text, n_audio, params)
            assert got.stop_reason == eager.stop_reason and len(set(got.tokens.tolist())) > 1


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["full", "minimal", "lazy"])
def test_graph_prefill_equals_eager_on_cuda(tmp_path, preset):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    path = make_t2s_checkpoint(tmp_path / "tiny.ckpt", "tiny", seed=0)
    model, config = load_t2s(path, device="cuda", dtype="float16")
    engine = StaticDecodeConfig.for_checkpoint(config)
    graphs = T2SGraphDecoder(model, engine, preset)
    eager_prefill = T2SGraphDecoder(model, engine, preset, padded_prefill=False)
    prefill = graphs.prefill
    assert prefill is not None and prefill.buckets[-1] == 512
    n_at_load = {"full": len(prefill.buckets), "minimal": 6, "lazy": 0}[preset]
    assert len(prefill.graphs.captured_buckets) == n_at_load
    for i, (n_text, n_audio) in enumerate([(30, 33), (40, 40), (80, 150), (200, 250), (300, 212)]):
        prompt = tuple(t.cuda() for t in random_prompt(config, n_text, n_audio, i))
        want_logits, want_k, want_v = _eager(model, *prompt)
        got = prefill.load([0], [prompt])[0].clone()
        n = n_text + n_audio
        assert int(graphs.cache.lengths[0]) == n
        assert rel_l2(got, want_logits) <= 1e-2
        k, v = graphs.cache.k[:, 0, :, :n], graphs.cache.v[:, 0, :, :n]
        assert rel_l2(k, want_k) <= 1e-2 and rel_l2(v, want_v) <= 1e-2
        for params in (
            T2SSamplingParams.greedy(force_n_tokens=120),
            T2SSamplingParams(seed=i, force_n_tokens=120),
        ):
            req = T2SRequest(*prompt, params)
            want = eager_prefill.decode([req])[0].tokens.tolist()
            got_tokens = graphs.decode([req])[0].tokens.tolist()
            first = next((j for j, (a, b) in enumerate(zip(want, got_tokens)) if a != b), None)
            if first is not None:  # fp16: a divergence only at a near-tie of eager's own decision
                eager = decode(model, req.phone_ids, req.bert, req.prompt_tokens, params)
                margin = float(eager.decision_margins[first])
                assert margin <= 0.1, (n_text, n_audio, params, first, margin)
    assert set(prefill.graphs.captured_buckets) >= {(1, 64), (1, 128), (1, 256), (1, 512)}


def test_padded_prefill_refuses_more_rows_than_the_cache(tiny):
    model, config = tiny
    cache = _cache(config)
    with pytest.raises(ValueError, match=f"the cache holds {cache.batch} rows"):
        PaddedPrefill(model, cache, 96, "off", row_counts=(1, cache.batch + 1), bucket=32)


def test_row_engine_admits_through_the_padded_prefill(tiny):
    from voicehub.models.gpt_sovits.t2s.scheduler import T2SRowEngine

    model, config = tiny
    engine = StaticDecodeConfig(max_batch=2, max_seq_len=224, kv_buckets=(96, 160), stop_check_interval=4)
    results = []
    for padded in (False, True):
        rows = T2SRowEngine(model, engine, "off", padded_prefill=padded)
        assert (rows.prefill is not None) == padded
        if padded:  # at most the engine's rows a call: a capture's warm-up writes rows 0..n-1
            assert rows.prefill.row_counts == (2,)
        for row, (n_text, n_audio) in enumerate([(14, 17), (40, 30)]):
            params = T2SSamplingParams.greedy(force_n_tokens=30)
            rows.admit(row, T2SRequest(*random_prompt(config, n_text, n_audio, row), params))
        for _ in range(30):
            rows.step(2)
        results.append([rows.result(r).tokens.tolist() for r in range(2)])
    assert results[0] == results[1] and len(set(results[0][0])) > 1 and len(results[0][1]) == 30
