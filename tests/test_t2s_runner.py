"""The graph-captured T2S decoder gives the eager reference's tokens (CPU: preset off; GPU: captured),
and its step-wise face (`decode_iter`) gives `decode`'s tokens and result, a stop check at a time."""

from __future__ import annotations

import copy
import importlib.util
import os
import subprocess
import sys
from itertools import islice

import pytest
import torch

from voicehub.models.gpt_sovits.streaming import window_ends
from voicehub.models.gpt_sovits.t2s.checkpoint import load_t2s
from voicehub.models.gpt_sovits.t2s.decode import StopReason, T2SSamplingParams, decode
from voicehub.models.gpt_sovits.t2s.make_checkpoint import make_t2s_checkpoint, random_prompt
from voicehub.models.gpt_sovits.t2s.runner import T2SGraphDecoder, decode_iter
from voicehub.models.gpt_sovits.t2s.static import StaticDecodeConfig, T2SRequest
from voicehub.models.gpt_sovits.t2s.static_decoder import T2SStaticDecoder

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


# Run in a fresh process: @triton.jit (and Triton's own standard library) read TRITON_INTERPRET
# when triton is first imported, and making a checkpoint in this process may import it already.
TRITON_STEP_SCRIPT = """
import sys
from voicehub.models.gpt_sovits.t2s.checkpoint import load_t2s
from voicehub.models.gpt_sovits.t2s.decode import T2SSamplingParams, decode
from voicehub.models.gpt_sovits.t2s.make_checkpoint import random_prompt
from voicehub.models.gpt_sovits.t2s.runner import T2SGraphDecoder
from voicehub.models.gpt_sovits.t2s.static import StaticDecodeConfig, StepKernels, T2SRequest
from voicehub.runtime.kernels import registry

model, config = load_t2s(sys.argv[1], dtype="float32")
engine = StaticDecodeConfig(max_seq_len=96, kv_buckets=(32, 64), stop_check_interval=4)
decoder = T2SGraphDecoder(model, engine, preset="off")
ops = (registry.DECODE_ATTENTION, registry.ADD_LAYER_NORM)
kernels = StepKernels(*(registry.resolve(op, "triton", "cpu") for op in ops))
assert decoder.set_step_kernels(kernels).attention is None  # the previous choice: native
cases = [T2SSamplingParams.greedy(force_n_tokens=40), T2SSamplingParams.greedy(max_new_tokens=30)]
for i, params in enumerate(cases):
    req = T2SRequest(*random_prompt(config, 14 + i, 17, i), params)  # 31 + 40 slots: crosses 32 and 64
    eager = decode(model, req.phone_ids, req.bert, req.prompt_tokens, params)
    (got,) = decoder.decode([req])
    assert got.tokens.tolist() == eager.tokens.tolist(), (params, got.tokens, eager.tokens)
    assert len(set(eager.tokens.tolist())) > 1  # non-degenerate: the comparison can fail
print("ok", flush=True)
"""


def test_triton_step_kernels_keep_eager_greedy_tokens(ckpt):
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed: the Triton step kernels are untested here")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", TRITON_STEP_SCRIPT, str(ckpt)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_capture_warmups_leave_no_trace_mid_decode(ckpt):
    # A capture on first use (lazy/minimal presets) runs warm-up steps in the middle of a decode.
    model, config = load_t2s(ckpt, dtype="float32")
    decoder = T2SGraphDecoder(model, ENGINE, preset="off")
    req = T2SRequest(*random_prompt(config, 14, 17, 0), T2SSamplingParams(seed=4, top_k=5, force_n_tokens=30))
    decoder._reset()
    decoder._load_row(0, req)
    decoder.generator.manual_seed(4)
    before = [t.clone() for t in decoder._step_written()]
    rng = decoder.generator.get_state()
    with decoder.state_kept():
        for _ in range(2):
            decoder.step(1, 32, False)
        assert not all(torch.equal(a, b) for a, b in zip(before, decoder._step_written()))
    assert all(torch.equal(a, b) for a, b in zip(before, decoder._step_written()))
    assert torch.equal(decoder.generator.get_state(), rng)


# decode_iter: the prompt is 14..18 phonemes + 17 tokens, so 60 tokens cross the 32/64/96 KV buckets;
# the cap and EOS cases stop at a step that is not a multiple of the stop-check interval.
ITER_CASES = [
    (T2SSamplingParams.greedy(force_n_tokens=60), StopReason.FORCED),
    (T2SSamplingParams.greedy(repetition_penalty=1.35, max_new_tokens=45), StopReason.MAX_TOKENS),
    (T2SSamplingParams(seed=5, top_k=5, top_p=1.0, temperature=1.0, force_n_tokens=61), StopReason.FORCED),
    (T2SSamplingParams(seed=3, max_new_tokens=50), StopReason.MAX_TOKENS),
    (T2SSamplingParams(seed=9, top_k=5, top_p=0.9, temperature=0.8, max_new_tokens=100), StopReason.EOS),
    (T2SSamplingParams.greedy(max_new_tokens=100), StopReason.EOS),
]


def eos_likely(model):
    """A copy of `model` whose head adds a bias to EOS: sampling stops on EOS after a few dozen steps
    (tiny random weights never choose it), greedy on the first step where it may."""
    model = copy.deepcopy(model)
    head = torch.nn.Linear(
        *reversed(model.ar_predict_layer.weight.shape), device=model.ar_predict_layer.weight.device
    )
    with torch.no_grad():
        head.weight.copy_(model.ar_predict_layer.weight)
        head.bias.zero_()
        head.bias[model.config.eos] = 5.0
    model.ar_predict_layer = head.to(model.ar_predict_layer.weight.dtype)
    return model


def check_iter_against_decode(model, eos_model, config, make_decoder, cases=ITER_CASES, eager_rows="all"):
    """For each case: decode_iter's items equal decode()'s result, and the eager reference's tokens and
    stop (eager_rows 'greedy': a step draws noise for more rows than eager, greedy cases only; 'none':
    fp16, where eager's kernels may break near-ties the other way: decode() alone)."""
    for i, (params, reason) in enumerate(cases):
        net = eos_model if reason == StopReason.EOS else model
        decoder = make_decoder(net)
        req = T2SRequest(*random_prompt(config, 14 + i % 5, 17, i), params)
        items = list(
            decoder.decode_iter(req) if hasattr(decoder, "decode_iter") else decode_iter(decoder, req)
        )
        (whole,) = decoder.decode([req])
        result = items[-1].result
        assert result is not None and all(item.result is None for item in items[:-1])
        assert result.stop_reason == whole.stop_reason, params
        assert result.tokens.tolist() == whole.tokens.tolist(), params
        assert result.n_steps == whole.n_steps
        if eager_rows == "all" or (eager_rows == "greedy" and params.top_k == 1):
            eager = decode(net, req.phone_ids, req.bert, req.prompt_tokens, params)
            assert (result.tokens.tolist(), result.stop_reason) == (eager.tokens.tolist(), eager.stop_reason)
            assert result.stop_reason == reason, params
        streamed = torch.cat([item.tokens.cpu() for item in items]).tolist()
        kept = streamed[:1] if result.stop_reason == StopReason.MAX_TOKENS else []  # a cap keeps token 0
        assert streamed == kept + result.tokens.tolist(), params
        interval = decoder.engine.stop_check_interval
        assert all(len(item.tokens) == interval for item in items[:-1])  # one batch per stop check
        assert len(items) - 1 == (result.n_steps - 1) // interval  # ... up to the check that saw the stop
        assert len(set(streamed)) > 1  # non-degenerate: the comparison can fail


def test_decode_iter_gives_decode_results_static_eager(ckpt):
    model, config = load_t2s(ckpt, dtype="float32")
    check_iter_against_decode(model, eos_likely(model), config, lambda m: T2SStaticDecoder(m, ENGINE))


def test_decode_iter_gives_decode_results_graph_decoder_off(ckpt):
    model, config = load_t2s(ckpt, dtype="float32")
    check_iter_against_decode(model, eos_likely(model), config, lambda m: T2SGraphDecoder(m, ENGINE, "off"))


def test_decode_iter_with_a_wider_batch_bucket_and_interval(ckpt):
    # decode() of one request steps the smallest batch bucket's rows: 2 here, so 2 noise rows per draw.
    model, config = load_t2s(ckpt, dtype="float32")
    engine = StaticDecodeConfig(max_batch=2, max_seq_len=160, kv_buckets=(48, 96), batch_buckets=(2,),
                                stop_check_interval=5)  # fmt: skip
    check_iter_against_decode(
        model,
        eos_likely(model),
        config,
        lambda m: T2SStaticDecoder(m, engine),
        [*ITER_CASES[2:4], ITER_CASES[5]],
        eager_rows="greedy",
    )


class _StepCounter(T2SStaticDecoder):
    n_steps = 0

    def step(self, n_rows: int, n_slots: int, drop_eos: bool) -> None:
        self.n_steps += 1
        super().step(n_rows, n_slots, drop_eos)


def test_decode_iter_yields_before_the_decode_ends(ckpt):
    model, config = load_t2s(ckpt, dtype="float32")
    decoder = _StepCounter(model, ENGINE)
    req = T2SRequest(*random_prompt(config, 14, 17, 0), T2SSamplingParams(seed=2, force_n_tokens=60))
    items = decoder.decode_iter(req) if hasattr(decoder, "decode_iter") else decode_iter(decoder, req)
    first = next(items)
    assert len(first.tokens) == ENGINE.stop_check_interval and first.result is None
    assert decoder.n_steps == ENGINE.stop_check_interval - 1  # the prefill's sample gave the first token
    rest = list(items)
    assert decoder.n_steps == 59 and rest[-1].result is not None
    items.close()


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["full", "lazy"])
def test_decode_iter_on_graphs_fp16_gives_decode_results(ckpt, preset):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model, config = load_t2s(ckpt, device="cuda", dtype="float16")
    eos_model = eos_likely(model)
    decoders = {id(m): T2SGraphDecoder(m, ENGINE, preset=preset) for m in (model, eos_model)}
    check_iter_against_decode(model, eos_model, config, lambda m: decoders[id(m)], eager_rows="none")


@pytest.mark.parametrize("first", [5, 25])
def test_decode_iter_with_window_ends_yields_each_window_once_drawn(ckpt, first):
    # With window ends the items end there (not at the next stop check): the first carries exactly the
    # first window's tokens after first - 1 steps (the prefill's sample drew the first), the later ones the
    # growing windows of window_ends, and the stream and result are decode()'s, whatever the stop (EOS,
    # cap, forced) and wherever it falls.
    model, config = load_t2s(ckpt, dtype="float32")
    eos_model = eos_likely(model)
    for i, (params, _) in enumerate(ITER_CASES):
        if i in (2, 3):
            continue  # forced and capped stops are covered by cases 0 and 1
        decoder = _StepCounter(eos_model if params.max_new_tokens == 100 else model, ENGINE)
        req = T2SRequest(*random_prompt(config, 14 + i % 5, 17, i), params)
        items = decode_iter(decoder, req, ends=window_ends(first, largest=2 * first))
        head = next(items)
        n_steps_at_first = decoder.n_steps
        items = [head, *items]
        result = items[-1].result
        (whole,) = decoder.decode([req])
        assert result is not None and (result.tokens.tolist(), result.stop_reason) == (
            whole.tokens.tolist(),
            whole.stop_reason,
        )
        assert result.n_steps == whole.n_steps
        streamed = torch.cat([item.tokens.cpu() for item in items]).tolist()
        kept = streamed[:1] if result.stop_reason == StopReason.MAX_TOKENS else []
        assert streamed == kept + result.tokens.tolist(), params
        *ends, next_end = islice(window_ends(first, largest=2 * first), len(items))
        assert [len(item.tokens) for item in items[:-1]] == [b - a for a, b in zip([0, *ends], ends)]
        assert all(item.result is None for item in items[:-1])
        assert next_end >= len(streamed)  # no window held back to the end
        if len(streamed) > first:  # the first item is a whole window, out as soon as it was drawn
            assert len(head.tokens) == first and n_steps_at_first == first - 1
    with pytest.raises(ValueError, match="window"):
        next(decode_iter(decoder, req, ends=[0]))
    with pytest.raises(ValueError, match="window"):
        next(decode_iter(decoder, req, ends=[5, 5]))
