"""Eager reference decode: equal to upstream's own tokens, seeded, non-degenerate, forced length."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from voicehub.models.gpt_sovits.t2s.checkpoint import load_t2s
from voicehub.models.gpt_sovits.t2s.config import FULL_V3
from voicehub.models.gpt_sovits.t2s.decode import (
    StopReason,
    T2SSamplingParams,
    boundary_margin,
    decision_margin,
    decode,
    race_margin,
)
from voicehub.models.gpt_sovits.t2s.make_checkpoint import (
    logit_margins,
    make_t2s_checkpoint,
    random_prompt,
    random_state_dict,
)
from voicehub.models.gpt_sovits.t2s.model import T2SModel

REFERENCE = json.loads(
    (Path(__file__).parent / "data" / "upstream_keys" / "t2s_tiny_decode.json").read_text()
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    spec = REFERENCE["checkpoint"]
    path = make_t2s_checkpoint(tmp_path_factory.mktemp("t2s") / "tiny.ckpt", spec["size"], spec["seed"])
    model, config = load_t2s(path, dtype="float32")
    return path, model, config


def case_inputs(case: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, T2SSamplingParams]:
    n = len(case["phone_ids"])
    bert = np.random.default_rng(case["bert_seed"]).standard_normal((1024, n), dtype=np.float32)
    p = case["params"]
    params = T2SSamplingParams(
        top_k=p["top_k"], top_p=p["top_p"], temperature=p["temperature"],
        repetition_penalty=p["repetition_penalty"], max_new_tokens=p["early_stop_num"], seed=case["seed"],
    )  # fmt: skip
    return (
        torch.tensor(case["phone_ids"]),
        torch.from_numpy(bert),
        torch.tensor(case["prompt_tokens"]),
        params,
    )


def test_reference_was_made_from_these_weights(tiny):
    """If make_t2s_checkpoint changes, the upstream tokens must be regenerated (command in the JSON)."""
    weight = torch.load(tiny[0], weights_only=True)["weight"]
    h = hashlib.sha256()
    for k in sorted(weight):
        h.update(k.encode())
        h.update(weight[k].numpy().tobytes())
    assert h.hexdigest() == REFERENCE["checkpoint"]["weights_sha256"], REFERENCE["command"]


@pytest.mark.parametrize(
    "case", REFERENCE["cases"], ids=lambda c: f"{c['stopped_by']}-k{c['params']['top_k']}"
)
def test_eager_decode_equals_upstream_tokens(tiny, case):
    _, model, _ = tiny
    phones, bert, prompt, params = case_inputs(case)
    result = decode(model, phones, bert, prompt, params)
    assert result.tokens.tolist() == case["tokens"]
    assert result.stop_reason == (StopReason.EOS if case["stopped_by"] == "eos" else StopReason.MAX_TOKENS)
    assert result.n_steps == case["idx"] + 1


def test_cap_keeps_upstreams_last_tokens(tiny):
    """Upstream draws early_stop_num + 1 tokens and keeps the last early_stop_num (y[:, -idx:])."""
    _, model, config = tiny
    phones, bert, prompt = random_prompt(config, 15, 12, seed=3)
    capped = decode(model, phones, bert, prompt, T2SSamplingParams.greedy(max_new_tokens=30))
    forced = decode(model, phones, bert, prompt, T2SSamplingParams.greedy(force_n_tokens=31))
    assert capped.stop_reason == StopReason.MAX_TOKENS and capped.n_steps == 31
    assert torch.equal(capped.tokens, forced.tokens[1:])


def test_same_seed_same_tokens_other_seed_other_tokens(tiny):
    _, model, config = tiny
    phones, bert, prompt = random_prompt(config, 20, 25, seed=1)
    run = lambda seed: decode(model, phones, bert, prompt, T2SSamplingParams(seed=seed, force_n_tokens=40))  # noqa: E731
    assert torch.equal(run(4).tokens, run(4).tokens)
    assert not torch.equal(run(4).tokens, run(5).tokens)


def test_force_n_tokens_suppresses_eos(tiny):
    """The upstream case that ends on EOS runs on to exactly N tokens when forced, never emitting EOS."""
    _, model, config = tiny
    case = next(c for c in REFERENCE["cases"] if c["stopped_by"] == "eos")
    phones, bert, prompt, params = case_inputs(case)
    n = len(case["tokens"]) + 20
    forced = T2SSamplingParams(**{**params.__dict__, "force_n_tokens": n, "max_new_tokens": None})
    result = decode(model, phones, bert, prompt, forced)
    assert result.stop_reason == StopReason.FORCED
    assert result.tokens.numel() == n
    assert int(result.tokens.max()) < config.eos
    # both runs drop EOS from the first 11 draws, so those draws (and tokens) are the same
    assert result.tokens[:11].tolist() == case["tokens"][:11]


def test_race_margin_by_hand():
    probs = torch.tensor([[0.5, 0.3, 0.2, 0.0]])
    q = torch.tensor([[1.0, 0.5, 2.0, 1.0]])  # race values 0.5, 0.6, 0.1, 0: token 1 wins over token 0
    token = torch.argmax(probs / q, dim=-1)
    assert token.tolist() == [1]
    assert race_margin(probs, q, token).item() == pytest.approx(math.log(0.6) - math.log(0.5), abs=1e-6)


def test_race_margin_is_the_room_before_the_decision_flips():
    """Raising the best rival's log-probability by just under the margin keeps the token; just over flips it."""
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(64, 50, generator=gen) * 3, dim=-1)
    q = torch.empty_like(probs).exponential_(1, generator=gen)
    token = torch.argmax(probs / q, dim=-1)
    margin = race_margin(probs, q, token)
    rival = (probs / q).scatter(1, token[:, None], 0.0).argmax(dim=-1)
    assert bool((margin > 0).all())
    for factor, same in ((0.99, True), (1.01, False)):
        moved = probs.scatter(
            1, rival[:, None], probs.gather(1, rival[:, None]) * (factor * margin[:, None]).exp()
        )
        assert bool((torch.argmax(moved / q, dim=-1) == token).all()) == same


def test_decision_margins_greedy_are_logit_margins(tiny):
    _, model, config = tiny
    phones, bert, prompt = random_prompt(config, 15, 12, seed=4)
    result = decode(model, phones, bert, prompt, T2SSamplingParams.greedy(force_n_tokens=30))
    assert result.decision_margins.shape == result.margins.shape == result.is_race.shape == (30,)
    assert not bool(result.is_race.any())
    assert torch.equal(result.decision_margins, result.margins)


def test_decision_margins_sampled_are_race_margins(tiny):
    """Sampled steps report the race margin (not the logit one); fp32 eager never contradicts its own race."""
    _, model, config = tiny
    phones, bert, prompt = random_prompt(config, 15, 12, seed=4)
    result = decode(
        model, phones, bert, prompt, T2SSamplingParams(seed=3, top_k=5, top_p=1.0, force_n_tokens=60)
    )
    assert bool(result.is_race.all())  # top_k 5 without nucleus: always five candidates
    assert bool((result.decision_margins >= -1e-5).all()), result.decision_margins
    assert not torch.allclose(result.decision_margins, result.margins)


def test_single_candidate_steps_use_the_logit_margin_over_temperature(tiny):
    """A nucleus so small that only the top token survives: the decision flips only if the top two
    logits swap (or the cut moves, far away here), so the margin is the logit margin / temperature."""
    _, model, config = tiny
    phones, bert, prompt = random_prompt(config, 15, 12, seed=4)
    params = T2SSamplingParams(seed=3, top_p=1e-3, temperature=0.5, force_n_tokens=30)
    result = decode(model, phones, bert, prompt, params)
    assert bool(result.is_race.all())
    assert torch.allclose(result.decision_margins, result.margins / 0.5)


def test_boundary_margin_by_hand():
    """The top-k cut: gap between the k-th and (k+1)-th temperature-scaled logits; the top-p cut: the
    log-ratio of the nearest cumulative probability to top_p."""
    logits = torch.tensor([[4.0, 3.0, 2.5, 0.0]])
    topk = boundary_margin(logits, T2SSamplingParams(top_k=2, top_p=1.0, temperature=0.5))
    assert topk.item() == pytest.approx((3.0 - 2.5) / 0.5)
    cum = torch.softmax(logits, dim=-1).cumsum(dim=-1)[0]  # ~0.63, 0.86, 0.99, 1.0
    nucleus = boundary_margin(logits, T2SSamplingParams(top_k=4, top_p=0.9, temperature=1.0))
    # the first removed index is 2 (cum 0.99 > 0.9); the kept side ends at cum[1] = 0.86
    expected = min(math.log(cum[2].item() / 0.9), math.log(0.9 / cum[1].item()))
    assert nucleus.item() == pytest.approx(expected, rel=1e-5)
    assert boundary_margin(logits, T2SSamplingParams(top_k=4, top_p=1.0)).item() == math.inf


def test_sampled_margin_sees_a_token_about_to_enter_the_top_k(tiny):
    """A step whose k-th and (k+1)-th logits nearly tie is a near-tie even when the race was clear."""
    logits = torch.tensor([[5.0, 1.0, 0.995, -3.0]])
    params = T2SSamplingParams(top_k=2, top_p=1.0, temperature=1.0)
    probs = torch.softmax(torch.where(logits < 0.999, float("-inf"), logits), dim=-1)
    q = torch.ones_like(probs)
    token = torch.argmax(probs / q, dim=-1)
    margin, is_race = decision_margin(probs, q, token, logits, params)
    assert race_margin(probs, q, token).item() > 3  # the race alone looks safe
    assert margin.item() == pytest.approx(0.005, abs=1e-4) and bool(is_race.all())


def test_tiny_checkpoint_is_not_degenerate(tiny):
    _, model, config = tiny
    for seed in range(3):
        phones, bert, prompt = random_prompt(config, 25, 30, seed)
        plain = logit_margins(model, phones, bert, prompt, 120)
        penalized = logit_margins(model, phones, bert, prompt, 120, repetition_penalty=1.35)
        assert plain["distinct_tokens"] >= 20, plain  # greedy, no penalty: the model itself varies
        assert penalized["distinct_tokens"] >= 90, penalized
        assert plain["median"] > 0.3 and plain["share_below_0.01"] < 0.05, plain


def test_empty_prompt_decodes(tiny):
    _, model, config = tiny
    phones, bert, _ = random_prompt(config, 10, 0, seed=2)
    result = decode(
        model, phones, bert, torch.zeros(0, dtype=torch.long), T2SSamplingParams.greedy(force_n_tokens=5)
    )
    assert result.tokens.numel() == 5


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"top_k": 0}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"temperature": -1.0}, "temperature"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"force_n_tokens": 0}, "force_n_tokens"),
    ],
)
def test_invalid_params_raise(kwargs, word):
    with pytest.raises(ValueError, match=word):
        T2SSamplingParams(**kwargs)


def test_full_size_random_weights_are_not_degenerate():
    """24 layers at full width must not collapse (GPU benchmarks decode these weights)."""
    model = T2SModel(FULL_V3)
    weights = random_state_dict(FULL_V3, seed=0)
    model.load_state_dict({k.removeprefix("model."): v.float() for k, v in weights.items()})
    phones, bert, prompt = random_prompt(FULL_V3, 20, 20, seed=0)
    report = logit_margins(model.eval(), phones, bert, prompt, 24)  # collapsed weights give 1-2 distinct
    assert report["distinct_tokens"] >= 10, report
    assert report["median"] > 0.3, report
