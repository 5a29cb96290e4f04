"""The GPT-SoVITS v3 stream engine on a CUDA GPU (deselected in CI; the lead runs these on the H200).

Tiny set, T2S and acoustic stage graph-captured (preset full): in fp32 a stream's tokens and audio
are the same alone and among others, every vocoder window replayed from a graph; in fp16 every stream
decodes all its tokens, its audio is finite and its first chunk carries >= 0.25 s. The engine's batched
SoVITS encoder graphs replay what eager `decode_encp_masked` computes on the same buffers, and equal
eager `encode_rows` up to rounding.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gpt_sovits_fixtures import REFERENCE_TEXT

from voicehub.models.gpt_sovits import Voice, load
from voicehub.models.gpt_sovits.batch_acoustic import EncoderRow, encode_rows
from voicehub.models.gpt_sovits.engine_start import encoder_start_keys
from voicehub.models.gpt_sovits.serving import ServingConfig, StreamEngine
from voicehub.models.gpt_sovits.streaming import MIN_FIRST_S

pytestmark = pytest.mark.gpu
PARAMS = [
    dict(seed=1, force_n_tokens=40, stream_chunk_tokens=8, speed=1.0),
    dict(seed=2, force_n_tokens=30, stream_chunk_tokens=10, speed=1.2, top_k=8),
    dict(seed=3, force_n_tokens=50, stream_chunk_tokens=8, speed=1.0, sample_steps=8),
]


@pytest.fixture(scope="module")
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    return "cuda"


def _run(engine, voice, params_list):
    streams = [engine.submit("A sentence for the GPU.", voice=voice, **p) for p in params_list]
    engine.run_until_idle()
    return streams, [[c.audio for c in s] for s in streams]


def test_cuda_graphs_fp32_alone_equals_among_others(cuda, tiny_set, reference_wav):
    model = load(tiny_set, device=cuda, dtype="float32", cuda_graph_preset="full")
    engine = StreamEngine(model, ServingConfig(max_streams=4))
    assert engine.t2s.graphs.captured_buckets  # the T2S steps replay graphs
    assert engine.vocoder_graphs_at_start  # and the vocoder windows' row graphs, captured at start
    voice = Voice(reference_wav, REFERENCE_TEXT, "en")
    alone = [_run(engine, voice, [p]) for p in PARAMS]
    together, audio = _run(engine, voice, PARAMS)
    for i, (streams, pieces) in enumerate(alone):
        assert together[i].tokens == streams[0].tokens, i
        # Batched CFM/vocoder calls run other cuBLAS/cuDNN kernels per batch size (cuDNN may use
        # TF32 in fp32 convolutions): the H200 showed 5 of 24,320 samples off by up to 1.25e-3.
        # Same tokens, and the audio equal to far below audibility (>= 50 dB SNR).
        got, want = np.concatenate(audio[i]), np.concatenate(pieces[0])
        assert got.shape == want.shape, i
        snr = 10 * np.log10(np.sum(want**2) / max(np.sum((got - want) ** 2), 1e-30))
        assert snr >= 50.0 and np.abs(got - want).max() <= 5e-3, (i, snr)
    stats = engine.stats
    assert stats.vocoder_eager == {} and stats.vocoder_replayed == stats.vocoder_rows > stats.vocoder_off_grid
    assert engine.encoder_graphs_at_start  # the encoder's row graphs too, captured at start only:
    # these streams' speeds and windows are outside the start set, so their rows run eagerly and say so
    assert set(stats.encoder_eager) <= {"not_captured"} and stats.encoder_rows > 0
    assert stats.encoder_replayed + sum(stats.encoder_eager.values()) == stats.encoder_rows


def test_fp16_streams_are_whole_and_start_with_a_quarter_second(cuda, tiny_set, reference_wav):
    model = load(tiny_set, device=cuda, cuda_graph_preset="full")  # float16 by default on CUDA
    engine = StreamEngine(model, ServingConfig(max_streams=4, vocoder_bucket_frames=16))
    streams, audio = _run(engine, Voice(reference_wav, REFERENCE_TEXT, "en"), PARAMS)
    for stream, pieces, params in zip(streams, audio, PARAMS):
        joined = np.concatenate(pieces)
        assert np.isfinite(joined).all() and np.abs(joined).max() > 0
        assert len(stream.tokens[0]) == params["force_n_tokens"]
        assert len(pieces[0]) >= MIN_FIRST_S * 24000


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_cuda_engine_encoder_graphs_equal_eager_encode_rows(cuda, tiny_set, dtype):
    model = load(tiny_set, device=cuda, dtype=dtype, cuda_graph_preset="full")
    engine = StreamEngine(model, ServingConfig(max_streams=4))
    graphs, sovits = engine.encoder_graphs, model.pipeline.sovits
    assert graphs is not None and engine.encoder_graphs_at_start == encoder_start_keys(
        engine.pipeline, engine.config, engine.encoder_graphs
    )
    g, a = torch.Generator().manual_seed(0), sovits.arch
    shapes = [(50, 40, 1.3), (25, 20, 1.3), (13, 70, 1.3), (75, 12, 1.1), (40, 33, 1.1), (25, 9, 1.0)]
    rows = [
        EncoderRow(i, torch.randint(0, a.n_bins, (t,), generator=g).to(cuda),
                   torch.randint(1, a.n_symbols, (p,), generator=g).to(cuda),
                   torch.randn(1, a.gin_channels, 1, generator=g).to(cuda, dtype), speed)
        for i, (t, p, speed) in enumerate(shapes)
    ]  # fmt: skip
    with torch.inference_mode():
        # one call a speed; the start set holds the common shapes only (no capture mid-round), so these first
        assert graphs.capture(
            [graphs.key(3, 50, 70, 1.3), graphs.key(2, 75, 33, 1.1), graphs.key(1, 25, 9, 1.0)]
        )
        got, calls = encode_rows(sovits, rows, graphs)
        want, _ = encode_rows(sovits, rows)  # eager: one padded call
        assert calls.replayed == len(rows) and calls.eager == {} and calls.calls == 3  # one replay a speed
        # fp32: the replay (a batch of the row bucket) and the eager call (one padded batch) run other cuDNN
        # convolutions, which may use TF32 (the H200 showed 1.7e-4 on a scale of 1)
        tol = 1e-3 if dtype == torch.float32 else 2e-2
        for i, (x, y) in enumerate(zip(got, want)):
            assert x.shape == y.shape, i
            err, scale = (x - y).abs().max().item(), max(1.0, y.abs().max().item())
            assert err <= tol * scale, (i, err, scale)
        # the replay is the eager step on the same static buffers: the same kernels, the same values
        key = graphs.key(3, 50, 70, 1.3)
        replayed = graphs.encode([(r.tokens, r.phones, r.ge) for r in rows[:3]], 1.3)
        eager = graphs._step(key)
        for i, x in enumerate(replayed):
            assert torch.equal(x, eager[i : i + 1, :, : x.shape[2]]), i
