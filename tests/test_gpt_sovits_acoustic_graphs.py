"""The streaming path's CFM and vocoder graphs (acoustic_graphs.py) on the tiny `make-checkpoint` set.

CPU: CUDA graphs need CUDA, so a stand-in runner "captures" by running the step once and keeping its
outputs, and "replays" by running the step again into those same tensors (a real graph's static-output
semantics: a caller that keeps the output without copying it sees it change). With it, the tests hold the
padding (a padded, masked CFM piece equals the unpadded solve in fp32), the cache's keys (which
shapes share a graph, what is captured when, what drops the graphs) and the load-time shapes (the first
chunks of a stream capture nothing new). GPU tests (`-m gpu`) hold real graphs to eager.
"""

from __future__ import annotations

import logging
from itertools import islice
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gpt_sovits_fixtures import REFERENCE_TEXT, reference_wav, tiny_set  # noqa: F401 (fixtures)

from voicehub.models.gpt_sovits import Voice, load
from voicehub.models.gpt_sovits.acoustic_graphs import (
    LOAD_SPEEDS,
    AcousticGraphs,
    build_acoustic_graphs,
    cfm_frame_buckets,
)
from voicehub.models.gpt_sovits.batch_acoustic import (
    CfmPiece,
    CfmRows,
    VocoderRows,
    VocoderWindow,
    solve_pieces,
    vocode_windows,
)
from voicehub.models.gpt_sovits.bigvgan import vocode
from voicehub.models.gpt_sovits.cfm import solve
from voicehub.models.gpt_sovits.cfm.schedule import dyadic_steps
from voicehub.models.gpt_sovits.cfm.solver import solve_padded
from voicehub.models.gpt_sovits.engine_start import cfm_start_keys, masked_start_keys, vocoder_start_shapes
from voicehub.models.gpt_sovits.params import GptSovitsParams
from voicehub.models.gpt_sovits.pipeline import Pipeline
from voicehub.models.gpt_sovits.serving import ServingConfig, StreamEngine
from voicehub.models.gpt_sovits.sovits.synth import T_REF
from voicehub.models.gpt_sovits.streaming import window_ends
from voicehub.models.gpt_sovits.window_shapes import feature_frames
from voicehub.runtime import cuda_graphs
from voicehub.runtime.cuda_graphs import BucketedGraphRunner
from voicehub.text.options import Language

ATOL = 2e-5  # fp32: the padded, masked piece reorders a few sums
CUDA = torch.device("cuda")  # what the graphs are told; the stand-in never touches it


@pytest.fixture(scope="module")
def model(tiny_set):  # noqa: F811
    return load(tiny_set)


@pytest.fixture(scope="module")
def voice(reference_wav):  # noqa: F811
    return Voice(reference_wav, REFERENCE_TEXT, "en")


@pytest.fixture
def captured(monkeypatch) -> list:
    """Keys the stand-in runner captured, in order (see the module's docstring)."""
    keys: list = []
    init = BucketedGraphRunner.__init__

    def on_cuda(self, step, buckets, preset, device, **kw):
        init(self, step, buckets, preset, CUDA, **kw)

    def capture(self, key):
        keys.append(key)
        outputs = self.step(key)
        graph = SimpleNamespace(replay=lambda: outputs.copy_(self.step(key)))
        self._graphs[key] = cuda_graphs._Captured(graph, outputs)
        return self._graphs[key]

    monkeypatch.setattr(BucketedGraphRunner, "__init__", on_cuda)
    monkeypatch.setattr(BucketedGraphRunner, "_capture", capture)
    return keys


def _graphs(pipe, preset: str = "lazy") -> AcousticGraphs:
    return AcousticGraphs(pipe.sovits.cfm.estimator, pipe.vocoder, preset, CUDA)


def _piece(est, n: int, p: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    text_dim, mel = est.text_embed.freqs_cis.shape[1], est.proj_out.out_features
    return (torch.randn(1, n, text_dim, generator=g), torch.randn(1, mel, p, generator=g),
            torch.randn(1, mel, n, generator=g))  # fmt: skip


def test_graphs_only_on_cuda_with_a_capturing_preset(model):
    est, voc = model.pipeline.sovits.cfm.estimator, model.pipeline.vocoder
    assert build_acoustic_graphs(est, voc, "full", torch.device("cpu")) is None
    assert build_acoustic_graphs(est, voc, "off", CUDA) is None
    with pytest.raises(ValueError, match="CUDA device"):
        AcousticGraphs(est, voc, "full", torch.device("cpu"))


def test_feature_frames_is_decode_encps_length(model, voice):
    pipe = model.pipeline
    ref = pipe.reference(voice)
    phones = torch.tensor([ref.phone_ids])
    for n in (1, 7, 25, 50):
        for speed in (1.0, 1.1, 1.3, 0.8):
            fea = pipe.sovits.decode_encp(ref.prompt_tokens[:n][None, None], phones, ref.acoustic.ge, speed)
            assert fea.shape[2] == feature_frames(n, speed), (n, speed)


@pytest.mark.parametrize("n, p", [(37, 20), (64, 30), (100, 41), (934, 468)])
def test_padded_piece_equals_the_unpadded_solve(model, captured, n, p):
    est = model.pipeline.sovits.cfm.estimator
    graphs = _graphs(model.pipeline)
    mu, prompt, noise = _piece(est, n, p, seed=n)
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
    mu, prompt, noise = _piece(est, 40, 16, seed=1)
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


def test_cfm_cache_keys(model, captured):
    est = model.pipeline.sovits.cfm.estimator
    graphs = _graphs(model.pipeline)
    with torch.inference_mode():
        first = graphs.solve(est, *_piece(est, 37, 20, seed=0), 2)
        kept = first.clone()
        graphs.solve(est, *_piece(est, 50, 20, seed=1), 2)  # same bucket: a replay
        assert captured == [(1, 64)]
        assert torch.equal(first, kept)  # a later replay does not reach an earlier result
        graphs.solve(est, *_piece(est, 70, 20, seed=2), 2)
        graphs.solve(est, *_piece(est, 37, 20, seed=3), 3)  # other steps: other graphs
        assert captured == [(1, 64), (1, 128), (1, 64)]
        assert {n: r.captured_buckets for n, r in graphs.cfm.runners.items()} == {
            2: [(1, 128), (1, 64)],
            3: [(1, 64)],
        }
        previous = est.set_schedule(dyadic_steps)  # what the solver runs changed: the graphs go
        try:
            out = graphs.solve(est, *_piece(est, 37, 20, seed=0), 2)
            assert captured[-1] == (1, 64) and list(graphs.cfm.runners) == [2]
            assert (out - solve(est, *_piece(est, 37, 20, seed=0), 2)).abs().max() < ATOL
        finally:
            est.set_schedule(previous)
        block = est.transformer_blocks[0]
        block.forward = block.forward  # as a compiled block's forward lives on it: the graphs go
        try:
            graphs.solve(est, *_piece(est, 37, 20, seed=0), 2)
            assert captured[-1] == (1, 64) and len(captured) == 5
        finally:
            del block.forward


def test_vocoder_row_graphs_per_exact_length(model, captured, caplog):
    voc = model.pipeline.vocoder
    graphs = _graphs(model.pipeline)
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


def test_load_time_shapes_per_preset(model):
    shapes = {p: _graphs(model.pipeline, p).load_time_shapes(None) for p in ("full", "minimal", "lazy")}
    assert shapes["lazy"] == ([], [])
    full_cfm, full_voc = shapes["full"]
    minimal_cfm, minimal_voc = shapes["minimal"]
    assert sorted(full_cfm) == sorted((1, f) for f in cfm_frame_buckets()) and len(full_cfm) == 15
    assert max(cfm_frame_buckets()) >= 934 and all(f % 64 == 0 for f in cfm_frame_buckets())
    assert minimal_cfm and set(minimal_cfm) < set(full_cfm)
    assert len(full_voc) == 10 and set(minimal_voc) < set(full_voc)
    # the first two windows (25 and 50 tokens) at both load speeds: the first is all the first window's
    # frames (73 at speed 1.3, 86 at 1.1: the 128-frame masked graph), the second 180 / 206 frames with
    # its left context and lookahead (the 192 / 256-frame graphs)
    assert feature_frames(25, 1.3) == 73 and minimal_voc == [
        (1, 256, "masked"),
        (1, 192, "masked"),
        (1, 128, "masked"),
    ]


def _stream(pipe: Pipeline, ref, sentence, params):
    return [a for a, _ in pipe.stream_sentence(ref, sentence, params, seed=3)]


@pytest.mark.parametrize("preset", ["minimal", "full"])
def test_stream_with_graphs_equals_eager_and_load_captures_its_first_chunks(model, voice, captured, preset):
    pipe = model.pipeline
    graphs = _graphs(pipe, preset)
    fast = Pipeline(
        pipe.frontend, pipe.hubert, pipe.bert, pipe.t2s, pipe.sovits, pipe.vocoder, pipe.device, pipe.dtype,
        pipe.cache, pipe.model_id, None, graphs,
    )  # fmt: skip
    ref = pipe.reference(voice)
    sentence = pipe.text_features("One sentence, streamed in windows.", Language.EN)
    params = GptSovitsParams.build("fast", force_n_tokens=80, stream_chunk_tokens=25)
    report = graphs.capture_at_load(ref.acoustic.fea.shape[2], encoder=pipe.sovits)
    at_load = list(captured)
    assert at_load and report["vocoder_masked"]
    assert {(25, 32, 1.3), (75, 32, 1.3)} <= set(report["encoder_keys"]) and len(sentence.phone_ids) <= 32
    pieces = fast.stream_sentence(ref, sentence, params, seed=3)
    first, second = next(pieces)[0], next(pieces)[0]
    assert captured == at_load  # the first two chunks replayed graphs captured at load
    streamed = [first, second, *(a for a, _ in pieces)]
    eager = _stream(pipe, ref, sentence, params)
    assert [len(a) for a in streamed] == [len(a) for a in eager]
    np.testing.assert_allclose(np.concatenate(streamed), np.concatenate(eager), rtol=0, atol=1e-4)


def _mels(n_frames: int, n: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(100, n_frames, generator=g) - 6 for _ in range(n)]


def test_padded_vocoder_rows_change_no_real_row(model, captured):
    """3 windows replay the (4 rows, 24 frames) graph, its 4th row zeros: each row is `vocode` of its
    window alone (up to the fp32 rounding of a batched convolution on the CPU); garbage in the padded
    row changes no real row, bit for bit (BigVGAN convolves each row alone)."""
    voc = model.pipeline.vocoder
    graphs = _graphs(model.pipeline)
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


def test_vocoder_row_graphs_are_bounded_and_say_why_not(model, captured, caplog):
    graphs = _graphs(model.pipeline)
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


def test_vocode_windows_replay_grid_lengths_and_count_the_rest(model, captured):
    """Windows on the 16-frame grid share one replay; others replay the masked one-row graph of their
    frame bucket, one window a call (those few graphs are not counted against the limit); past the graph
    limit a grid window runs eagerly with its reason; the audio is eager's either way."""
    voc = model.pipeline.vocoder
    graphs = _graphs(model.pipeline)
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


def _sentence_shapes(n_tokens: int, speed: float, hop: int, sample_rate: int) -> tuple[list[int], list[int]]:
    """(CFM piece frames, vocoder window lengths) of one engine sentence of n_tokens at the default
    windows, a reference of T_REF frames: the engine's own CfmRows and VocoderRows, on zeros (1 channel)."""
    ends = [e for e in islice(window_ends(ServingConfig.chunk_tokens), 20) if e < n_tokens] + [n_tokens]
    prompt = SimpleNamespace(fea=torch.zeros(1, 1, T_REF), mel=torch.zeros(1, 1, T_REF))
    cfm = CfmRows(prompt, 4, torch.Generator())
    rows = VocoderRows(hop, sample_rate, bucket_frames=ServingConfig.vocoder_bucket_frames)
    pieces, lengths, made = [], [], 0
    for i, end in enumerate(ends):
        new = feature_frames(end, speed) - made
        made += new
        cfm.add(torch.zeros(1, 1, new))
        while cfm.n_todo:
            piece = cfm.next_piece(None, 1)
            pieces.append(piece.n_frames)
            cfm.absorb(torch.zeros(1, 1, piece.n_frames - piece.prompt.shape[1]))
        window = rows.push(torch.zeros(1, 1, new), None, is_last=i == len(ends) - 1)
        if window is not None:
            lengths.append(window.n_frames)
    return pieces, lengths


def test_engine_start_sets_hold_every_shape_of_a_sentence(model):
    """With `full`, every CFM piece and vocoder window of a sentence of 1-500 tokens at the load speeds
    (a reference of 5 s or more) has its graph captured when the engine starts (windows off the grid: the
    masked one-row graphs): none is captured inside a round, where it would stall every stream."""
    pipe = model.pipeline
    pipe.acoustic_graphs = _graphs(pipe, "full")
    try:
        config = ServingConfig()
        cfm = set(cfm_start_keys(pipe, config))
        vocoder = {n for _, n in vocoder_start_shapes(pipe, config)}
        masked = set(masked_start_keys(pipe, config))
        conf, bucket = pipe.vocoder.conf, config.vocoder_bucket_frames
        n_off_grid = 0
        for speed in LOAD_SPEEDS:
            for n_tokens in range(1, 501, 3):
                pieces, lengths = _sentence_shapes(n_tokens, speed, conf.hop_size, conf.sampling_rate)
                for frames in pieces:
                    key = pipe.acoustic_graphs.cfm.key(1, frames)
                    assert all((r, key[1]) in cfm for r in (1, 16)), (speed, n_tokens, frames)
                grid = {n for n in lengths if n % bucket == 0}
                assert grid <= vocoder, (speed, n_tokens, sorted(grid - vocoder))
                for n in set(lengths) - grid:  # off the grid: the masked one-row graphs
                    assert pipe.acoustic_graphs.vocoder.masked_key(n) in masked, (speed, n_tokens, n)
                    n_off_grid += 1
        assert n_off_grid  # short sentences have such windows
    finally:
        pipe.acoustic_graphs = None


def test_engine_windows_replay_row_graphs_alone_or_among_others(model, voice, captured):
    """The stream engine with graphs (preset full): at start it captures the row buckets of its grid
    lengths; its windows replay them (none eagerly), several in one call; a stream's audio is the same
    alone and among others."""
    pipe = model.pipeline
    pipe.acoustic_graphs = _graphs(pipe, "full")
    try:
        config = ServingConfig(
            max_streams=3, max_vocoder_batch=4, chunk_tokens=8, vocoder_bucket_frames=32, max_cfm_batch=4
        )
        engine = StreamEngine(model, config)
        # the masked one-row vocoder graphs, the vocoder's (rows, frames), then the encoder's (3 long),
        # then the CFM's (rows, frames)
        n_cfm, masked = len(engine.cfm_graphs_at_start), engine.masked_vocoder_graphs_at_start
        assert masked and captured[: len(masked)] == sorted(masked, key=lambda k: -k[1])
        at_start = [k for k in captured[len(masked) : len(captured) - n_cfm] if len(k) == 2]
        n_encoder = len(engine.encoder_graphs_at_start)
        assert len(captured) == len(masked) + len(at_start) + n_encoder + n_cfm > len(at_start)
        # CFM: every row bucket up to max_cfm_batch of a long sentence's first pieces (2 frame buckets at T_REF)
        largest_first = lambda k: (-k[0] * k[1], -k[0])  # noqa: E731
        assert n_cfm and captured[-n_cfm:] == sorted(cfm_start_keys(pipe, config), key=largest_first)
        assert {r for r, _ in engine.cfm_graphs_at_start} == {1, 2, 4}
        assert at_start == sorted(vocoder_start_shapes(pipe, config), key=largest_first)
        assert {r for r, _ in at_start} == {1, 2, 4} and all(n % 32 == 0 for _, n in at_start)
        requests = [
            ("Good morning.", dict(seed=3, force_n_tokens=30, sample_steps=2)),  # windows end at 8, 24, 30
            ("See you soon.", dict(seed=1, force_n_tokens=17, sample_steps=2, speed=1.1)),
            ("Hello there.", dict(seed=4, force_n_tokens=36, sample_steps=2)),
        ]
        alone = []
        for text, params in requests:
            stream = engine.submit(text, voice=voice, **params)
            engine.run_until_idle()
            alone.append(np.concatenate([c.audio for c in stream]))
        before = engine.stats.to_dict()
        streams = [engine.submit(text, voice=voice, **params) for text, params in requests]
        engine.run_until_idle()
        stats = {k: v for k, v in engine.stats.to_dict().items() if not isinstance(v, dict)}
        n_calls = stats["vocoder_calls"] - before["vocoder_calls"]
        n_rows = stats["vocoder_rows"] - before["vocoder_rows"]
        assert engine.stats.vocoder_eager == {} and stats["vocoder_replayed"] == stats["vocoder_rows"]
        assert engine.stats.encoder_eager == {} and stats["encoder_replayed"] == stats["encoder_rows"]
        assert n_rows > n_calls > 0, "no vocoder call held two streams' windows"
        for i, (stream, want) in enumerate(zip(streams, alone)):
            got = np.concatenate([c.audio for c in stream])
            assert got.shape == want.shape, i
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-4, err_msg=str(i))
    finally:
        pipe.acoustic_graphs = None


# -- GPU ----------------------------------------------------------------------------------------------


def _cuda_model(tiny_set, dtype, preset="full"):  # noqa: F811
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    return load(tiny_set, device="cuda", dtype=dtype, cuda_graph_preset=preset)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_cuda_cfm_graph_equals_eager(tiny_set, dtype):  # noqa: F811
    model = _cuda_model(tiny_set, dtype)
    graphs = model.pipeline.acoustic_graphs
    est = model.pipeline.sovits.cfm.estimator
    with torch.inference_mode():
        for n, p in ((100, 40), (541, 468), (934, 468)):
            mu, prompt, noise = (t.to("cuda", dtype) for t in _piece(est, n, p, seed=n))
            out = graphs.solve(est, mu, prompt, noise, 4)
            slots = graphs.cfm._slots_of(graphs.cfm.key(1, n))  # the graph's inputs: eager on the same
            eager = solve_padded(est, slots.mu, slots.prompt_x, slots.keep, slots.noise, 4, slots.mask)
            assert torch.equal(out, eager[:, :, :n]), n  # the same kernels on the same buffers
            alone = solve(est, mu, prompt, noise, 4)  # unpadded: up to rounding (masked attention)
            tol = 1e-4 if dtype == torch.float32 else 2e-2
            assert (out - alone).abs().max() <= tol * max(1.0, alone.abs().max().item()), n


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_cuda_vocoder_row_graphs_equal_eager(tiny_set, dtype):  # noqa: F811
    """The stream engine's windows: 3 of one length replay the (4 rows, n) graph. The replay equals eager
    BigVGAN on the graph's own (zero-padded) input bit for bit; each row equals its window vocoded alone
    within fp rounding (a batch of 4 may take other cuDNN kernels than a batch of 1)."""
    model = _cuda_model(tiny_set, dtype)
    graphs, voc = model.pipeline.acoustic_graphs, model.pipeline.vocoder
    tol = 5e-3 if dtype == torch.float32 else 3e-2  # fp32: cuDNN may use TF32 (as serving_gpu's bound)
    with torch.inference_mode():
        for n in (64, 128, 160):
            mels = [(torch.randn(100, n, device="cuda") - 6).to(dtype) for _ in range(3)]
            assert graphs.vocoder_eager_reason(3, n) is None
            out = graphs.vocode_rows(voc, mels)
            eager = vocode(voc, graphs.vocoder._input_of((4, n)))  # the graph's input, its 4th row zeros
            assert torch.equal(out, eager[:3]), n
            for row, mel in zip(out, mels):
                alone = vocode(voc, mel[None])[0]
                assert (row - alone).abs().max() <= tol * max(1.0, alone.abs().max().item()), n
        assert {(4, 64), (4, 128), (4, 160)} <= set(graphs.vocoder.captured)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "dtype, min_snr_db", [(torch.float32, 50.0), (torch.float16, 25.0)]
)  # as serving_gpu
def test_cuda_stream_with_graphs_equals_without(tiny_set, reference_wav, dtype, min_snr_db):  # noqa: F811
    model = _cuda_model(tiny_set, dtype)
    pipe = model.pipeline
    graphs = pipe.acoustic_graphs
    assert graphs is not None and graphs.info()["vocoder"] > 0 and graphs.info()["encoder"] > 0  # at load
    voice = Voice(reference_wav, REFERENCE_TEXT, "en")
    ref = pipe.reference(voice)
    sentence = pipe.text_features("One sentence on the GPU, streamed.", Language.EN)
    params = GptSovitsParams.build("fast", force_n_tokens=90, stream_chunk_tokens=25)
    with_graphs = _stream(pipe, ref, sentence, params)
    pipe.acoustic_graphs = None
    try:
        without = _stream(pipe, ref, sentence, params)
    finally:
        pipe.acoustic_graphs = graphs
    assert [len(a) for a in with_graphs] == [len(a) for a in without] and len(with_graphs) >= 3
    a, b = np.concatenate(with_graphs), np.concatenate(without)
    snr = 10 * np.log10(np.sum(b**2) / max(np.sum((a - b) ** 2), 1e-30))
    assert snr >= min_snr_db, snr


def test_batched_pieces_replay_the_rows_bucket(model, captured):
    # The stream engine's CFM batches (batch_acoustic.solve_pieces): 3 rows of other lengths replay the
    # (4 rows, 128 frames) graph, its 4th row padding; each row as solved alone, up to fp32 rounding.
    est = model.pipeline.sovits.cfm.estimator
    graphs = _graphs(model.pipeline)
    pieces = []
    for i, (n, p) in enumerate(((70, 30), (101, 40), (90, 12))):
        mu, prompt, noise = _piece(est, n, p, seed=i)
        pieces.append(CfmPiece(i, mu[0], prompt[0], noise[0], 2))
    with torch.inference_mode():
        eager = solve_pieces(est, pieces)
        replayed = solve_pieces(est, pieces, graphs)
    assert captured == [(4, 128)]
    for a, b, piece in zip(replayed, eager, pieces):
        assert a.shape == b.shape == (1, piece.noise.shape[0], piece.n_frames - piece.prompt.shape[1])
        assert (a - b).abs().max() < ATOL
