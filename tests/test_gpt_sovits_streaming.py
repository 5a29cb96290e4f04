"""Sub-sentence streaming of GPT-SoVITS v3 (streaming.py) on the tiny `make-checkpoint` set, CPU.

Vocoder chunking is held to one-shot vocoding of the same mel (SNR); joins are measured with the click
meter on tonal mel; the streamed chain is held to the per-sentence path's length, yields its first chunk
before the sentence's later windows go through the CFM or the vocoder, and makes that chunk >= 0.25 s.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
import torch
import torch.nn.functional as F
from gpt_sovits_fixtures import REFERENCE_TEXT, reference_wav, tiny_set, write_signal  # noqa: F401

from voicehub.audio.fades import max_join_jump
from voicehub.audio.mel import V3_MEL, MelSpectrogram
from voicehub.models.gpt_sovits import Voice, load
from voicehub.models.gpt_sovits.bigvgan import vocode
from voicehub.models.gpt_sovits.params import GptSovitsParams
from voicehub.models.gpt_sovits.streaming import MIN_FIRST_S, VocoderStream, decode_steps, token_windows
from voicehub.models.gpt_sovits.t2s import StopReason, decode
from voicehub.text.options import Language

SR = 24000
MIN_SNR_DB = 30.0  # issue 4: joined vocoder output vs one-shot vocoding
MAX_JUMP = 3.0  # issue 4: largest step at a join / median step of the surrounding 20 ms


@pytest.fixture(scope="module")
def model(tiny_set):  # noqa: F811
    return load(tiny_set)


@pytest.fixture(scope="module")
def voice(reference_wav):  # noqa: F811
    return Voice(reference_wav, REFERENCE_TEXT, "en")


@pytest.fixture(scope="module")
def tonal_mel(tmp_path_factory) -> torch.Tensor:
    """Log-mel [1, 100, T] of 2 s of harmonics of 140 Hz (tonal content for the click meter)."""
    path = write_signal(tmp_path_factory.mktemp("tonal") / "tone.wav", 2.0)
    wav, rate = sf.read(path, dtype="float32")
    assert rate == SR
    return MelSpectrogram(V3_MEL)(torch.from_numpy(wav)[None])


def _snr_db(ref: np.ndarray, test: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref**2) / np.sum((ref - test) ** 2)))


def _stream_mel(vocoder, mel: torch.Tensor, sizes: list[int]) -> tuple[np.ndarray, list[int]]:
    voc = VocoderStream(vocoder)
    pieces, start = [], 0
    for k, n in enumerate(sizes):
        pieces.append(voc.push(mel[:, :, start : start + n], is_last=k == len(sizes) - 1))
        start += n
    assert start == mel.shape[2]
    return np.concatenate(pieces), voc.joiner.joins


@pytest.mark.parametrize("sizes", [[40, 40, 40, 40, 27], [100, 7, 7, 7, 66], [60, 127]])
def test_vocoder_chunks_match_one_shot(model, tonal_mel, sizes):
    vocoder = model.pipeline.vocoder
    mel = tonal_mel[:, :, : sum(sizes)]
    whole = vocode(vocoder, mel)[0].float().numpy()
    joined, joins = _stream_mel(vocoder, mel, sizes)
    assert joined.shape == whole.shape  # exact length
    assert len(joins) >= 1
    assert _snr_db(whole, joined) >= MIN_SNR_DB


def test_vocoder_joins_do_not_click(model, tonal_mel):
    vocoder = model.pipeline.vocoder
    joined, joins = _stream_mel(vocoder, tonal_mel[:, :, :180], [30, 30, 30, 30, 30, 30])
    assert len(joins) >= 3
    jumps = max_join_jump(joined, joins, SR)
    assert np.all(jumps <= MAX_JUMP), jumps


class ToneVocoder(torch.nn.Module):
    """A translation-equivariant stand-in with tonal output: mel channel 0 (+ 12: positive) held per frame,
    smoothed by a lopsided 512-sample mean (384 samples of left context, 127 of right, zero-padded like a
    conv vocoder's edges), times a 187.5 Hz sine whose 128-sample period divides the hop, so a chunk
    vocoded from any frame lines up. The tiny random BigVGAN's output is noise-like, where the click
    meter says little; the lopsided window makes an edge without context a step, as a real vocoder's can."""

    conf = SimpleNamespace(hop_size=256, sampling_rate=SR)

    def __init__(self):
        super().__init__()
        self.conv_pre = torch.nn.Conv1d(1, 1, 1)  # only its dtype and device are read (vocode)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        # mel: [1, 100, T] -> [1, 1, T * 256]
        held = (mel[:, :1] + 12).repeat_interleave(256, dim=2)
        envelope = F.conv1d(F.pad(held, (384, 127)), torch.full((1, 1, 512), 1 / 512))
        n = torch.arange(envelope.shape[-1])
        return 0.02 * envelope * torch.sin(2 * torch.pi * n / 128 + 1.3)  # joins fall near a crest


def test_joins_do_not_click_on_tonal_output(tonal_mel):
    vocoder = ToneVocoder()
    mel = tonal_mel[:, :, :180]
    sizes = [30] * 6
    joined, joins = _stream_mel(vocoder, mel, sizes)
    whole = vocode(vocoder, mel)[0].numpy()
    assert _snr_db(whole, joined) >= MIN_SNR_DB
    assert np.all(max_join_jump(joined, joins, SR) <= MAX_JUMP)
    # The meter catches the naive way: each chunk vocoded alone and butted together.
    naive = np.concatenate([vocode(vocoder, mel[:, :, i : i + 30])[0].numpy() for i in range(0, 180, 30)])
    assert np.all(max_join_jump(naive, [256 * i for i in range(30, 180, 30)], SR) > MAX_JUMP)


@pytest.mark.parametrize("n_frames", [3, 20])
def test_short_mel_in_one_push_is_one_shot(model, tonal_mel, n_frames):
    vocoder = model.pipeline.vocoder
    mel = tonal_mel[:, :, :n_frames]  # 3 frames: one token, shorter than the cross-fade
    audio = VocoderStream(vocoder).push(mel, is_last=True)
    assert np.array_equal(audio, vocode(vocoder, mel)[0].float().numpy())


def test_first_vocoder_chunk_is_long_enough(model, tonal_mel):
    voc = VocoderStream(model.pipeline.vocoder)
    assert len(voc.push(tonal_mel[:, :, :10])) == 0  # too short for the first chunk: held
    first = voc.push(tonal_mel[:, :, 10:40])
    assert len(first) >= MIN_FIRST_S * SR


def test_token_windows_cover_all_tokens():
    for n, k in [(1, 8), (8, 8), (9, 8), (13, 8), (40, 10), (41, 10)]:
        windows = token_windows(n, k)
        assert windows[0][0] == 0 and windows[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(windows, windows[1:]))
        assert all(e - s >= 1 for s, e in windows)


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


def test_first_chunk_before_rest_of_sentence(model, voice):
    pipe = model.pipeline
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
    assert at_first[2] <= 2 * 12 + 1  # the first chunk came from the first windows' tokens, not all 60
    assert len(rest) >= 2 and rest[-1][1]
    whole = pipe.synthesize_sentence(ref, sentence, params, seed=1).audio
    assert len(first) + sum(len(a) for a, _ in rest) == len(whole)


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
        t2s = copy.deepcopy(t2s)
        head = torch.nn.Linear(*reversed(t2s.ar_predict_layer.weight.shape))
        with torch.no_grad():
            head.weight.copy_(t2s.ar_predict_layer.weight)
            head.bias.zero_()
            head.bias[t2s.config.eos] = 4.0  # EOS becomes likely, not certain
        t2s.ar_predict_layer = head
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


def test_stream_chunk_tokens_is_validated():
    with pytest.raises(ValueError, match="stream_chunk_tokens"):
        GptSovitsParams.build("balanced", stream_chunk_tokens=2)
    with pytest.raises(ValueError, match="stream_chunk_tokens"):
        GptSovitsParams.build("balanced", stream_chunk_tokens=True)
    assert GptSovitsParams.build("balanced").stream_chunk_tokens is None


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["off", "lazy"])  # off: step-wise eager T2S; lazy: graph decoder, windowed
def test_cuda_fp16_stream_matches_per_sentence_length(tiny_set, reference_wav, preset):  # noqa: F811
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    model = load(tiny_set, device="cuda", cuda_graph_preset=preset)  # float16 by default on CUDA
    voice = Voice(reference_wav, REFERENCE_TEXT, "en")
    values = dict(voice=voice, seed=5, speed=1.0, force_n_tokens=60, how_to_cut="none")
    whole = model.generate("One sentence on the GPU.", **values).audio
    chunks = list(model.stream("One sentence on the GPU.", **values, stream_chunk_tokens=12))
    assert len(chunks) > 2 and len(chunks[0].audio) >= MIN_FIRST_S * SR
    streamed = np.concatenate([c.audio for c in chunks])
    assert streamed.shape == whole.shape and np.isfinite(streamed).all()
    mel = torch.randn(1, 100, 150, device="cuda") - 6  # vocoder chunking alone, in fp16
    one_shot = vocode(model.pipeline.vocoder, mel)[0].float().cpu().numpy()
    joined, _ = _stream_mel(model.pipeline.vocoder, mel, [40, 40, 40, 30])
    assert _snr_db(one_shot, joined) >= MIN_SNR_DB
