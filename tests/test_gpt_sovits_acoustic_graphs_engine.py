"""The acoustic graphs (acoustic_graphs.py) at load and at engine start, on the CPU stand-in runner
(acoustic_graphs_fakes.py) and the tiny `make-checkpoint` set.

They hold the load-time and engine-start shapes (the first chunks of a stream, and every piece and
window of an engine sentence, capture nothing new) and that a stream, alone or in the engine among
others, sounds as it does eagerly. GPU tests: test_gpt_sovits_acoustic_graphs_gpu.py.
"""

from __future__ import annotations

from itertools import islice
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from acoustic_graphs_fakes import captured, graphs_of, stream_audio  # noqa: F401 (fixture: captured)

from voicehub.models.gpt_sovits.acoustic_graphs import LOAD_SPEEDS, cfm_frame_buckets
from voicehub.models.gpt_sovits.batch_acoustic import CfmRows, VocoderRows
from voicehub.models.gpt_sovits.engine_start import cfm_start_keys, masked_start_keys, vocoder_start_shapes
from voicehub.models.gpt_sovits.params import GptSovitsParams
from voicehub.models.gpt_sovits.pipeline import Pipeline
from voicehub.models.gpt_sovits.serving import ServingConfig, StreamEngine
from voicehub.models.gpt_sovits.sovits.synth import T_REF
from voicehub.models.gpt_sovits.streaming import window_ends
from voicehub.models.gpt_sovits.window_shapes import feature_frames
from voicehub.text.options import Language


def test_feature_frames_is_decode_encps_length(model, voice):
    pipe = model.pipeline
    ref = pipe.reference(voice)
    phones = torch.tensor([ref.phone_ids])
    for n in (1, 7, 25, 50):
        for speed in (1.0, 1.1, 1.3, 0.8):
            fea = pipe.sovits.decode_encp(ref.prompt_tokens[:n][None, None], phones, ref.acoustic.ge, speed)
            assert fea.shape[2] == feature_frames(n, speed), (n, speed)


def test_load_time_shapes_per_preset(model):
    shapes = {p: graphs_of(model.pipeline, p).load_time_shapes(None) for p in ("full", "minimal", "lazy")}
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


@pytest.mark.parametrize("preset", ["minimal", "full"])
def test_stream_with_graphs_equals_eager_and_load_captures_its_first_chunks(model, voice, captured, preset):  # noqa: F811
    pipe = model.pipeline
    graphs = graphs_of(pipe, preset)
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
    eager = stream_audio(pipe, ref, sentence, params)
    assert [len(a) for a in streamed] == [len(a) for a in eager]
    np.testing.assert_allclose(np.concatenate(streamed), np.concatenate(eager), rtol=0, atol=1e-4)


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
    pipe.acoustic_graphs = graphs_of(pipe, "full")
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


def test_engine_windows_replay_row_graphs_alone_or_among_others(model, voice, captured):  # noqa: F811
    """The stream engine with graphs (preset full): at start it captures the row buckets of its grid
    lengths; its windows replay them (none eagerly), several in one call; a stream's audio is the same
    alone and among others."""
    pipe = model.pipeline
    pipe.acoustic_graphs = graphs_of(pipe, "full")
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
