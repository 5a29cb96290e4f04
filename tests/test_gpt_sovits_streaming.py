"""Sub-sentence streaming of GPT-SoVITS v3 (streaming.py) through the pipeline, on the tiny
`make-checkpoint` set, CPU.

The streamed chain is held to the per-sentence path's length, yields its first chunk before the
sentence's later windows go through the CFM or the vocoder (and before T2S has decoded it), and makes
that chunk >= 0.25 s. Both T2S paths stream: the eager reference step by step, and the static/graph
decoder's `decode_iter` (here its eager twin, preset off), which gives the same audio. GPU tests (marker
`gpu`) stream on CUDA. The vocoder's chunking and the token windows are in
test_gpt_sovits_streaming_vocoder.py.
"""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
import torch
from gpt_sovits_fixtures import REFERENCE_TEXT
from gpt_sovits_streaming_fixtures import MIN_SNR_DB, SR, snr_db, stream_mel

from voicehub.models.gpt_sovits import Voice, load
from voicehub.models.gpt_sovits.bigvgan import vocode
from voicehub.models.gpt_sovits.params import GptSovitsParams
from voicehub.models.gpt_sovits.pipeline import Pipeline, sentence_seed
from voicehub.models.gpt_sovits.streaming import MIN_FIRST_S, decode_steps
from voicehub.models.gpt_sovits.t2s import StaticDecodeConfig, StopReason, decode
from voicehub.models.gpt_sovits.t2s.runner import T2SGraphDecoder
from voicehub.text.options import Language


def with_static_decoder(pipe: Pipeline, t2s=None) -> Pipeline:
    """The same components with T2S decoded by the graph decoder's eager twin (preset off): the path a
    CUDA model with graphs takes, step for step, on the CPU."""
    t2s = t2s if t2s is not None else pipe.t2s
    decoder = T2SGraphDecoder(t2s, StaticDecodeConfig.for_checkpoint(t2s.config), preset="off")
    return Pipeline(
        pipe.frontend, pipe.hubert, pipe.bert, t2s, pipe.sovits, pipe.vocoder, pipe.device, pipe.dtype,
        pipe.cache, pipe.model_id, decoder,
    )  # fmt: skip


@pytest.fixture(scope="module")
def static_pipe(model) -> Pipeline:
    return with_static_decoder(model.pipeline)


def _params(**values) -> GptSovitsParams:
    return GptSovitsParams.build("balanced", speed=1.0, force_n_tokens=60, **values)


@pytest.mark.parametrize("speed, n_tokens", [(1.0, 60), (1.3, 60), (1.0, 1)])
def test_streamed_sentence_has_per_sentence_length(model, voice, speed, n_tokens):
    text = "A longer sentence for the stream. And a second one."
    values = dict(voice=voice, seed=5, speed=speed, force_n_tokens=n_tokens, pause_s=0.1)
    whole = list(model.stream(text, **values))
    streamed = list(model.stream(text, **values, stream_chunk_tokens=12))
    assert len(whole) == 2 and len(streamed) >= 2 + (n_tokens > 12)
    assert sum(len(c.audio) for c in streamed) == sum(len(c.audio) for c in whole)
    assert [c.index for c in streamed] == list(range(len(streamed)))
    assert [c.is_last for c in streamed] == [False] * (len(streamed) - 1) + [True]
    starts = np.cumsum([0] + [len(c.audio) for c in streamed[:-1]]) / SR
    assert np.allclose([c.start_s for c in streamed], starts)
    audio = np.concatenate([c.audio for c in streamed])
    assert np.isfinite(audio).all() and np.abs(audio).max() <= 1.0 and audio.std() > 1e-4


class _Counter:
    """Wraps a module's forward and counts calls (the chain's progress, not wall time)."""

    def __init__(self, module: torch.nn.Module):
        self.n = 0
        self._forward = module.forward
        module.forward = self

    def __call__(self, *args, **kwargs):
        self.n += 1
        return self._forward(*args, **kwargs)


@pytest.mark.parametrize("path", ["eager", "static"])
def test_first_chunk_before_rest_of_sentence(model, static_pipe, voice, path):
    pipe = model.pipeline if path == "eager" else static_pipe
    ref = pipe.reference(voice)
    sentence = pipe.text_features("One sentence, streamed in windows.", Language.EN)
    params = _params(stream_chunk_tokens=12)
    modules = (pipe.vocoder, pipe.sovits.cfm.estimator, pipe.t2s.ar_predict_layer)
    counters = [_Counter(m) for m in modules]  # vocoder calls, CFM solver steps, T2S decode steps
    try:
        pieces = pipe.stream_sentence(ref, sentence, params, seed=1)
        first, is_final = next(pieces)
        at_first = [c.n for c in counters]
        rest = list(pieces)
    finally:
        for m in modules:
            del m.forward
    assert not is_final and len(first) >= MIN_FIRST_S * SR
    assert at_first[0] == 1  # one vocoder call made the first chunk
    assert all(c.n > n for c, n in zip(counters, at_first))  # vocoder, CFM and T2S all continue after it
    # The first chunk came from the first window's tokens (static: up to the stop check after 12), not all 60.
    assert at_first[2] <= 2 * 12 + 1
    assert len(rest) >= 2 and rest[-1][1]
    whole = pipe.synthesize_sentence(ref, sentence, params, seed=1).audio
    assert len(first) + sum(len(a) for a, _ in rest) == len(whole)


def eos_likely(t2s, bias: float = 4.0):
    """A copy of the T2S model whose head adds `bias` to EOS: EOS becomes likely, not certain
    (tiny random weights never choose it)."""
    t2s = copy.deepcopy(t2s)
    head = torch.nn.Linear(*reversed(t2s.ar_predict_layer.weight.shape))
    with torch.no_grad():
        head.weight.copy_(t2s.ar_predict_layer.weight)
        head.bias.zero_()
        head.bias[t2s.config.eos] = bias
    t2s.ar_predict_layer = head
    return t2s


@pytest.mark.parametrize(
    "values, expect",
    [
        (dict(force_n_tokens=24, stream_chunk_tokens=8), StopReason.FORCED),  # sampled, EOS suppressed
        (dict(force_n_tokens=20, stream_chunk_tokens=5, top_k=1, repetition_penalty=1.0), StopReason.FORCED),
        (dict(max_new_tokens=20, stream_chunk_tokens=12), StopReason.MAX_TOKENS),  # stream keeps token 0
        (dict(eos_bias=True, max_new_tokens=120, stream_chunk_tokens=4), StopReason.EOS),
    ],
)
def test_static_decoder_stream_equals_eager_stream(model, voice, values, expect):
    """decode_iter's windows give the eager step-wise stream's audio, sample for sample (CPU, fp32)."""
    values = dict(values)
    pipe = model.pipeline
    t2s = eos_likely(pipe.t2s, bias=8.0) if values.pop("eos_bias", False) else pipe.t2s
    eager = Pipeline(pipe.frontend, pipe.hubert, pipe.bert, t2s, pipe.sovits, pipe.vocoder, pipe.device,
                     pipe.dtype, pipe.cache, pipe.model_id)  # fmt: skip
    static = with_static_decoder(eager)
    values.update(speed=1.0, pause_s=0.1, seed=3, sample_steps=2)  # 2 CFM steps: a quick test
    params = GptSovitsParams.build("balanced", **values)
    text = "Through the static decoder. Again."
    got, want = list(static.stream(text, voice, params)), list(eager.stream(text, voice, params))
    assert len(got) == len(want) >= 3  # two sentences, one at least in two chunks
    for a, b in zip(got, want):
        assert np.array_equal(a.audio, b.audio) and (a.index, a.is_last, a.text) == (
            b.index,
            b.is_last,
            b.text,
        )
    ref = static.reference(voice)
    for index, sentence in enumerate(static.sentences(text, params)):
        features = static.text_features(sentence, params.text_language)
        result = static.decode_tokens(ref, features, params, sentence_seed(3, index))
        assert result.stop_reason == expect and len(set(result.tokens.tolist())) > 1
    if expect != StopReason.MAX_TOKENS:  # on the cap a stream speaks one token more (decode_iter)
        whole = static.stream(
            text, voice, GptSovitsParams.build("balanced", **{**values, "stream_chunk_tokens": None})
        )
        assert sum(len(c.audio) for c in got) == sum(len(c.audio) for c in whole)


def test_streams_interleaved_on_one_thread_share_the_decoder(static_pipe, voice, caplog):
    """A stream suspended mid-sentence holds the graph decoder; a second stream on the same thread decodes
    eagerly (logged) instead of waiting for itself, and closing the first frees the decoder."""
    params = GptSovitsParams.build(  # windows end at 8, 24, 56: the first chunk leaves at 24 of 40 tokens
        "balanced", force_n_tokens=40, stream_chunk_tokens=8, sample_steps=2, seed=2
    )
    text = "One sentence held mid-way by its stream."
    first = static_pipe.stream(text, voice, params)
    next(first)
    assert static_pipe._t2s_lock.locked()
    with caplog.at_level(logging.WARNING, logger="voicehub.models.gpt_sovits"):
        second = list(static_pipe.stream(text, voice, params))
    assert "decoding this sentence eagerly" in caplog.text
    rest = list(first)
    assert not static_pipe._t2s_lock.locked()  # the stream ended: the decoder is free again
    assert sum(len(c.audio) for c in second) > 0 and len(rest) >= 1
    abandoned = static_pipe.stream(text, voice, params)
    next(abandoned)
    abandoned.close()  # a client that leaves mid-sentence
    assert not static_pipe._t2s_lock.locked()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="voicehub.models.gpt_sovits"):
        again = list(static_pipe.stream(text, voice, params))
    assert "eagerly" not in caplog.text
    assert [len(c.audio) for c in again] == [len(c.audio) for c in second]  # same tokens on both T2S paths


@pytest.mark.parametrize(
    "values",
    [
        dict(force_n_tokens=40, expect="forced"),  # sampled, EOS suppressed
        dict(force_n_tokens=30, top_k=1, temperature=1.0, repetition_penalty=1.0, expect="forced"),  # greedy
        dict(max_new_tokens=25, expect="max_tokens"),  # the cap (random tiny weights do not choose EOS)
        dict(eos_bias=True, expect="eos"),  # EOS made likely: a stop on EOS
    ],
)
def test_stepwise_decode_gives_eager_tokens(model, voice, values):
    values = dict(values)
    expect = values.pop("expect")
    pipe = model.pipeline
    t2s = pipe.t2s
    if values.pop("eos_bias", False):
        t2s = eos_likely(t2s)
    ref = pipe.reference(voice)
    sentence = pipe.text_features("Tokens one step at a time.", Language.EN)
    params = GptSovitsParams.build("balanced", **values)
    phone_ids = torch.tensor(ref.phone_ids + sentence.phone_ids)
    bert = torch.cat([ref.bert, sentence.bert], dim=1)
    seen = set()
    for seed in (0, 7):
        eager = decode(t2s, phone_ids, bert, ref.prompt_tokens, params.sampling(seed))
        steps = torch.cat(list(decode_steps(t2s, phone_ids, bert, ref.prompt_tokens, params.sampling(seed))))
        seen.add(eager.stop_reason)
        if eager.stop_reason == StopReason.MAX_TOKENS:
            assert torch.equal(steps[1:], eager.tokens)  # the documented difference: the stream keeps token 0
        else:
            assert torch.equal(steps, eager.tokens)
    assert seen == {expect}


@pytest.mark.gpu
@pytest.mark.parametrize(
    "preset", ["off", "lazy", "full"]
)  # off: step-wise eager T2S; else decode_iter on graphs
def test_cuda_fp16_stream_matches_per_sentence_length(tiny_set, reference_wav, preset):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    model = load(tiny_set, device="cuda", cuda_graph_preset=preset)  # float16 by default on CUDA
    voice = Voice(reference_wav, REFERENCE_TEXT, "en")
    values = dict(voice=voice, seed=5, speed=1.0, force_n_tokens=60, how_to_cut="none")
    whole = model.generate("One sentence on the GPU.", **values).audio
    decoder = model.pipeline.t2s_decoder
    assert (decoder is None) == (preset == "off")
    steps = []
    if decoder is not None:  # count graph replays: the step's modules are not called on a replay
        replay = decoder.step
        decoder.step = lambda *args: (steps.append(args), replay(*args))
    try:
        chunks = model.stream("One sentence on the GPU.", **values, stream_chunk_tokens=12)
        first = next(chunks)
        n_at_first = len(steps)
        chunks = [first, *chunks]
    finally:
        if decoder is not None:
            del decoder.step
    if decoder is not None:  # the first chunk left once a window's 12th token was drawn, not after 60
        assert (n_at_first + 1) % 12 == 0 and n_at_first < len(steps)  # the prefill drew token 1
    assert len(chunks) > 2 and len(chunks[0].audio) >= MIN_FIRST_S * SR
    streamed = np.concatenate([c.audio for c in chunks])
    assert streamed.shape == whole.shape and np.isfinite(streamed).all()
    mel = torch.randn(1, 100, 150, device="cuda") - 6  # vocoder chunking alone, in fp16
    one_shot = vocode(model.pipeline.vocoder, mel)[0].float().cpu().numpy()
    joined, _ = stream_mel(model.pipeline.vocoder, mel, [40, 40, 40, 30])
    assert snr_db(one_shot, joined) >= MIN_SNR_DB


@pytest.mark.parametrize("path", ["stream", "engine_rows"])
def test_eager_encoder_runs_without_cudnn(model, voice, monkeypatch, path):
    """The eager SoVITS encoder calls at shapes no graph holds (the streamed chain without graphs, the
    stream engine's eager rows) run every convolution through `aten_convolutions` (on CUDA: no cuDNN
    plan per new shape), with the same output; the CFM's DiT and BigVGAN keep cuDNN (ATen is slower
    there: conv_plan_probe_h200.json). On the CPU the mode is off unless DEVICE_TYPES names it; named,
    ATen runs the same CPU kernels."""
    from voicehub.models.gpt_sovits.batch_acoustic import EncoderRow, encode_rows
    from voicehub.runtime import eager_conv

    pipe = model.pipeline
    ref = pipe.reference(voice)
    sentence = pipe.text_features("Convolutions at a new length.", Language.EN)
    params = _params(stream_chunk_tokens=12)
    phones = torch.tensor(sentence.phone_ids)
    rows = [
        EncoderRow(i, torch.arange(n) % 50, phones[: 5 + n], ref.acoustic.ge, 1.0)
        for i, n in enumerate((9, 14))
    ]

    def run() -> list[np.ndarray]:
        if path == "stream":
            return [a for a, _ in pipe.stream_sentence(ref, sentence, params, seed=3)]
        return [f.numpy() for f in encode_rows(pipe.sovits, rows)[0]]

    want = run()
    where = {"encoder": [], "other": []}

    def hook(kind):
        def seen(*_):  # each convolution module's call: inside the mode or not
            modes = torch.overrides._get_current_function_mode_stack()
            where[kind].append(any(isinstance(m, eager_conv.AtenConvolutions) for m in modes))

        return seen

    cfm = set(pipe.sovits.cfm.modules())
    hooks = [
        m.register_forward_hook(hook("other" if m in cfm or owner is pipe.vocoder else "encoder"))
        for owner in (pipe.sovits, pipe.vocoder)
        for m in owner.modules()
        if isinstance(m, torch.nn.Conv1d | torch.nn.ConvTranspose1d)
    ]
    aten = []
    real = torch._convolution
    monkeypatch.setattr(torch, "_convolution", lambda *a: aten.append(a[11]) or real(*a))
    monkeypatch.setattr(eager_conv, "DEVICE_TYPES", ("cuda", "cpu"))
    try:
        got = run()
    finally:
        for h in hooks:
            h.remove()
    assert len(where["encoder"]) > 10 and all(where["encoder"])
    assert not any(where["other"]) and (path != "stream" or len(where["other"]) > 10)
    assert len(aten) >= len(where["encoder"]) and not any(aten)  # cudnn_enabled False, each call
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
