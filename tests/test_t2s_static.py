"""Static-KV decode against the eager reference (CPU, fp32), and the runtime pieces it is built from."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from voicehub.models.gpt_sovits.t2s.checkpoint import load_t2s
from voicehub.models.gpt_sovits.t2s.decode import (
    StopReason,
    T2SSamplingParams,
    decode,
    encode_prompt,
    reference_probs,
)
from voicehub.models.gpt_sovits.t2s.make_checkpoint import make_t2s_checkpoint, random_prompt
from voicehub.models.gpt_sovits.t2s.static import (
    StaticDecodeConfig,
    T2SRequest,
    forward_step,
)
from voicehub.models.gpt_sovits.t2s.static_decoder import T2SStaticDecoder
from voicehub.runtime.kv_cache import StaticKVCache, pick_bucket
from voicehub.runtime.sampling import SamplingBuffers, draw, filtered_probs, penalize_repeats

BUCKETS = (32, 48, 64, 96)  # small, so short prompts cross several edges while decoding
REFERENCE = json.loads(
    (Path(__file__).parent / "data" / "upstream_keys" / "t2s_tiny_decode.json").read_text()
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = make_t2s_checkpoint(tmp_path_factory.mktemp("t2s") / "tiny.ckpt", "tiny", seed=0)
    return load_t2s(path, dtype="float32")


@pytest.fixture(scope="module")
def decoder(tiny):
    engine = StaticDecodeConfig(max_batch=4, max_seq_len=160, kv_buckets=BUCKETS, stop_check_interval=4)
    return T2SStaticDecoder(tiny[0], engine)


def _request(config, n_phones, n_prompt, seed, params):
    return T2SRequest(*random_prompt(config, n_phones, n_prompt, seed), params)


# prefill lengths 13, 31 (one below an edge), 32 (on it), 47, 70: 50 tokens cross 1-3 bucket edges each
@pytest.mark.parametrize("n_phones, n_prompt", [(5, 8), (14, 17), (20, 12), (22, 25), (40, 30)])
def test_static_greedy_equals_eager(tiny, decoder, n_phones, n_prompt):
    model, config = tiny
    for params in (T2SSamplingParams.greedy(max_new_tokens=50), T2SSamplingParams.greedy(force_n_tokens=50)):
        req = _request(config, n_phones, n_prompt, n_phones, params)
        eager = decode(model, req.phone_ids, req.bert, req.prompt_tokens, params)
        (static,) = decoder.decode([req])
        assert static.tokens.tolist() == eager.tokens.tolist()
        assert (static.stop_reason, static.n_steps) == (eager.stop_reason, eager.n_steps)


def test_static_greedy_with_repetition_penalty_equals_eager(tiny, decoder):
    model, config = tiny
    params = T2SSamplingParams.greedy(repetition_penalty=1.35, max_new_tokens=60)
    req = _request(config, 18, 21, 7, params)
    eager = decode(model, req.phone_ids, req.bert, req.prompt_tokens, params)
    assert decoder.decode([req])[0].tokens.tolist() == eager.tokens.tolist()


@pytest.mark.parametrize(
    "case", REFERENCE["cases"], ids=lambda c: f"{c['stopped_by']}-k{c['params']['top_k']}"
)
def test_static_seeded_sampling_equals_upstream(tiny, case):
    """One row: the RNG stream is consumed as upstream's loop consumes it, so seeded tokens match."""
    p = case["params"]
    params = T2SSamplingParams(
        top_k=p["top_k"], top_p=p["top_p"], temperature=p["temperature"],
        repetition_penalty=p["repetition_penalty"], max_new_tokens=p["early_stop_num"], seed=case["seed"],
    )  # fmt: skip
    n = len(case["phone_ids"])
    bert = torch.from_numpy(
        np.random.default_rng(case["bert_seed"]).standard_normal((1024, n), dtype=np.float32)
    )
    req = T2SRequest(torch.tensor(case["phone_ids"]), bert, torch.tensor(case["prompt_tokens"]), params)
    engine = StaticDecodeConfig(max_batch=1, max_seq_len=1024, kv_buckets=(64, 128, 256, 512))
    (static,) = T2SStaticDecoder(tiny[0], engine).decode([req])
    assert static.tokens.tolist() == case["tokens"]
    assert static.stop_reason == (StopReason.EOS if case["stopped_by"] == "eos" else StopReason.MAX_TOKENS)


def test_static_batch_rows_equal_their_eager_decodes(tiny, decoder):
    """Rows of different lengths, caps and modes decode together; each equals its own eager decode."""
    model, config = tiny
    reqs = [
        _request(config, 6, 9, 1, T2SSamplingParams.greedy(max_new_tokens=40)),
        _request(config, 25, 20, 2, T2SSamplingParams.greedy(repetition_penalty=1.35, max_new_tokens=55)),
        _request(config, 12, 30, 3, T2SSamplingParams.greedy(force_n_tokens=33)),
    ]
    for req, got in zip(reqs, decoder.decode(reqs)):
        want = decode(model, req.phone_ids, req.bert, req.prompt_tokens, req.params)
        assert got.tokens.tolist() == want.tokens.tolist()
        assert got.stop_reason == want.stop_reason


def test_stale_slots_never_enter_attention(tiny):
    """Garbage beyond each row's length (and in a padded row) does not change the logits."""
    model, config = tiny
    rows = [random_prompt(config, 9, 7, 0), random_prompt(config, 12, 9, 1)]  # 16 and 21 valid slots

    def logits_with(fill: float) -> torch.Tensor:
        cache = StaticKVCache(
            config.n_layer, 3, config.n_head, 64, config.head_dim, device="cpu", dtype=torch.float32
        )
        cache.k.fill_(fill)
        cache.v.fill_(fill)
        for row, (phones, bert, prompt) in enumerate(rows):
            _, keys, values = encode_prompt(model, phones, bert, prompt)
            for i in range(config.n_layer):
                cache.fill_row(i, row, keys[i][0], values[i][0])
            cache.set_length(row, phones.shape[0] + prompt.shape[0])
        tokens = torch.tensor([3, 500, 7])
        return forward_step(model, cache, tokens, torch.tensor([7, 7, 0]), n_slots=64)

    clean, dirty = logits_with(0.0), logits_with(1e3)
    torch.testing.assert_close(dirty, clean, rtol=1e-6, atol=1e-6)
    assert torch.isfinite(dirty).all()


def test_kv_cache_append_writes_at_each_rows_length():
    cache = StaticKVCache(2, 3, 4, 10, 5, device="cpu", dtype=torch.float32)
    cache.lengths.copy_(torch.tensor([0, 4, 9]))
    k = torch.rand(3, 4, 5, generator=torch.Generator().manual_seed(0)) + 1.0  # all nonzero
    cache.append(1, k, -k)
    for row, slot in enumerate((0, 4, 9)):
        assert torch.equal(cache.k[1, row, :, slot], k[row])
        assert torch.equal(cache.v[1, row, :, slot], -k[row])
    assert torch.count_nonzero(cache.k) == k.numel() and torch.count_nonzero(cache.v) == k.numel()
    mask = cache.step_mask(10)[:, 0, 0]
    assert mask.sum(dim=1).tolist() == [1, 5, 10]
    cache.narrow(2).advance(torch.tensor([True, False]))
    assert cache.lengths.tolist() == [1, 4, 9]


def test_pick_bucket():
    assert pick_bucket(1, BUCKETS) == 32 and pick_bucket(32, BUCKETS) == 32 and pick_bucket(33, BUCKETS) == 48
    with pytest.raises(ValueError, match="largest bucket 96"):
        pick_bucket(97, BUCKETS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    "params",
    [
        T2SSamplingParams(),
        T2SSamplingParams(top_k=5, top_p=1.0, temperature=1.0),
        T2SSamplingParams(top_k=1025, top_p=0.9, temperature=1.3, repetition_penalty=1.0),
        T2SSamplingParams(top_k=3, top_p=0.5, temperature=0.0, repetition_penalty=2.0),
    ],
)
def test_device_sampling_equals_reference_sampling(params, dtype):
    """Tensor-parameter sampling gives the scalar reference's probabilities and draws, rows independent."""
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 1025, generator=gen) * 3).to(dtype)
    logits[1, :10] = logits[1, 10]  # ties at the top
    history = torch.randint(0, 1024, (3, 40), generator=gen)
    buf = SamplingBuffers.allocate(3, 1025, "cpu")
    for row in range(3):
        buf.set_row(row, top_k=params.top_k, top_p=params.top_p, temperature=params.temperature,
                    repetition_penalty=params.repetition_penalty, seen_tokens=history[row])  # fmt: skip
    penalized = penalize_repeats(logits, buf.seen, buf.repetition_penalty)
    probs = filtered_probs(penalized, buf)
    for row in range(3):
        want_probs, want_pen = reference_probs(logits[row : row + 1], history[row : row + 1], params)
        assert torch.equal(penalized[row : row + 1], want_pen)
        # temperature 0 is clamped to 1e-5: in float16 both overflow to NaN alike (upstream does too)
        torch.testing.assert_close(probs[row : row + 1], want_probs, rtol=0, atol=0, equal_nan=True)
    tokens = draw(probs, torch.Generator().manual_seed(9))
    q = torch.empty_like(probs).exponential_(1, generator=torch.Generator().manual_seed(9))
    assert tokens.tolist() == torch.argmax(probs / q, dim=-1).tolist()


def test_request_too_long_for_cache_raises(tiny, decoder):
    req = _request(tiny[1], 40, 30, 0, T2SSamplingParams.greedy(force_n_tokens=100))
    with pytest.raises(ValueError, match="max_seq_len"):
        decoder.decode([req])


def test_batch_with_different_seeds_raises(tiny, decoder):
    reqs = [_request(tiny[1], 5, 5, s, T2SSamplingParams(seed=s, max_new_tokens=5)) for s in range(2)]
    with pytest.raises(ValueError, match="same seed"):
        decoder.decode(reqs)


def test_engine_config_validation():
    with pytest.raises(ValueError, match="kv_buckets"):
        StaticDecodeConfig(max_seq_len=64, kv_buckets=(32, 128))
    assert StaticDecodeConfig(max_seq_len=100, kv_buckets=(32, 64)).buckets == (32, 64, 100)
    assert StaticDecodeConfig(max_batch=6).row_buckets == (1, 2, 4, 6)
