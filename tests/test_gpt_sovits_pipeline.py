"""The GPT-SoVITS v3 eager pipeline end to end on a tiny `make-checkpoint` set, loaded by the user's loaders.

Random weights speak no words; these tests check the chain's accounting and contracts: token counts
-> sample counts, seeds -> identical tokens and audio, streaming order, the reference cache, LoRA.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gpt_sovits_fixtures import REFERENCE_TEXT

from voicehub.models.gpt_sovits import Voice, load
from voicehub.models.gpt_sovits.params import GptSovitsParams
from voicehub.models.gpt_sovits.pipeline import ensure_final_mark
from voicehub.models.gpt_sovits.sovits import SAMPLES_PER_TOKEN
from voicehub.text.options import Language

SR = 24000
EXACT = dict(speed=1.0, force_n_tokens=8)  # speed 1.0: one token is exactly 960 samples


def _params(**values) -> GptSovitsParams:
    return GptSovitsParams.build("balanced", **values)


@pytest.mark.parametrize(
    "text, language",
    [("Hello there, my friend.", "en"), ("你好，今天天气很好。", "zh"), ("こんにちは、世界の皆さん。", "ja")],
)
def test_three_languages_make_n_times_960_samples(model, voice, text, language):
    chunks = list(model.stream(text, voice=voice, seed=3, text_language=language, how_to_cut="none", **EXACT))
    assert len(chunks) == 1 and chunks[0].is_last and chunks[0].sample_rate == SR
    audio = chunks[0].audio
    assert audio.dtype == np.float32 and audio.shape == (8 * SAMPLES_PER_TOKEN,)
    assert np.isfinite(audio).all() and audio.std() > 1e-4 and np.abs(audio).max() <= 1.0
    assert chunks[0].phonemes  # the phonemes the decoder read


def test_bert_features_only_for_chinese(model):
    pipe = model.pipeline
    zh = pipe.text_features("你好，世界。", Language.ALL_ZH)
    en = pipe.text_features("Hello, world.", Language.EN)
    assert zh.bert.shape == (1024, len(zh.phone_ids)) and zh.bert.abs().sum() > 0
    assert en.bert.shape == (1024, len(en.phone_ids)) and en.bert.abs().sum() == 0


@pytest.mark.parametrize("n", [4, 12, 20])
def test_forced_tokens_to_samples(model, voice, n):
    pipe = model.pipeline
    ref = pipe.reference(voice)
    sentence = pipe.text_features("A short test sentence.", Language.EN)
    out = pipe.synthesize_sentence(ref, sentence, _params(speed=1.0, force_n_tokens=n), seed=0)
    assert out.tokens.shape == (n,) and out.stop_reason == "forced"
    assert len(out.audio) == n * SAMPLES_PER_TOKEN


def test_tokens_not_a_multiple_of_4_give_floor_of_3_75_frames(model, voice):
    pipe = model.pipeline
    sentence = pipe.text_features("A short test sentence.", Language.EN)
    out = pipe.synthesize_sentence(pipe.reference(voice), sentence, _params(speed=1.0, force_n_tokens=10), 0)
    assert len(out.audio) == int(3.75 * 10) * 256  # 37 mel frames of 256 samples


def test_speed_changes_length(model, voice):
    pipe = model.pipeline
    sentence = pipe.text_features("A short test sentence.", Language.EN)
    ref = pipe.reference(voice)
    slow = pipe.synthesize_sentence(ref, sentence, _params(speed=1.0, force_n_tokens=16), 0)
    fast = pipe.synthesize_sentence(ref, sentence, _params(speed=1.3, force_n_tokens=16), 0)
    assert torch.equal(slow.tokens, fast.tokens) and len(fast.audio) < len(slow.audio)


def test_same_seed_same_tokens_and_audio(model, voice):
    pipe = model.pipeline
    ref = pipe.reference(voice)
    sentence = pipe.text_features("Seeds make this repeatable.", Language.EN)
    params = _params(max_new_tokens=24)  # sampled decoding with EOS allowed, capped for CPU time
    a = pipe.synthesize_sentence(ref, sentence, params, seed=11)
    b = pipe.synthesize_sentence(ref, sentence, params, seed=11)
    c = pipe.synthesize_sentence(ref, sentence, params, seed=12)
    assert torch.equal(a.tokens, b.tokens) and np.array_equal(a.audio, b.audio)
    assert not torch.equal(a.tokens, c.tokens)
    # The hub face: the same seed gives the same utterance; another seed another one.
    kw = dict(voice=voice, text_language="en", force_n_tokens=8)
    one = model.generate("First part. Second part.", seed=5, **kw).audio
    two = model.generate("First part. Second part.", seed=5, **kw).audio
    other = model.generate("First part. Second part.", seed=6, **kw).audio
    assert np.array_equal(one, two) and not np.array_equal(one, other)


def test_stream_chunks_are_sentences_and_join_to_generate(model, voice):
    text = "One sentence here. Another one there, and a third!"
    kw = dict(voice=voice, seed=9, text_language="en", how_to_cut="punctuation", pause_s=0.3, **EXACT)
    chunks = list(model.stream(text, **kw))
    sentences = model.pipeline.sentences(text, _params(text_language="en", how_to_cut="punctuation"))
    assert [c.text for c in chunks] == sentences and len(chunks) == 3
    assert [c.index for c in chunks] == [0, 1, 2] and [c.is_last for c in chunks] == [False, False, True]
    pause = round(0.3 * SR)
    offset = 0
    for c in chunks:
        assert c.start_s == pytest.approx(offset / SR)
        expected = 8 * SAMPLES_PER_TOKEN + (0 if c.is_last else pause)
        assert len(c.audio) == expected
        if not c.is_last:
            assert not c.audio[-pause:].any()  # the pause between sentences is silence
        offset += len(c.audio)
    joined = np.concatenate([c.audio for c in chunks])
    assert np.array_equal(joined, model.generate(text, **kw).audio)


def test_first_sentence_is_finished_before_the_next_is_decoded(model, voice, monkeypatch):
    pipe = model.pipeline
    decoded = []
    real = pipe.decode_tokens
    monkeypatch.setattr(pipe, "decode_tokens", lambda *a, **k: decoded.append(a[1].text) or real(*a, **k))
    chunks = model.stream(
        "First sentence. Second sentence.", voice=voice, seed=1, text_language="en", **EXACT
    )
    first = next(chunks)
    assert decoded == [first.text] and len(first.audio) > 0
    rest = list(chunks)
    assert len(decoded) == 2 and rest[-1].is_last


def test_reference_is_computed_once_per_voice(model, voice, monkeypatch):
    pipe = model.pipeline
    pipe.reference(voice)  # warm
    calls = []
    real = pipe.prompt_tokens
    monkeypatch.setattr(pipe, "prompt_tokens", lambda ref: calls.append(ref) or real(ref))
    hits = pipe.cache.hits
    for _ in range(2):
        model.generate("Cache me.", voice=voice, seed=0, text_language="en", force_n_tokens=4)
    assert calls == [] and pipe.cache.hits == hits + 2
    # Another transcript of the same audio is another reference (its phonemes prompt the decoder).
    other = Voice(voice.ref_audio_path, "A different transcript.", "en")
    pipe.reference(other)
    assert len(calls) == 1


def test_prompt_tokens_follow_upstream_padding_and_rate(model, voice):
    from voicehub.models.gpt_sovits.reference import load_reference_audio

    ref_audio = load_reference_audio(voice.ref_audio_path)
    tokens = model.pipeline.reference(voice).prompt_tokens
    n = len(ref_audio.wav16k) + 9600  # upstream appends int(32000 * 0.3) zeros at 16 kHz
    hubert_frames = (n - 400) // 320 + 1  # 50 Hz HuBERT frames
    assert tokens.shape == (hubert_frames // 2,)  # 25 Hz semantic tokens
    assert tokens.dtype == torch.long and 0 <= int(tokens.min()) and int(tokens.max()) < 1024


def test_reference_convolutions_run_without_cudnn(model, voice, monkeypatch):
    """On CUDA a reference's convolutions go through ATen (no cuDNN plan for a length seen once): the
    mode's path, run on the CPU here, takes every 1-d convolution of the reference (HuBERT's, the SoVITS
    quantizer's projection, the style encoder's, the SoVITS encoder's) with cuDNN off, same features."""
    from torch import nn
    from torch.overrides import TorchFunctionMode

    from voicehub.runtime import eager_conv

    class CountConvs(TorchFunctionMode):
        n = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.n += func is torch.conv1d
            return func(*args, **(kwargs or {}))

    pipe = model.pipeline
    text = ensure_final_mark(voice.prompt_text, Language.EN)
    with CountConvs() as plain:
        want = pipe._compute_reference(voice.ref_audio_path, text, Language.EN)
    routed = []  # each conv1d that the mode sent to ATen's torch._convolution (with cuDNN off)
    real = torch._convolution
    monkeypatch.setattr(eager_conv.torch, "_convolution", lambda *a: routed.append(a) or real(*a))
    monkeypatch.setattr(eager_conv, "DEVICE_TYPES", ("cuda", "cpu"))
    got = pipe._compute_reference(voice.ref_audio_path, text, Language.EN)
    hubert_convs = sum(isinstance(m, nn.Conv1d) for m in pipe.hubert.modules())
    assert plain.n > hubert_convs and len(routed) == plain.n
    assert torch.equal(got.prompt_tokens, want.prompt_tokens)
    for name in ("ge", "fea", "mel"):
        a, b = getattr(got.acoustic, name), getattr(want.acoustic, name)
        assert a.shape == b.shape and torch.allclose(a, b, rtol=1e-5, atol=1e-6), name


def test_prompt_text_gets_a_final_mark(model, voice):
    assert ensure_final_mark("hello there", Language.EN) == "hello there."
    assert ensure_final_mark("你好", Language.ALL_ZH) == "你好。"
    assert ensure_final_mark("already done!", Language.EN) == "already done!"
    assert model.pipeline.reference(voice).prompt_text == REFERENCE_TEXT


def test_lora_set_merges_into_the_base(tiny_set, voice):
    base = load(tiny_set, sovits_path=tiny_set / "pretrained_models" / "s2Gv3.pth")
    lora = load(tiny_set, sovits_path=tiny_set / "lora" / "sovits_lora.pth")
    key = "cfm.estimator.transformer_blocks.0.attn.to_q.weight"
    base_sd, lora_sd = base.pipeline.sovits.state_dict(), lora.pipeline.sovits.state_dict()
    assert not torch.equal(base_sd[key], lora_sd[key])  # LoRA factors merged
    codebook = "quantizer.vq.layers.0._codebook.embed"
    assert torch.equal(base_sd[codebook], lora_sd[codebook])  # frozen in LoRA training: from the base
    kw = dict(voice=voice, seed=2, text_language="en", **EXACT)
    a, b = base.generate("The same words.", **kw).audio, lora.generate("The same words.", **kw).audio
    assert a.shape == b.shape == (8 * SAMPLES_PER_TOKEN,) and not np.array_equal(a, b)


def test_decoder_gets_prompt_then_sentence(model, voice, monkeypatch):
    """Upstream: phones1 + phones2, bert1 + bert2 along phonemes, the reference's tokens as prompt."""
    import voicehub.models.gpt_sovits.pipeline as pipeline_module

    pipe = model.pipeline
    seen = {}
    real = pipeline_module.decode

    def spy(t2s, phone_ids, bert, prompt, sampling):
        seen.update(phone_ids=phone_ids, bert=bert, prompt=prompt, sampling=sampling)
        return real(t2s, phone_ids, bert, prompt, sampling)

    monkeypatch.setattr(pipeline_module, "decode", spy)
    ref = pipe.reference(voice)
    sentence = pipe.text_features("你好，世界。", Language.ALL_ZH)
    pipe.synthesize_sentence(ref, sentence, _params(force_n_tokens=4, top_k=7), seed=42)
    assert seen["phone_ids"].tolist() == ref.phone_ids + sentence.phone_ids
    assert torch.equal(seen["bert"], torch.cat([ref.bert, sentence.bert], dim=1))
    assert seen["bert"][:, : len(ref.phone_ids)].abs().sum() == 0  # English prompt: zeros
    assert seen["bert"][:, len(ref.phone_ids) :].abs().sum() > 0  # Chinese sentence: BERT features
    assert seen["prompt"] is ref.prompt_tokens
    s = seen["sampling"]
    assert (s.seed, s.top_k, s.force_n_tokens, s.max_new_tokens, s.repetition_penalty) == (
        42,
        7,
        4,
        None,
        1.35,
    )
