"""T2SRowEngine's host side (CPU, fp32, tiny weights): batched admission, snapshots read late, results
built on the host. Each fast path is held equal to the one-row-at-a-time path it replaces."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from voicehub.models.gpt_sovits.t2s.checkpoint import load_t2s
from voicehub.models.gpt_sovits.t2s.decode import StopReason, T2SSamplingParams
from voicehub.models.gpt_sovits.t2s.make_checkpoint import make_t2s_checkpoint, random_prompt
from voicehub.models.gpt_sovits.t2s.prefill import PaddedPrefill
from voicehub.models.gpt_sovits.t2s.scheduler import T2SRowEngine
from voicehub.models.gpt_sovits.t2s.static import NATIVE_KERNELS, StaticDecodeConfig, StepKernels, T2SRequest
from voicehub.runtime.kernels import registry
from voicehub.runtime.kv_cache import StaticKVCache
from voicehub.runtime.scheduler import ContinuousScheduler

ENGINE = StaticDecodeConfig(max_batch=6, max_seq_len=224, kv_buckets=(64, 128, 160), stop_check_interval=4)
PARAMS = [
    T2SSamplingParams.greedy(repetition_penalty=1.3, force_n_tokens=20, seed=5),
    T2SSamplingParams(seed=4, top_k=50, top_p=1.0, temperature=1.0, max_new_tokens=60),  # stops on EOS
    T2SSamplingParams(seed=7, top_k=15, top_p=0.8, temperature=0.8, max_new_tokens=25),  # stops on the cap
    T2SSamplingParams(seed=11, top_k=5, top_p=1.0, temperature=1.0, force_n_tokens=30),
    T2SSamplingParams(seed=3, max_new_tokens=18),
]
# prompt (phonemes, tokens) per request; padded-prefill buckets of 64 positions: 22, 38, 50 -> 64, 70 -> 128
SHAPES = [(10, 12), (10, 12), (20, 18), (30, 20), (40, 30)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = make_t2s_checkpoint(tmp_path_factory.mktemp("t2s") / "tiny.ckpt", "tiny", seed=0)
    return load_t2s(path, dtype="float32")


def _requests(config, n: int = len(PARAMS)) -> list[T2SRequest]:
    return [
        T2SRequest(*random_prompt(config, *SHAPES[i], seed=i if i != 1 else 4), PARAMS[i]) for i in range(n)
    ]


def _row_state(engine: T2SRowEngine, row: int) -> list[torch.Tensor]:
    """Everything admission writes for a row (the KV of its prompt slots included)."""
    st, buf, n = engine.state, engine.buf, int(engine.cache.lengths[row])
    state = [getattr(st, name)[row].clone() for name in ("tokens", "audio_pos", "step", "cap", "stop_step",
                                                         "forced", "done", "stop_eos")]  # fmt: skip
    sampling = [
        t[row].clone() for t in (buf.top_k, buf.top_p, buf.temperature, buf.repetition_penalty, buf.seen)
    ]
    kv = [engine.cache.k[:, row, :, :n].clone(), engine.cache.v[:, row, :, :n].clone()]
    seeds = [engine.seed_lo[row].clone(), engine.seed_hi[row].clone()]
    return [*state, st.out[row, :1].clone(), *sampling, *kv, *seeds, torch.tensor(n)]


def _noise_kernels(noise: str) -> StepKernels:
    if noise == "torch":
        return NATIVE_KERNELS
    if importlib.util.find_spec("triton") is None or torch.cuda.is_available():
        pytest.skip("the interpreted ROW_NOISE kernel runs on CPU-only machines with triton installed")
    return StepKernels(row_noise=registry.resolve(registry.ROW_NOISE, "triton", "cpu"))


@pytest.mark.parametrize("noise", ["torch", "triton"])
@pytest.mark.parametrize("padded", [False, True], ids=["eager_prefill", "padded_prefill"])
def test_batched_admission_writes_what_one_row_at_a_time_writes(tiny, padded, noise):
    """Five requests in two length buckets admitted in one call (padded: 2 prompts a prefill call, so
    buckets split into calls and one call is padded) leave every row bitwise as admitting it alone;
    with the ROW_NOISE op's torch definition and its Triton kernel (which reads the prefill's strided seeds)."""
    model, config = tiny
    reqs = _requests(config)
    rows = [4, 0, 2, 5, 1]  # not in request order, not contiguous
    kernels = _noise_kernels(noise)
    together = T2SRowEngine(model, ENGINE, "off", padded_prefill=padded, prefill_rows=2)
    together.set_step_kernels(kernels)
    together.admit_rows(rows, reqs)
    alone = T2SRowEngine(model, ENGINE, "off", padded_prefill=padded, prefill_rows=2)
    alone.set_step_kernels(kernels)
    for row, req in zip(rows, reqs):
        alone.admit(row, req)
        want, got = _row_state(alone, row), _row_state(together, row)
        assert all(torch.equal(a, b) for a, b in zip(want, got)), row
        alone.release(row)
    assert int(together.cache.lengths[3]) == 0 and bool(together.state.done[3])  # the free row untouched
    assert len({int(together.state.out[r, 0]) for r in rows}) > 1  # first draws differ: the check can fail


def test_padded_prefill_call_repeats_its_last_prompt(tiny):
    """load_padded of one prompt (padded with copies) writes the same K/V and logits as that prompt beside
    another at the same row count, close to the exact-count `load`, and no other cache row."""
    model, config = tiny
    cfg = model.config
    cache = StaticKVCache(cfg.n_layer, 4, cfg.n_head, 192, cfg.head_dim, device="cpu", dtype=torch.float32)
    three, one = (PaddedPrefill(model, cache, 128, "off", row_counts=(n,)) for n in (3, 1))
    a, b = random_prompt(config, 14, 17, 0), random_prompt(config, 20, 9, 1)
    alone = three.load_padded([2], [a]).clone()
    k_alone, v_alone = cache.k[:, 2, :, :31].clone(), cache.v[:, 2, :, :31].clone()
    assert cache.lengths.tolist() == [0, 0, 31, 0] and not cache.k[:, [0, 1, 3]].any()
    paired = three.load_padded([2, 0], [a, b]).clone()
    assert torch.equal(alone[0], paired[0]) and torch.equal(cache.k[:, 2, :, :31], k_alone)
    assert torch.equal(cache.v[:, 2, :, :31], v_alone) and cache.lengths.tolist() == [29, 0, 31, 0]
    assert not torch.equal(paired[0], paired[1])
    exact = one.load([2], [a])
    torch.testing.assert_close(exact[0], alone[0], rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="1..3"):
        three.load_padded([0, 1, 2, 3], [a] * 4)


def _drive(engine: T2SRowEngine, rows: list[int]) -> dict[int, tuple]:
    """Step and snapshot by hand until every row is done; each row's final update and device result."""
    done = {}
    while len(done) < len(rows):
        live = [r for r in rows if r not in done]
        for _ in range(3):
            engine.step(max(live) + 1)
        for row, update in engine.collect(engine.snapshot(live)).items():
            if update.is_done:
                done[row] = (update.result, engine.result(row))  # host-built, and read from the device
    return done


def test_results_built_on_the_host_equal_the_device_read(tiny):
    model, config = tiny
    engine = T2SRowEngine(model, ENGINE, "off")
    rows = list(range(len(PARAMS)))
    engine.admit_rows(rows, _requests(config))
    results = _drive(engine, rows)
    reasons = set()
    for row, (host, device) in results.items():
        assert host.tokens.tolist() == device.tokens.tolist(), row
        assert (host.stop_reason, host.n_steps) == (device.stop_reason, device.n_steps), row
        reasons.add(host.stop_reason)
    assert reasons == {StopReason.EOS, StopReason.MAX_TOKENS, StopReason.FORCED}


def test_a_snapshot_of_a_released_row_says_nothing_of_its_next_request(tiny):
    model, config = tiny
    reqs = _requests(config)
    engine = T2SRowEngine(model, ENGINE, "off")
    engine.admit_rows([0, 1], reqs[:2])
    engine.step(2)
    stale = engine.snapshot([0, 1])
    engine.release(0)
    engine.admit(0, reqs[3])
    assert set(engine.collect(stale)) == {1}
    fresh = engine.collect(engine.snapshot([0]))[0]
    assert len(fresh.tokens) == 1 and not fresh.is_done  # row 0's new request: its first token only


def _streams(engine, reqs, poll_lag):
    """Three streams start together, two more join after two rounds; results and streamed tokens."""
    sched = ContinuousScheduler(engine, poll_lag=poll_lag)
    handles = [sched.submit(r) for r in reqs[:3]]
    for _ in range(2):
        sched.pump()
    handles += [sched.submit(r) for r in reqs[3:]]
    sched.run_until_idle()
    results = [h.result() for h in handles]
    streamed = [[t for c in h.tokens(timeout=0) for t in c] for h in handles]
    return [(r.tokens.tolist(), r.stop_reason, r.n_steps) for r in results], streamed


def test_reading_snapshots_a_round_late_changes_no_token(tiny):
    model, config = tiny
    reqs = _requests(config)
    engine = T2SRowEngine(model, ENGINE, "off", padded_prefill=True, prefill_rows=2)
    now, late = _streams(engine, reqs, 0), _streams(engine, reqs, 1)
    assert now == late
    alone = [_streams(engine, [r], 0)[0][0] for r in reqs]
    assert now[0] == alone  # each stream as it runs alone
    for (tokens, reason, _), streamed in zip(*now):
        assert streamed == (tokens if reason != StopReason.MAX_TOKENS else streamed[:1] + tokens)


def test_round_graphs_step_whole_rounds_at_one_bucket_and_change_no_token(tiny):
    # round_graphs (here eager: preset off runs a round's function as its graph would): a round whose steps
    # all fall in one KV bucket goes as one unit, a round crossing into the next bucket step by step, a short
    # round (fewer steps than the interval) step by step; the tokens are those of the single-step engine
    model, config = tiny
    reqs = _requests(config)
    plain = T2SRowEngine(model, ENGINE, "off", padded_prefill=True, prefill_rows=2)
    rounds = T2SRowEngine(model, ENGINE, "off", padded_prefill=True, prefill_rows=2, round_graphs=True)
    seen = []  # (unit, key) of every run, rounds and single steps

    def logged(unit, run):
        def run_logged(key):
            seen.append((unit, key))
            return run(key)

        return run_logged

    rounds.rounds.run = logged("round", rounds.rounds.run)
    rounds.graphs.run = logged("step", rounds.graphs.run)
    assert _streams(rounds, reqs, 1) == _streams(plain, reqs, 1)
    units = {unit for unit, _ in seen}
    assert units == {"round", "step"}, units
    buckets = sorted({key[1] for unit, key in seen if unit == "round"})
    assert len(buckets) >= 2, buckets  # whole rounds at more than one bucket (64, 128, 160)


@pytest.mark.gpu
def test_rounds_wait_for_the_device_only_at_snapshot_events(tmp_path):
    """CUDA, graphs (single steps, and with round graphs whole rounds): admission, steps, snapshots and
    releases never block on the device's queue (any synchronizing op raises under sync debug mode 'error');
    tokens equal the eager engine's."""
    path = make_t2s_checkpoint(tmp_path / "tiny.ckpt", "tiny", seed=0)
    model, config = load_t2s(path, dtype="float32", device="cuda")
    reqs = _requests(config)
    runs = []
    for preset, round_graphs in (("off", False), ("full", False), ("full", True)):
        engine = T2SRowEngine(
            model, ENGINE, preset, padded_prefill=True, prefill_rows=2, round_graphs=round_graphs
        )
        _streams(engine, reqs, 1)  # warm-up: allocator, pinned blocks
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error" if preset == "full" else 0)
        try:
            runs.append(_streams(engine, reqs, 1))
        finally:
            torch.cuda.set_sync_debug_mode(0)
    assert runs[0] == runs[1] == runs[2]
    assert engine.rounds.n_captured == len(engine.graphs.captured_buckets)


@pytest.mark.gpu
def test_prompts_staged_on_the_host_equal_prompts_on_the_device(tmp_path):
    """CUDA: requests whose tensors are on the host (one pinned copy per buffer) admit rows bitwise equal to
    the same requests on the device (row-by-row copies)."""
    path = make_t2s_checkpoint(tmp_path / "tiny.ckpt", "tiny", seed=0)
    model, config = load_t2s(path, dtype="float32", device="cuda")
    rows, host = [4, 0, 2, 5, 1], _requests(config)
    device = [T2SRequest(r.phone_ids.cuda(), r.bert.cuda(), r.prompt_tokens.cuda(), r.params) for r in host]
    engines = []
    for reqs in (host, device):
        engine = T2SRowEngine(model, ENGINE, "full", prefill_rows=2)
        engine.admit_rows(rows, reqs)
        engines.append(engine)
    for row in rows:
        assert all(
            torch.equal(a, b) for a, b in zip(_row_state(engines[0], row), _row_state(engines[1], row))
        ), row
