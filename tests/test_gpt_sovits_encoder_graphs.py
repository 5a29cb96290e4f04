"""The streaming path's SoVITS encoder graphs (encoder_graphs.py) on the tiny `make-checkpoint` set.

CPU, fp32, with the stand-in runner of acoustic_graphs_fakes (a "replay" runs the step again
into the captured outputs): a prefix padded to its (tokens, phonemes) bucket equals `decode_encp` of the
unpadded prefix, garbage in the padding changes nothing (and widened masks would), the tensor-op speed
resampling equals `F.interpolate`, and the cache's keys (what shares a graph, what runs eagerly, what
drops the graphs); the stream engine's batched graphs (`EncoderRowGraphs`): each real row equals its
`decode_encp` alone, whatever the padded rows hold, and `encode_rows` counts what replayed and what ran
eagerly, by reason. GPU tests (`-m gpu`) hold real graph replays to eager on the same padded buffers.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from acoustic_graphs_fakes import captured  # noqa: F401 (fixture: the stand-in runner)

from voicehub.models.gpt_sovits import load
from voicehub.models.gpt_sovits.acoustic_graphs import LOAD_SPEEDS, AcousticGraphs
from voicehub.models.gpt_sovits.batch_acoustic import EncoderRow, encode_rows
from voicehub.models.gpt_sovits.encoder_graphs import MAX_TOKENS, EncoderGraphs, EncoderRowGraphs, encoder_key
from voicehub.models.gpt_sovits.sovits import load_sovits_v3
from voicehub.models.gpt_sovits.sovits.model import encp_lengths, resample_rows

ATOL = 2e-6  # fp32 features of size O(1), as the batched encoder's rows (seen: <= 2e-7)
CUDA = torch.device("cuda")  # what the graphs are told; the stand-in never touches it


@pytest.fixture(scope="module")
def sovits(tiny_set):
    return load_sovits_v3(tiny_set / "sovits.pth").eval()


def _inputs(sovits, n_tokens: int, n_phones: int, seed: int):
    g, a = torch.Generator().manual_seed(seed), sovits.arch
    codes = torch.randint(0, a.n_bins, (1, 1, n_tokens), generator=g)
    text = torch.randint(1, a.n_symbols, (1, n_phones), generator=g)
    return codes, text, torch.randn(1, a.gin_channels, 1, generator=g)


@pytest.mark.parametrize(
    "n_tokens, n_phones, speed", [(25, 20, 1.3), (25, 32, 1.0), (37, 45, 1.1), (50, 7, 0.8), (13, 64, 1.3)]
)
def test_padded_graph_equals_decode_encp(sovits, captured, n_tokens, n_phones, speed):  # noqa: F811
    graphs = EncoderGraphs(sovits, CUDA)
    codes, text, ge = _inputs(sovits, n_tokens, n_phones, seed=n_tokens + n_phones)
    with torch.inference_mode():
        out = graphs.encode(codes, text, ge, speed)
        alone = sovits.decode_encp(codes, text, ge, speed)
    key = encoder_key(n_tokens, n_phones, speed)
    assert captured == [key[:2]] and key[0] % 25 == 0 and key[1] % 32 == 0
    assert out.shape == alone.shape
    assert (out - alone).abs().max() < ATOL


def test_padding_does_not_leak_and_the_masks_matter(sovits):
    # The claim the buckets rest on, without the graph cache: garbage in padded tokens and phonemes
    # changes nothing; with the masks widened to the padded size the same call is far off.
    n_tokens, n_phones, speed, pad_t, pad_p = 21, 17, 1.3, 29, 15
    codes, text, ge = _inputs(sovits, n_tokens, n_phones, seed=5)
    junk_codes, junk_text, _ = _inputs(sovits, pad_t, pad_p, seed=6)
    padded_codes, padded_text = torch.cat([codes, junk_codes], 2), torch.cat([text, junk_text], 1)
    content, n_fea, mask = encp_lengths(n_tokens, speed)
    n_content = encp_lengths(n_tokens + pad_t, speed)[0]
    with torch.inference_mode():
        alone = sovits.decode_encp(codes, text, ge, speed)
        run = lambda t, p, c, m: sovits.decode_encp_masked(  # noqa: E731
            padded_codes, torch.tensor([t]), padded_text, torch.tensor([p]), ge, torch.tensor([c]), n_content,
            torch.tensor([m]),
        )[:, :, :n_fea]  # fmt: skip
        masked = run(n_tokens, n_phones, content, mask)
        widened = run(n_tokens + pad_t, n_phones + pad_p, content, mask)
    assert (masked - alone).abs().max() < ATOL
    assert (widened - alone).abs().max() > 100 * ATOL


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tensor_resampling_equals_interpolate(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 90, generator=g, dtype=dtype)
    for n_in, speed in ((50, 1.3), (90, 0.8), (17, 1.1), (64, 1.0), (2, 1.3)):
        n_out = int(n_in / speed) + 1
        rows = torch.tensor([n_in, 40, n_in])
        out = resample_rows(x, rows, torch.tensor([n_out, 30, n_out]), 130)
        want = F.interpolate(x[:1, :, :n_in], size=n_out, mode="linear")
        # the same positions and weights; the blend's rounding may differ by an ulp (seen: 2.4e-7 in fp32)
        assert (out[:1, :, :n_out] - want).abs().max() < (1e-6 if dtype == torch.float32 else 1e-12)
        assert out[:1, :, n_out:].abs().max() == 0  # zeros past the row's length, as the batched rows


def test_cache_keys_replays_and_eager_fallback(sovits, captured, caplog):  # noqa: F811
    graphs = EncoderGraphs(sovits, CUDA, max_graphs=3)
    with torch.inference_mode():
        a = _inputs(sovits, 25, 20, seed=0)
        first = graphs.encode(*a, 1.3)
        kept = first.clone()
        b = _inputs(sovits, 19, 30, seed=1)  # same (25, 32) bucket: a replay with other lengths
        assert (graphs.encode(*b, 1.3) - sovits.decode_encp(*b, 1.3)).abs().max() < ATOL
        assert captured == [(25, 32)] and torch.equal(first, kept)  # a later replay does not reach it
        graphs.encode(*_inputs(sovits, 30, 20, seed=2), 1.3)  # next token bucket
        graphs.encode(*a, 1.0)  # another speed: another runner
        assert sorted(graphs.captured) == [(25, 32, 1.0), (25, 32, 1.3), (50, 32, 1.3)]
        with caplog.at_level(logging.WARNING, logger="voicehub.models.gpt_sovits"):
            for inputs in (_inputs(sovits, 60, 20, seed=3), _inputs(sovits, MAX_TOKENS + 1, 20, seed=4)):
                for _ in range(2):  # full, then out of range: eager, said once per shape
                    assert torch.equal(graphs.encode(*inputs, 1.3), sovits.decode_encp(*inputs, 1.3))
        assert len(captured) == 3 and sum("runs eagerly" in r.message for r in caplog.records) == 2
        block = sovits.enc_p.encoder2
        block.forward = block.forward  # as a compiled module's forward lives on it: the graphs go
        try:
            out = graphs.encode(*a, 1.3)
            assert captured[-1] == (25, 32) and graphs.captured == [(25, 32, 1.3)]
            assert (out - sovits.decode_encp(*a, 1.3)).abs().max() < ATOL
        finally:
            del block.forward


def test_load_time_encoder_keys_per_preset(tiny_set):
    pipe = load(tiny_set).pipeline
    keys = {
        p: AcousticGraphs(pipe.sovits.cfm.estimator, pipe.vocoder, p, CUDA).encoder_load_keys()
        for p in ("full", "minimal", "lazy")
    }
    assert keys["lazy"] == [] and set(keys["minimal"]) < set(keys["full"])
    # the speeds of the presets whose CFM steps load captures (fast 1.3, balanced 1.1), not quality's 1.0;
    # two windows, phoneme buckets up to 128 (full) / 64 (minimal); full: the first window up to 512
    assert LOAD_SPEEDS == (1.1, 1.3) and {k[2] for k in keys["full"]} == set(LOAD_SPEEDS)
    assert len(keys["full"]) == 2 * (16 + 4) == 40 and len(keys["minimal"]) == 2 * 2 * 2 == 8
    assert (25, 512, 1.3) in keys["full"] and (75, 160, 1.3) not in keys["full"]
    # a short sentence's first two default windows (25, then 50 tokens: prefixes of 25 and 75) at the fast
    # preset's speed
    assert {(25, 32, 1.3), (75, 32, 1.3), (25, 64, 1.3)} <= set(keys["minimal"])
    with pytest.raises(ValueError, match="whose CFM"):
        AcousticGraphs(pipe.sovits.cfm.estimator, pipe.vocoder, "lazy", CUDA).encoder_of(
            load_sovits_v3(tiny_set / "sovits.pth")
        )


# the streaming path's fine buckets, for tests whose cases were written for them
FINE = {"row_buckets": (1, 2, 4, 8, 16), "token_buckets": range(25, MAX_TOKENS + 1, 25),
        "phone_buckets": range(32, 513, 32)}  # fmt: skip


def _row(sovits, n_tokens: int, n_phones: int, speed: float, seed: int) -> EncoderRow:
    codes, text, ge = _inputs(sovits, n_tokens, n_phones, seed)
    return EncoderRow(seed, codes[0, 0], text[0], ge, speed)


def test_row_graph_rows_equal_each_alone_whatever_the_padded_rows_hold(sovits, captured):  # noqa: F811
    graphs = EncoderRowGraphs(sovits, CUDA)
    rows = [_row(sovits, n, p, 1.3, seed=i) for i, (n, p) in enumerate(((50, 40), (31, 12), (8, 33)))]
    junk = _row(sovits, 47, 60, 1.3, seed=9)  # a fourth real row where the padded row was
    as_inputs = lambda rs: [(r.tokens, r.phones, r.ge) for r in rs]  # noqa: E731
    with torch.inference_mode():
        graphs.check()
        padded = graphs.encode(as_inputs(rows), 1.3)
        beside_junk = graphs.encode(as_inputs([*rows, junk]), 1.3)
        for r, out in zip(rows, padded):
            alone = sovits.decode_encp(r.tokens[None, None], r.phones[None], r.ge, r.speed)
            assert out.shape == alone.shape and (out - alone).abs().max() < ATOL
    assert captured == [(4, 50, 64)]  # 3 rows and 4 rows: one (row bucket, tokens, phonemes) graph
    for a, b in zip(padded, beside_junk):
        assert torch.equal(a, b)  # rows are encoded alone: a padded row changes no real row


def test_encode_rows_replays_by_speed_and_counts_the_rest(sovits, captured):  # noqa: F811
    rows = [
        _row(sovits, n, p, speed, seed=i)
        for i, (n, p, speed) in enumerate(
            ((25, 20, 1.3), (50, 30, 1.3), (20, 70, 1.3), (25, 10, 1.0), (MAX_TOKENS + 5, 20, 1.3))
        )
    ]
    with torch.inference_mode():
        eager, eager_calls = encode_rows(sovits, rows)
        assert (eager_calls.calls, eager_calls.replayed, eager_calls.eager) == (1, 0, {"no_graphs": 5})
        # fine buckets here (the streaming path's), rows x token bucket <= 100: the 1.3 rows, longest first,
        # run as 2 rows of <= 50 tokens (<= 30 phonemes) + 1 row of 20 (70 phonemes); the 1.0 row alone
        graphs = EncoderRowGraphs(sovits, CUDA, max_row_tokens=100, **FINE)
        got, calls = encode_rows(sovits, rows, graphs)
        assert captured == [(2, 50, 32), (1, 25, 96), (1, 25, 32)]
        assert sorted(graphs.captured) == [(1, 25, 32, 1.0), (1, 25, 96, 1.3), (2, 50, 32, 1.3)]
        assert (calls.calls, calls.replayed, calls.padded_rows) == (4, 4, 0)
        assert calls.eager == {"too_long": 1}  # said, not silent
        for i, (a, b) in enumerate(zip(got, eager)):
            assert a.shape == b.shape and (a - b).abs().max() < ATOL, i
        graphs.budget.max_graphs = 3  # full: a new shape runs eagerly, the captured ones still replay
        more, calls = encode_rows(sovits, [rows[0], _row(sovits, 75, 20, 1.3, seed=7)], graphs)
        assert calls.eager == {"graph_limit": 2} and calls.replayed == 0 and len(captured) == 3
        again, calls = encode_rows(sovits, [rows[3]], graphs)
        assert calls.replayed == 1 and calls.eager == {} and torch.equal(again[0], got[3])
        block = sovits.enc_p.encoder2
        block.forward = block.forward  # a compiled forward: the graphs are dropped, then captured again
        try:
            encode_rows(sovits, [rows[3]], graphs)
            assert graphs.captured == [(1, 25, 32, 1.0)] and len(captured) == 4
        finally:
            del block.forward


# -- GPU ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_cuda_encoder_graph_equals_eager(tiny_set, dtype):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    pipe = load(tiny_set, device="cuda", dtype=dtype, cuda_graph_preset="full").pipeline
    graphs, sovits = pipe.acoustic_graphs, pipe.sovits
    with torch.inference_mode():
        for n_tokens, n_phones, speed in ((25, 20, 1.3), (50, 33, 1.0), (61, 70, 1.1), (75, 12, 0.8)):
            codes, text, ge = (t.to("cuda") for t in _inputs(sovits, n_tokens, n_phones, seed=n_tokens))
            ge = ge.to(dtype)
            out = graphs.encode(sovits, codes, text, ge, speed)
            key = encoder_key(n_tokens, n_phones, speed)
            assert key in graphs.encoder.captured
            s, n = graphs.encoder._slots_of(key), graphs.encoder._slots_of(key).lengths  # eager on the same
            eager = sovits.decode_encp_masked(
                s.codes, n[0:1], s.text, n[1:2], s.ge, n[2:3] if speed != 1 else None, s.n_content, n[3:4]
            )
            assert torch.equal(out, eager[:, :, : out.shape[2]]), key  # the same kernels on the same buffers
            alone = sovits.decode_encp(codes, text, ge, speed)  # unpadded: up to rounding
            tol = 1e-4 if dtype == torch.float32 else 2e-2
            assert out.shape == alone.shape
            assert (out - alone).abs().max() <= tol * max(1.0, alone.abs().max().item()), key


def test_row_graphs_without_capture_on_use_replay_only_what_was_captured(sovits, captured):  # noqa: F811
    rows = [_row(sovits, 25, 20, 1.3, seed=1), _row(sovits, 75, 20, 1.3, seed=2)]
    graphs = EncoderRowGraphs(sovits, CUDA, capture_on_use=False)
    with torch.inference_mode():
        eager, _ = encode_rows(sovits, rows)
        assert graphs.capture([graphs.key(1, 25, 20, 1.3)]) == [(1, 50, 64, 1.3)]
        one, calls_one = encode_rows(sovits, rows[:1], graphs)
        both, calls_both = encode_rows(sovits, rows, graphs)
    assert (calls_one.replayed, calls_one.eager) == (1, {})
    # two rows take the 75-token row's bucket, not captured: no capture mid-round (it stalls the engine)
    assert (calls_both.replayed, calls_both.eager) == (0, {"not_captured": 2})
    assert captured == [(1, 50, 64)] and sorted(graphs.captured) == [(1, 50, 64, 1.3)]
    for a, b in zip([one[0], *both], [eager[0], *eager]):
        assert a.shape == b.shape and (a - b).abs().max() < ATOL


def test_engine_buckets_are_few_and_cover_every_window(sovits):
    # the engine captures every key at start, so the defaults must stay few: per speed 16 one-row + 16
    # four-row + 12 sixteen-row graphs (16 rows x 500 tokens is past the rows x tokens bound)
    graphs = EncoderRowGraphs(sovits, CUDA)
    keys = graphs.all_keys(1.3)
    assert len(keys) == 44 and len({k[:3] for k in keys}) == 44 and 2 * len(keys) <= graphs.budget.max_graphs
    for n_rows, n_tokens, n_phones in ((1, 1, 1), (3, 51, 65), (16, 200, 512), (5, 499, 300), (4, 500, 512)):
        assert graphs.is_in_range(n_tokens, n_phones)
        n_rows = min(n_rows, graphs.rows_per_call(n_tokens))
        assert graphs.key(n_rows, n_tokens, n_phones, 1.3) in keys
    assert not graphs.is_in_range(MAX_TOKENS + 1, 10) and not graphs.is_in_range(10, 513)
