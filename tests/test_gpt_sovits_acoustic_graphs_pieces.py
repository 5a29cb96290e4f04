"""The streaming path's CFM and vocoder graphs (acoustic_graphs.py) piece by piece, on the CPU stand-in
runner (acoustic_graphs_fakes.py) and the tiny `make-checkpoint` set.

They hold the padding (a padded, masked CFM piece equals the unpadded solve in fp32; a padded vocoder
row changes no real row) and the cache's keys (which shapes share a graph, what is captured when, what
drops the graphs, how many graphs there may be). GPU tests: test_gpt_sovits_acoustic_graphs_gpu.py.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from acoustic_graphs_fakes import ATOL, CUDA, captured, graphs_of, random_piece  # noqa: F401 (fixture)

from voicehub.models.gpt_sovits.acoustic_graphs import (
    AcousticGraphs,
    build_acoustic_graphs,
    cfm_frame_buckets,
)
from voicehub.models.gpt_sovits.batch_acoustic import CfmPiece, VocoderWindow, solve_pieces, vocode_windows
from voicehub.models.gpt_sovits.bigvgan import vocode
from voicehub.models.gpt_sovits.cfm import solve
from voicehub.models.gpt_sovits.cfm.schedule import dyadic_steps
from voicehub.models.gpt_sovits.cfm.solver import solve_padded


def test_graphs_only_on_cuda_with_a_capturing_preset(model):
    est, voc = model.pipeline.sovits.cfm.estimator, model.pipeline.vocoder
    assert build_acoustic_graphs(est, voc, "full", torch.device("cpu")) is None
    assert build_acoustic_graphs(est, voc, "off", CUDA) is None
    with pytest.raises(ValueError, match="CUDA device"):
        AcousticGraphs(est, voc, "full", torch.device("cpu"))


@pytest.mark.parametrize("n, p", [(37, 20), (64, 30), (100, 41), (934, 468)])
def test_padded_piece_equals_the_unpadded_solve(model, captured, n, p):  # noqa: F811
    est = model.pipeline.sovits.cfm.estimator
    graphs = graphs_of(model.pipeline)
    mu, prompt, noise = random_piece(est, n, p, seed=n)
    with torch.inference_mode():
        alone = solve(est, mu, prompt, noise, 2)
        out = graphs.solve(est, mu, prompt, noise, 2)
    bucket = next(b for b in cfm_frame_buckets() if b >= n)
    assert captured == [(1, bucket)] and out.shape == alone.shape
    assert (out - alone).abs().max() < ATOL
    assert out[:, :, :p].abs().max() == 0  # the prompt frames, as solve leaves them


def test_padding_does_not_leak_into_valid_frames(model):
    # The claim the buckets rest on, without the graph cache: garbage in the padding changes nothing.
    est = model.pipeline.sovits.cfm.estimator
    mu, prompt, noise = random_piece(est, 40, 16, seed=1)
    n, pad = 40, 24
    mel = prompt.shape[1]
    prompt_x = torch.cat([prompt, torch.zeros(1, mel, n + pad - 16)], dim=2)
    keep = torch.cat([torch.zeros(1, 1, 16), torch.ones(1, 1, n - 16), torch.zeros(1, 1, pad)], dim=2)
    mask = torch.arange(n + pad)[None] < n
    with torch.inference_mode():
        alone = solve(est, mu, prompt, noise, 3)
        mu_padded = torch.cat([mu, 3 + torch.randn(1, pad, mu.shape[2])], dim=1)
        noise_padded = torch.cat([noise, 5 + torch.randn(1, mel, pad)], dim=2)
        padded = solve_padded(est, mu_padded, prompt_x, keep, noise_padded, 3, mask)
    assert (padded[:, :, :n] - alone).abs().max() < ATOL


def test_cfm_cache_keys(model, captured):  # noqa: F811
    est = model.pipeline.sovits.cfm.estimator
    graphs = graphs_of(model.pipeline)
    with torch.inference_mode():
        first = graphs.solve(est, *random_piece(est, 37, 20, seed=0), 2)
        kept = first.clone()
        graphs.solve(est, *random_piece(est, 50, 20, seed=1), 2)  # same bucket: a replay
        assert captured == [(1, 64)]
        assert torch.equal(first, kept)  # a later replay does not reach an earlier result
        graphs.solve(est, *random_piece(est, 70, 20, seed=2), 2)
        graphs.solve(est, *random_piece(est, 37, 20, seed=3), 3)  # other steps: other graphs
        assert captured == [(1, 64), (1, 128), (1, 64)]
        assert {n: r.captured_buckets for n, r in graphs.cfm.runners.items()} == {
            2: [(1, 128), (1, 64)],
            3: [(1, 64)],
        }
        previous = est.set_schedule(dyadic_steps)  # what the solver runs changed: the graphs go
        try:
            out = graphs.solve(est, *random_piece(est, 37, 20, seed=0), 2)
            assert captured[-1] == (1, 64) and list(graphs.cfm.runners) == [2]
            assert (out - solve(est, *random_piece(est, 37, 20, seed=0), 2)).abs().max() < ATOL
        finally:
            est.set_schedule(previous)
        block = est.transformer_blocks[0]
        block.forward = block.forward  # as a compiled block's forward lives on it: the graphs go
        try:
            graphs.solve(est, *random_piece(est, 37, 20, seed=0), 2)
            assert captured[-1] == (1, 64) and len(captured) == 5
        finally:
            del block.forward


def test_batched_pieces_replay_the_rows_bucket(model, captured):  # noqa: F811
    # The stream engine's CFM batches (batch_acoustic.solve_pieces): 3 rows of other lengths replay the
    # (4 rows, 128 frames) graph, its 4th row padding; each row as solved alone, up to fp32 rounding.
    est = model.pipeline.sovits.cfm.estimator
    graphs = graphs_of(model.pipeline)
    pieces = []
    for i, (n, p) in enumerate(((70, 30), (101, 40), (90, 12))):
        mu, prompt, noise = random_piece(est, n, p, seed=i)
        pieces.append(CfmPiece(i, mu[0], prompt[0], noise[0], 2))
    with torch.inference_mode():
        eager = solve_pieces(est, pieces)
        replayed = solve_pieces(est, pieces, graphs)
    assert captured == [(4, 128)]
    for a, b, piece in zip(replayed, eager, pieces):
        assert a.shape == b.shape == (1, piece.noise.shape[0], piece.n_frames - piece.prompt.shape[1])
        assert (a - b).abs().max() < ATOL


def test_vocoder_row_graphs_per_exact_length(model, captured, caplog):  # noqa: F811
    voc = model.pipeline.vocoder
    graphs = graphs_of(model.pipeline)
    g = torch.Generator().manual_seed(0)
    mels = {n: torch.randn(1, 100, n, generator=g) - 6 for n in (30, 31, 32)}

    def window(mel):  # as the engine runs one window: a graph when eager_reason says so, else eagerly
        if graphs.vocoder_eager_reason(1, mel.shape[2]) is not None:
            return vocode(voc, mel)
        return graphs.vocode_rows(voc, [mel[0]])

    with torch.inference_mode():
        first = window(mels[30])
        assert torch.equal(first, vocode(voc, mels[30]))
        again = window(mels[30] + 0.5)  # same length: a replay with the new input
        assert torch.equal(again, vocode(voc, mels[30] + 0.5)) and torch.equal(first, vocode(voc, mels[30]))
        window(mels[31])
        assert captured == [(1, 30), (1, 31)]
        graphs.vocoder.budget.max_graphs = 2  # full: a new length runs eagerly, said once
        with caplog.at_level(logging.WARNING, logger="voicehub.models.gpt_sovits"):
            for _ in range(2):
                assert torch.equal(window(mels[32]), vocode(voc, mels[32]))
        assert captured == [(1, 30), (1, 31)]
        assert sum("runs eagerly" in r.message for r in caplog.records) == 1
        kernel = voc.activation_post.kernel
        previous = voc.set_activation_kernel(lambda *args: kernel(*args))  # another kernel: graphs go
        try:
            assert torch.equal(window(mels[31]), vocode(voc, mels[31]))
            assert captured[-1] == (1, 31) and graphs.vocoder.captured == [(1, 31)]
        finally:
            voc.set_activation_kernel(previous)


def _mels(n_frames: int, n: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(100, n_frames, generator=g) - 6 for _ in range(n)]


def test_padded_vocoder_rows_change_no_real_row(model, captured):  # noqa: F811
    """3 windows replay the (4 rows, 24 frames) graph, its 4th row zeros: each row is `vocode` of its
    window alone (up to the fp32 rounding of a batched convolution on the CPU); garbage in the padded
    row changes no real row, bit for bit (BigVGAN convolves each row alone)."""
    voc = model.pipeline.vocoder
    graphs = graphs_of(model.pipeline)
    mels = _mels(24, 3, seed=0)
    with torch.inference_mode():
        assert graphs.vocoder_eager_reason(3, 24) is None
        out = graphs.vocode_rows(voc, mels)
        assert captured == [(4, 24)] and out.shape == (3, 24 * voc.conf.hop_size)
        for row, mel in zip(out, mels):
            assert (row - vocode(voc, mel[None])[0]).abs().max() <= 1e-5
        buf = graphs.vocoder._input_of((4, 24))
        buf[3] = 50 * torch.randn(100, 24)  # garbage where the padding was
        again = graphs.vocoder.runner.run((4, 24))[:3]
        assert torch.equal(again, out)


def test_vocoder_row_graphs_are_bounded_and_say_why_not(model, captured, caplog):  # noqa: F811
    graphs = graphs_of(model.pipeline)
    voc = graphs.vocoder
    assert voc.rows_per_call(160) == 32 and voc.rows_per_call(161) == 16 and voc.rows_per_call(6000) == 1
    assert graphs.vocoder_eager_reason(17, 160) is None and voc.key(17, 160) == (32, 160)
    assert graphs.vocoder_eager_reason(32, 161) == "too_long"  # rows x frames past max_row_frames
    assert graphs.vocoder_eager_reason(1, 4000) == "too_long"
    with torch.inference_mode():
        graphs.capture_vocoder([(2, 32), (1, 32)])
        voc.budget.max_graphs = 2
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="voicehub.models.gpt_sovits"):
            assert graphs.vocoder_eager_reason(2, 64) == "graph_limit"
            assert graphs.vocoder_eager_reason(2, 64) == "graph_limit"
    assert graphs.vocoder_eager_reason(2, 32) is None  # captured: still replays
    assert captured == [(2, 32), (1, 32)]  # largest first
    assert sum("runs eagerly" in r.message for r in caplog.records) == 1  # said once


def test_vocode_windows_replay_grid_lengths_and_count_the_rest(model, captured):  # noqa: F811
    """Windows on the 16-frame grid share one replay; others replay the masked one-row graph of their
    frame bucket, one window a call (those few graphs are not counted against the limit); past the graph
    limit a grid window runs eagerly with its reason; the audio is eager's either way."""
    voc = model.pipeline.vocoder
    graphs = graphs_of(model.pipeline)
    mels = _mels(16, 3, seed=1) + _mels(13, 2, seed=2)
    windows = [VocoderWindow(i, m, 0, 0, m.shape[1] * 256, True, True) for i, m in enumerate(mels)]
    with torch.inference_mode():
        eager, eager_calls = vocode_windows(voc, windows, 8)
        got, calls = vocode_windows(voc, windows, 8, graphs, bucket_frames=16)
        assert eager_calls.eager == {"no_graphs": 5} and eager_calls.calls == 2
        assert captured == [(4, 16), (1, 64, "masked")]  # 13 frames: off the grid, the masked 64-frame graph
        assert (calls.calls, calls.replayed, calls.padded_rows, calls.off_grid, calls.eager) == (
            3,
            5,
            1,
            2,
            {},
        )
        graphs.vocoder.budget.max_graphs = 1  # the (4, 16) graph
        late = [VocoderWindow(0, m, 0, 0, 32 * 256, True, True) for m in _mels(32, 2, seed=3)]
        got_late, late_calls = vocode_windows(voc, late, 8, graphs, bucket_frames=16)
        assert late_calls.eager == {"graph_limit": 2} and late_calls.replayed == 0
        want_late, _ = vocode_windows(voc, late, 8)
    for a, b in zip(got + got_late, eager + want_late):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
