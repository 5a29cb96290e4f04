"""The fused sampling step (`sample_step_triton`) against its definition and the native decode step.

CPU tests run the kernel in Triton's interpreter. Each case fills every row kind the step knows
(greedy, sampled with top-k / top-p / repetition penalty, EOS blocked or dropped, forced, at the
cap, already done, EOS winning) and asserts the kernel leaves tokens and every state tensor exactly
as the torch definition does. The definition itself is held to the native `static.sample_step`.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import sys

import pytest
import torch

from voicehub.models.gpt_sovits.t2s.checkpoint import load_t2s
from voicehub.models.gpt_sovits.t2s.config import EOS_BLOCKED_STEPS, MAX_DECODE_STEPS
from voicehub.models.gpt_sovits.t2s.decode import T2SSamplingParams, decode
from voicehub.models.gpt_sovits.t2s.make_checkpoint import make_t2s_checkpoint, random_prompt
from voicehub.models.gpt_sovits.t2s.static import (
    DecodeState,
    StaticDecodeConfig,
    StepKernels,
    T2SRequest,
    sample_step,
)
from voicehub.models.gpt_sovits.t2s.static_decoder import T2SStaticDecoder
from voicehub.runtime.kernels import registry
from voicehub.runtime.kernels.registry import T2S_LAYER_STACK, T2S_SAMPLE_STEP
from voicehub.runtime.kernels.sample_step import sample_step_reference
from voicehub.runtime.sampling import SamplingBuffers

MODULE = "voicehub.runtime.kernels.sample_step_triton"
STATE = ("tokens", "audio_pos", "step", "cap", "stop_step", "forced", "done", "stop_eos", "out")
LIMITS = {"n_blocked": EOS_BLOCKED_STEPS, "max_steps": MAX_DECODE_STEPS}
# per row: top_k, top_p, temperature, penalty, step, cap, forced, done, EOS logit boost
ROWS = [
    (1, 1.0, 1.0, 1.0, 0, 100, False, False, 0.0),  # greedy, EOS blocked (step 0)
    (5, 0.6, 0.6, 1.35, 12, 100, False, False, 0.0),  # upstream's defaults, top-k and top-p
    (20, 0.9, 0.8, 1.2, 5, 100, True, False, 9.0),  # forced: EOS never counts
    (0, 0.8, 1.2, 1.5, 15, 5, False, True, 0.0),  # done: only tokens and seen move (top_k = V)
    (3, 0.95, 0.7, 1.1, 20, 20, False, False, 0.0),  # reaches the cap
    (8, 1.0, 1.0, 1.3, 30, 100, False, False, 9.0),  # EOS wins
    (1, 1.0, 1.0, 1.0, MAX_DECODE_STEPS - 1, 2000, False, False, 0.0),  # the last step of the loop
]


@pytest.fixture(scope="module")
def kernel():
    """The Triton implementation, interpreted on the CPU."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed (pip install triton): the fused sampler is untested here")
    module = sys.modules.get(MODULE)
    if module is not None and type(module._sample_step_kernel).__name__ != "InterpretedFunction":
        pytest.skip(f"{MODULE} was imported for a GPU before these tests; run them in their own process")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        reason = registry.available(T2S_SAMPLE_STEP, "triton", "cpu")
        if reason is not None:
            pytest.skip(f"Triton interpreter unusable here: {reason}")
        yield importlib.import_module(MODULE).sample_step_triton


def step_inputs(vocab, dtype, seed=0, device="cpu", rows=ROWS):
    """(logits [B, V], buffers, state, lengths) with ROWS' parameters; a tenth of tokens seen."""
    g = torch.Generator().manual_seed(seed)
    n = len(rows)
    buf = SamplingBuffers.allocate(n, vocab, device)
    state = DecodeState.allocate(n, 64, device)
    cols = list(zip(*rows))
    buf.top_k.copy_(torch.tensor([k or vocab for k in cols[0]]))
    buf.top_p.copy_(torch.tensor(cols[1]))
    buf.temperature.copy_(torch.tensor(cols[2]))
    buf.repetition_penalty.copy_(torch.tensor(cols[3]))
    buf.seen.copy_(torch.rand(n, vocab, generator=g) < 0.1)
    state.step.copy_(torch.tensor(cols[4]))
    state.cap.copy_(torch.tensor(cols[5]))
    state.forced.copy_(torch.tensor(cols[6]))
    state.done.copy_(torch.tensor(cols[7]))
    state.audio_pos.copy_(torch.arange(n) + 40)
    state.out.copy_(torch.randint(0, vocab, state.out.shape, generator=g))
    logits = 2.5 * torch.randn(n, vocab, generator=g)
    logits[:, -1] += torch.tensor(cols[8])  # EOS is the last id
    lengths = torch.arange(n, device=device) + 100
    return logits.to(device=device, dtype=dtype), buf, state, lengths


def noise(shape, dtype, seed=1):
    return torch.empty(shape).exponential_(1, generator=torch.Generator().manual_seed(seed)).to(dtype)


def assert_same(a, b):
    (ta, bufa, sta, la), (tb, bufb, stb, lb) = a, b
    assert torch.equal(ta, tb)
    for name in STATE:
        assert torch.equal(getattr(sta, name), getattr(stb, name)), name
    assert torch.equal(bufa.seen, bufb.seen)
    assert (la is None and lb is None) or torch.equal(la, lb)


def run(fn, logits, q, buf, state, lengths, eos):
    buf, state = copy.deepcopy(buf), copy.deepcopy(state)
    lengths = None if lengths is None else lengths.clone()
    tokens = fn(logits, q, buf, state, lengths, eos=eos, **LIMITS).clone()
    return tokens, buf, state, lengths


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("drop_eos", [False, True])
@pytest.mark.parametrize("advance", [False, True])
def test_kernel_matches_the_definition(kernel, dtype, drop_eos, advance):
    vocab = 40
    eos = vocab - 1
    logits, buf, state, lengths = step_inputs(vocab, dtype, seed=int(drop_eos) + 2 * int(advance))
    logits = logits[:, :eos] if drop_eos else logits
    q = noise(logits.shape, dtype)
    lengths = lengths if advance else None
    want = run(sample_step_reference, logits, q, buf, state, lengths, eos)
    assert_same(run(kernel, logits, q, buf, state, lengths, eos), want)
    assert len(set(want[0].tolist())) > 3  # rows chose differently: the comparison can fail
    if not drop_eos:
        assert want[2].stop_eos.tolist() == [False] * 5 + [True, False]  # EOS counted where not blocked
    assert want[2].done.tolist() == [False, False, False, True, True, not drop_eos, True]


def test_float32_noise_races_in_float32(kernel):
    # row_rng's per-row noise is float32 and wider than the logits; fp16 logits race against it in float32
    logits, buf, state, lengths = step_inputs(40, torch.float16, seed=5)
    q = noise((len(ROWS), 48), torch.float32, seed=6)
    want = run(sample_step_reference, logits, q, buf, state, lengths, 39)
    assert_same(run(kernel, logits, q, buf, state, lengths, 39), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_top_k_cuts_through_ties(kernel, dtype):
    # logits on a coarse grid: many tokens tie at each top-k cut, which keeps every tied token as torch does
    rows = [
        (k, 1.0, t, 1.0, 12, 100, False, False, 0.0) for k, t in ((2, 1.0), (3, 0.7), (6, 1.3), (11, 1.0))
    ]
    logits, buf, state, lengths = step_inputs(40, torch.float32, seed=8, rows=rows)
    logits = logits.round().to(dtype)
    q = noise(logits.shape, dtype, seed=9)
    want = run(sample_step_reference, logits, q, buf, state, lengths, 39)
    assert_same(run(kernel, logits, q, buf, state, lengths, 39), want)
    kth = logits.float().topk(12, dim=1).values[torch.arange(4), torch.tensor([1, 2, 5, 10])]
    assert ((logits.float() == kth[:, None]).sum(1) > 1).all()  # the cuts fall on ties: the test can fail


def test_full_vocabulary_row(kernel):
    # V = 1025 (the v3 vocabulary, a 2048-wide block): nucleus and top-k cut inside a long tail
    rows = [
        (20, 0.6, 0.6, 1.35, 12, 100, False, False, 0.0),
        (1025, 0.8, 1.0, 1.35, 12, 100, False, False, 0.0),
    ]
    logits, buf, state, lengths = step_inputs(1025, torch.float32, seed=7, rows=rows)
    q = noise(logits.shape, torch.float32)
    want = run(sample_step_reference, logits, q, buf, state, lengths, 1024)
    assert_same(run(kernel, logits, q, buf, state, lengths, 1024), want)


@pytest.mark.parametrize("drop_eos", [False, True])
def test_definition_equals_the_native_sample_step(drop_eos):
    # the reference is static.sample_step given the same draw: q from a generator seeded alike
    model = torch.nn.Module()
    model.config = type("Config", (), {"eos": 39})()
    logits, buf, state, _ = step_inputs(40, torch.float32, seed=3)
    native_buf, native_state = copy.deepcopy(buf), copy.deepcopy(state)
    native = sample_step(model, native_state, logits, native_buf, torch.Generator().manual_seed(4), drop_eos)
    width = 39 if drop_eos else 40
    q = torch.empty(len(ROWS), width).exponential_(1, generator=torch.Generator().manual_seed(4))
    got = run(sample_step_reference, logits[:, :width], q, buf, state, None, 39)
    assert_same(got, (native, native_buf, native_state, None))


# -- through the T2S decoder ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = make_t2s_checkpoint(tmp_path_factory.mktemp("t2s") / "tiny.ckpt", "tiny", seed=0)
    return load_t2s(path, dtype="float32")


PARAMS = {
    "greedy": T2SSamplingParams.greedy(force_n_tokens=14),
    "seeded": T2SSamplingParams(seed=3, top_k=5, top_p=0.9, temperature=0.8, force_n_tokens=14),
    "eos": T2SSamplingParams(seed=1, top_k=20, top_p=0.95, max_new_tokens=14),  # EOS and the cap in play
}


@pytest.mark.parametrize("layers", ["native", "fused"])
@pytest.mark.parametrize("name", list(PARAMS))
def test_decoder_with_the_fused_sampler_equals_eager(kernel, tiny, name, layers):
    model, config = tiny
    engine = StaticDecodeConfig(max_batch=1, max_seq_len=64, kv_buckets=(32, 48), stop_check_interval=4)
    decoder = T2SStaticDecoder(model, engine)
    stack = registry.resolve(T2S_LAYER_STACK, "triton", "cpu") if layers == "fused" else None
    decoder.set_step_kernels(StepKernels(layer_stack=stack, sampler=kernel))
    req = T2SRequest(*random_prompt(config, 14, 17, 0), PARAMS[name])
    got = decoder.decode([req])[0]
    eager = decode(model, req.phone_ids, req.bert, req.prompt_tokens, req.params)
    assert got.tokens.tolist() == eager.tokens.tolist() and got.stop_reason == eager.stop_reason
    assert len(set(eager.tokens.tolist())) > 1  # non-degenerate: the comparison can fail


def test_row_engine_with_per_row_noise_equals_native(kernel, tiny):
    # T2SRowEngine passes row_rng's float32 noise: the fused sampler races against it as `draw` does
    from voicehub.models.gpt_sovits.t2s.scheduler import T2SRowEngine
    from voicehub.runtime.scheduler import ContinuousScheduler

    model, config = tiny
    engine = StaticDecodeConfig(max_batch=2, max_seq_len=64, kv_buckets=(32, 48), stop_check_interval=4)
    params = [PARAMS["seeded"], T2SSamplingParams(seed=2, top_k=8, top_p=0.8, max_new_tokens=12)]
    reqs = [T2SRequest(*random_prompt(config, 9 + 4 * i, 12 + 3 * i, i), p) for i, p in enumerate(params)]
    results = {}
    for name, kernels in (("native", None), ("fused", StepKernels(sampler=kernel))):
        rows = T2SRowEngine(model, engine, preset="off")
        if kernels is not None:
            rows.set_step_kernels(kernels)
        sched = ContinuousScheduler(rows)
        handles = [sched.submit(r) for r in reqs]
        sched.run_until_idle()
        results[name] = [h.result().tokens.tolist() for h in handles]
    assert results["fused"] == results["native"]
    assert all(len(set(t)) > 1 for t in results["native"])


# -- CUDA -----------------------------------------------------------------------------------------


def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return registry.resolve(T2S_SAMPLE_STEP, "triton", "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("drop_eos", [False, True])
def test_cuda_kernel_matches_the_definition(dtype, drop_eos):
    # v3's vocabulary, 64 rows of ROWS' kinds. fp16 may differ from torch's CUDA kernels only at
    # near-ties (another summation order); the rows where tokens differ must be few and the
    # state of every row must follow its own token
    kernel = _cuda()
    rows = ROWS * 9 + ROWS[:1]
    logits, buf, state, lengths = step_inputs(1025, dtype, seed=11, device="cuda", rows=rows)
    logits = logits[:, :1024] if drop_eos else logits
    q = noise(logits.shape, dtype).cuda()
    want = run(sample_step_reference, logits, q, buf, state, lengths, 1024)
    got = run(kernel, logits, q, buf, state, lengths, 1024)
    differ = (got[0] != want[0]).nonzero().flatten().tolist()
    if dtype == torch.float32:
        assert not differ
    assert len(differ) <= 1, differ
    same = [r for r in range(len(rows)) if r not in differ]
    for name in STATE:
        assert torch.equal(getattr(got[2], name)[same], getattr(want[2], name)[same]), name
    assert torch.equal(got[1].seen[same], want[1].seen[same]) and torch.equal(got[3][same], want[3][same])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cuda_graph_decoder_fused_step_tokens(dtype, tmp_path):
    from voicehub.models.gpt_sovits.t2s.runner import T2SGraphDecoder

    kernel = _cuda()
    model, config = load_t2s(make_t2s_checkpoint(tmp_path / "t2s.ckpt", "tiny", seed=0), "cuda", dtype)
    engine = StaticDecodeConfig(max_batch=1, max_seq_len=512, kv_buckets=(256,))
    decoder = T2SGraphDecoder(model, engine, preset="full")
    stack = registry.resolve(T2S_LAYER_STACK, "triton", "cuda")
    decoder.set_step_kernels(StepKernels(layer_stack=stack, sampler=kernel))
    for params in (T2SSamplingParams.greedy(force_n_tokens=200), PARAMS["seeded"], PARAMS["eos"]):
        req = T2SRequest(*random_prompt(config, 30, 60, 0), params)
        got = decoder.decode([req])[0].tokens.tolist()
        eager = decode(model, req.phone_ids, req.bert, req.prompt_tokens, req.params)
        want = eager.tokens.tolist()
        first = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), None)
        if dtype == "float32" or first is None:
            assert got == want
        else:  # fp16: a divergence only at a near-tie of eager's own decision (decode.py's margins)
            step = first + (1 if eager.stop_reason == "max_tokens" else 0)
            assert float(eager.decision_margins[step]) <= 0.1, (first, float(eager.decision_margins[step]))
