"""The GPT-SoVITS v3 stream engine (serving.py) on the tiny `make-checkpoint` set, CPU, fp32.

A stream's tokens and audio are the same alone and among other streams that join, leave and cancel
around it (their SoVITS encoder windows and CFM pieces batched); one stream alone equals the
single-stream streaming path (greedy); a stream's first chunk goes before other streams' work; a cancel frees the stream's row and state. The tiny T2S never
samples EOS, so every sentence is bounded with force_n_tokens.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from acoustic_graphs_fakes import captured  # noqa: F401 (fixture: the stand-in graph runner)

from voicehub.errors import InvalidTextError
from voicehub.models.gpt_sovits import Voice, load
from voicehub.models.gpt_sovits.batch_acoustic import VocoderRows, vocode_windows
from voicehub.models.gpt_sovits.encoder_graphs import EncoderRowGraphs
from voicehub.models.gpt_sovits.serving import ServingConfig, StreamEngine, engine_key
from voicehub.models.gpt_sovits.serving_stream import is_urgent, priority
from voicehub.models.gpt_sovits.streaming import VocoderStream
from voicehub.runtime.scheduler import QueueFullError, StreamCancelledError

ATOL = 1e-4  # fp32 audio: batched convolutions and padded CFM rows reorder a few sums
GREEDY = dict(top_k=1, top_p=1.0, temperature=1.0, repetition_penalty=1.0)
REQUESTS = [  # (text, params): sampled and greedy, other windows, speeds, CFM steps and seeds
    ("Good morning.", dict(seed=3, force_n_tokens=10, stream_chunk_tokens=4, sample_steps=2)),
    ("See you.", dict(GREEDY, seed=1, force_n_tokens=8, stream_chunk_tokens=5, speed=1.2, sample_steps=2)),
    (
        "Hello there. How are you?",
        dict(seed=4, force_n_tokens=8, stream_chunk_tokens=4, sample_steps=3, pause_s=0.05),
    ),
]
CANCELLED = (
    "One more thing. And another.",
    dict(seed=5, force_n_tokens=8, stream_chunk_tokens=4, sample_steps=2),
)


@pytest.fixture(scope="module")
def engine(model):
    # vocoder windows grow to 16-frame multiples, so windows of different streams share calls
    return StreamEngine(model, ServingConfig(max_streams=3, max_queue=4, vocoder_bucket_frames=16))


def _audio(stream) -> np.ndarray:
    return np.concatenate([c.audio for c in stream])


def _solo(engine, voice, text, params):
    stream = engine.submit(text, voice=voice, **params)
    engine.run_until_idle()
    return stream, [c.audio for c in stream]


def test_one_stream_equals_the_single_stream_streaming_path(model, voice):
    """Greedy tokens are the same on both paths, and so is the CFM noise (per-sentence seeds): with
    streaming.py's exact windows (no vocoder buckets) the chunks are the same, sample for sample."""
    text = "Hello there. How are you?"
    params = dict(GREEDY, seed=7, force_n_tokens=8, stream_chunk_tokens=4, sample_steps=2)
    want = list(model.stream(text, voice=voice, **params))
    engine = StreamEngine(model, ServingConfig(max_streams=1, vocoder_bucket_frames=1))
    stream = engine.submit(text, voice=voice, **params)
    engine.run_until_idle()
    got = list(stream)
    assert [len(c.audio) for c in got] == [len(c.audio) for c in want]
    assert [(c.text, c.index, c.is_last, c.start_s) for c in got] == [
        (c.text, c.index, c.is_last, c.start_s) for c in want
    ]
    np.testing.assert_allclose(
        np.concatenate([c.audio for c in got]), np.concatenate([c.audio for c in want]), atol=1e-6
    )
    assert [len(t) for t in stream.tokens] == [8, 8]


def test_streams_equal_alone_and_among_others(engine, voice):
    """Two start together; one joins after 2 rounds and one after 4 (it waits for a row: 3 rows)
    and is cancelled after its first chunk. Each finished stream equals its solo run."""
    solo = [_solo(engine, voice, text, params) for text, params in REQUESTS]
    cfm_before = len(engine.recent_cfm_batches)
    enc_before = (engine.stats.encoder_calls, engine.stats.encoder_rows)
    streams = [engine.submit(text, voice=voice, **params) for text, params in REQUESTS[:2]]
    for _ in range(2):
        engine.step()
    streams.append(engine.submit(REQUESTS[2][0], voice=voice, **REQUESTS[2][1]))
    for _ in range(2):
        engine.step()
    cancelled = engine.submit(CANCELLED[0], voice=voice, **CANCELLED[1])
    while cancelled.n_chunks < 1:
        engine.step()
    cancelled.cancel()
    engine.run_until_idle()
    for i, (alone_stream, alone_audio) in enumerate(solo):
        assert streams[i].tokens == alone_stream.tokens, i
        got = [c.audio for c in streams[i]]
        assert [len(a) for a in got] == [len(a) for a in alone_audio], i
        np.testing.assert_allclose(
            np.concatenate(got), np.concatenate(alone_audio), atol=ATOL, err_msg=str(i)
        )
    got = []
    with pytest.raises(StreamCancelledError):
        for chunk in cancelled:
            got.append(chunk)
    assert got and not any(c.is_last for c in got)  # it left mid-way
    batches = list(engine.recent_cfm_batches)[cfm_before:]
    assert max(len(b) for b in batches) >= 2, "no CFM batch held two streams: nothing was batched"
    n_calls = engine.stats.encoder_calls - enc_before[0]
    n_rows = engine.stats.encoder_rows - enc_before[1]
    assert n_rows > n_calls > 0, "no SoVITS encoder call held two streams' windows"


def _push_all(rows, mel, sizes, owner):
    windows, start = [], 0
    for k, n in enumerate(sizes):
        window = rows.push(mel[:, :, start : start + n], owner, is_last=k == len(sizes) - 1)
        windows.extend([window] if window is not None else [])
        start += n
    return windows


def test_vocoder_rows_are_the_vocoder_stream_split(model):
    vocoder, conf = model.pipeline.vocoder, model.pipeline.vocoder.conf
    mel = torch.randn(1, conf.num_mels, 80, generator=torch.Generator().manual_seed(0)) - 5
    sizes = [36, 20, 24]
    stream = VocoderStream(vocoder)
    want = np.concatenate(
        [
            stream.push(mel[:, :, a : a + n], is_last=k == 2)
            for k, (a, n) in enumerate(zip([0, 36, 56], sizes))
        ]
    )
    rows = VocoderRows(conf.hop_size, conf.sampling_rate)
    windows = _push_all(rows, mel, sizes, owner=None)
    assert len(windows) == stream.n_calls
    got = np.concatenate([rows.absorb(w, vocode_windows(vocoder, [w], 4)[0][0]) for w in windows])
    np.testing.assert_array_equal(got, want)


def test_vocoder_windows_of_one_length_share_a_call(model):
    """Bucketed windows (grown by left context to 16-frame multiples, or ended early at one when there
    is no history to grow into) of two streams with other chunk sizes meet in length and run in one
    call, with the same audio as one call each."""
    vocoder, conf = model.pipeline.vocoder, model.pipeline.vocoder.conf
    g = torch.Generator().manual_seed(1)
    mels = [torch.randn(1, conf.num_mels, 80, generator=g) - 5 for _ in range(2)]
    windows = [
        _push_all(VocoderRows(conf.hop_size, conf.sampling_rate, bucket_frames=16), mel, sizes, owner=i)
        for i, (mel, sizes) in enumerate(zip(mels, [[36, 20, 24], [36, 17, 27]]))
    ]
    flat = [w for ws in windows for w in ws]
    assert all(w.n_frames % 16 == 0 for w in flat)
    together, calls = vocode_windows(vocoder, flat, max_batch=8)
    alone = [vocode_windows(vocoder, [w], max_batch=1)[0][0] for w in flat]
    assert calls.calls == len({w.n_frames for w in flat}) < len(flat)  # some windows share a call
    assert calls.eager == {"no_graphs": len(flat)} and calls.replayed == 0  # said, not silent
    for a, b in zip(together, alone):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_a_first_chunk_goes_before_other_streams_work(model, voice):
    """One CFM row a round: a long stream builds a backlog of windows; a new stream's first window
    is solved in the round it becomes ready, ahead of that backlog."""
    engine = StreamEngine(model, ServingConfig(max_streams=2, max_cfm_batch=1, urgent_s=0.0))
    long = engine.submit("A long one.", voice=voice, seed=1, force_n_tokens=40, stream_chunk_tokens=4)
    while long.n_chunks < 1:
        engine.step()
    new = engine.submit("Short.", voice=voice, seed=2, force_n_tokens=8, stream_chunk_tokens=4)
    while True:
        n_before = len(engine.recent_cfm_batches)
        engine.step()
        batches = list(engine.recent_cfm_batches)[n_before:]
        if any(new.id in b for b in batches):
            break
        waiting = [r for r in engine._runs if r.stream is new and r.is_acoustic_ready]
        assert not waiting, "the new stream's window waited behind the backlog"
    assert batches[0] == (new.id,)  # the first CFM call of the round its window became ready
    assert not long.is_finished  # it still had work: the new stream really went first
    long.cancel()
    engine.run_until_idle()


def test_priority_is_first_chunk_then_earliest_deadline():
    def stream(created, first=None, delivered=0.0):
        return SimpleNamespace(created=created, first_chunk_at=first, delivered_s=delivered)

    waiting_long, waiting_new = stream(1.0), stream(5.0)
    ahead, behind = stream(0.0, first=2.0, delivered=9.0), stream(0.5, first=3.0, delivered=1.0)
    ordered = sorted([ahead, waiting_new, behind, waiting_long], key=priority)
    assert ordered == [waiting_long, waiting_new, behind, ahead]
    assert is_urgent(waiting_new, now=0.0, urgent_s=0.0)
    assert is_urgent(behind, now=3.6, urgent_s=0.5) and not is_urgent(ahead, now=3.6, urgent_s=0.5)


def test_cancel_frees_every_row_and_stream(model, voice):
    engine = StreamEngine(model, ServingConfig(max_streams=2, max_queue=2))
    params = dict(seed=1, force_n_tokens=40, stream_chunk_tokens=40, sample_steps=2)
    # one in the acoustic stage (small windows), one decoding, one waiting for a row
    streams = [
        engine.submit(f"Stream {i}.", voice=voice, **params | dict(stream_chunk_tokens=8 if i == 0 else 40))
        for i in range(3)
    ]
    for _ in range(3):
        engine.step()
    assert engine.scheduler.n_active == 2 and len(engine._waiting) == 1 and streams[0].n_chunks >= 1
    late = engine.submit("Never started.", voice=voice, **params)
    for stream in [*streams, late]:
        stream.cancel()
    engine.step()
    assert engine.is_idle and engine.n_streams == 0 and engine.scheduler.is_idle
    assert bool(engine.t2s.state.done.all()) and int(engine.t2s.cache.lengths.abs().sum()) == 0
    for stream in [*streams, late]:
        assert stream.is_finished
        with pytest.raises(StreamCancelledError):
            list(stream)


def test_bad_requests_fail_alone_and_the_queue_is_bounded(model, voice, tmp_path):
    engine = StreamEngine(model, ServingConfig(max_streams=1, max_queue=1))
    with pytest.raises(TypeError, match="unknown GPT-SoVITS parameter"):
        engine.submit("Hello.", voice=voice, not_a_param=1)
    with pytest.raises(InvalidTextError):
        engine.submit("   ", voice=voice)
    broken = engine.submit("Hello.", voice=Voice(tmp_path / "missing.wav", "hi", "en"), force_n_tokens=4)
    fine = engine.submit("Hello.", voice=voice, seed=1, force_n_tokens=4)
    with pytest.raises(QueueFullError):  # one row, one queue place: both taken
        engine.submit("Hello.", voice=voice, force_n_tokens=4)
    engine.run_until_idle()
    with pytest.raises(Exception, match="missing.wav"):
        list(broken)
    assert sum(len(c.audio) for c in fine) > 0


def test_engines_are_keyed_by_the_weights(model, tiny_set):
    again = load(tiny_set)
    lora = load(tiny_set, sovits_path=tiny_set / "lora" / "sovits_lora.pth")
    assert engine_key(again) == engine_key(model) != engine_key(lora)


def test_held_vocoder_windows_share_calls_and_change_no_audio(model, voice, monkeypatch):
    """With the clock stopped, a stream with a chunk out always has its audio ahead of it (more than
    urgent_s): its windows are held for others to share their call (first chunks go at once, the rest
    when max_vocoder_batch wait or T2S has no work left). Same audio as vocoding each batch's windows
    right after it, in fewer, fuller calls."""
    monkeypatch.setattr(time, "perf_counter", lambda: 1000.0)
    requests = [  # windows of 4, 8, 16, 32 tokens; T2S steps 2 a round: windows come while T2S has work
        dict(seed=i, force_n_tokens=n, stream_chunk_tokens=4, sample_steps=2)
        for i, n in enumerate((30, 40, 50))
    ]
    results = {}
    for hold in (False, True):
        config = ServingConfig(
            max_streams=3, urgent_s=0.05, vocoder_bucket_frames=16, hold_vocoder=hold, stop_check_interval=2,
            max_cfm_batch=1,  # a CFM call per stream: held windows of one length (the streams' k-th) share calls
        )  # fmt: skip
        engine = StreamEngine(model, config)
        streams = [engine.submit("Held windows.", voice=voice, **params) for params in requests]
        engine.run_until_idle()
        results[hold] = engine.stats, [np.concatenate([c.audio for c in s]) for s in streams]
    (free, free_audio), (held, held_audio) = results[False], results[True]
    assert held.vocoder_rows == free.vocoder_rows and held.vocoder_flushes < free.vocoder_flushes
    assert held.vocoder_calls < free.vocoder_calls
    for i, (a, b) in enumerate(zip(held_audio, free_audio)):
        assert a.shape == b.shape, i
        np.testing.assert_allclose(a, b, rtol=0, atol=ATOL, err_msg=str(i))


def test_encoder_graphs_alone_equals_among_others_and_eager(model, voice, captured):  # noqa: F811
    """The engine's encoder rows replayed from (row bucket, tokens, phonemes, speed) graphs (CPU stand-in
    runner): a stream's audio is the same alone and among others (its rows padded, beside other rows),
    and the same as the eager engine's; every row is counted as replayed, none eagerly."""
    config = ServingConfig(max_streams=4, vocoder_bucket_frames=16)
    # three alike at one speed (their windows come together: 3 rows in a replay of 4), one at another
    alike = [(text, REQUESTS[0][1] | dict(seed=s)) for text, s in (("Good evening.", 8), ("Good night.", 9))]
    requests = [REQUESTS[0], *alike, REQUESTS[1]]
    runs = {}
    for use_graphs in (False, True):
        engine = StreamEngine(model, config)
        assert engine.encoder_graphs is None and engine.encoder_graphs_at_start == []  # CPU: none
        if use_graphs:
            engine.encoder_graphs = EncoderRowGraphs(model.pipeline.sovits, torch.device("cuda"))
        alone = [np.concatenate(_solo(engine, voice, text, params)[1]) for text, params in requests]
        before = engine.stats.to_dict()
        streams = [engine.submit(text, voice=voice, **params) for text, params in requests]
        engine.run_until_idle()
        runs[use_graphs] = engine.stats, before, alone, [_audio(s) for s in streams]
    stats, before, alone, together = runs[True]
    for i, (a, b, eager) in enumerate(zip(alone, together, runs[False][2])):
        assert a.shape == b.shape == eager.shape, i
        np.testing.assert_allclose(b, a, rtol=0, atol=ATOL, err_msg=str(i))
        np.testing.assert_allclose(a, eager, rtol=0, atol=ATOL, err_msg=str(i))
    assert stats.encoder_eager == {} and stats.encoder_replayed == stats.encoder_rows > 0
    assert stats.encoder_rows - before["encoder_rows"] > stats.encoder_calls - before["encoder_calls"] > 0
    assert stats.encoder_padded_rows > 0 and captured  # some calls were padded to a row bucket
    # every encoder graph here was captured on first use, inside a round: the stall counters see each
    assert stats.captures_in_rounds == len(captured) and 0 < stats.round_s_max
    assert runs[False][0].captures_in_rounds == 0 and 0 <= stats.slow_rounds <= stats.rounds  # CPU: any speed
    eager_stats = runs[False][0]
    assert eager_stats.encoder_replayed == 0 and eager_stats.encoder_eager == {
        "no_graphs": eager_stats.encoder_rows
    }
