"""The pieces of GPT-SoVITS v3's sub-sentence streaming (streaming.py) below the pipeline, on the tiny
`make-checkpoint` set, CPU.

Vocoder chunking (`VocoderStream`) is held to one-shot vocoding of the same mel (SNR); joins are measured
with the click meter on tonal mel; the token windows (`window_ends`, `stepwise_windows`) do not depend on
how the tokens arrive. The streamed chain through the pipeline is in test_gpt_sovits_streaming.py.
"""

from __future__ import annotations

from itertools import islice
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
import torch
import torch.nn.functional as F
from gpt_sovits_fixtures import write_signal
from gpt_sovits_streaming_fixtures import MIN_SNR_DB, SR, snr_db, stream_mel

from voicehub.audio.fades import max_join_jump
from voicehub.audio.mel import V3_MEL, MelSpectrogram
from voicehub.models.gpt_sovits.bigvgan import vocode
from voicehub.models.gpt_sovits.params import GptSovitsParams
from voicehub.models.gpt_sovits.streaming import (
    MAX_WINDOW_TOKENS,
    MIN_FIRST_S,
    VocoderStream,
    stepwise_windows,
    window_ends,
)

MAX_JUMP = 3.0  # issue 4: largest step at a join / median step of the surrounding 20 ms


@pytest.fixture(scope="module")
def tonal_mel(tmp_path_factory) -> torch.Tensor:
    """Log-mel [1, 100, T] of 2 s of harmonics of 140 Hz (tonal content for the click meter)."""
    path = write_signal(tmp_path_factory.mktemp("tonal") / "tone.wav", 2.0)
    wav, rate = sf.read(path, dtype="float32")
    assert rate == SR
    return MelSpectrogram(V3_MEL)(torch.from_numpy(wav)[None])


@pytest.mark.parametrize("sizes", [[40, 40, 40, 40, 27], [100, 7, 7, 7, 66], [60, 127]])
def test_vocoder_chunks_match_one_shot(model, tonal_mel, sizes):
    vocoder = model.pipeline.vocoder
    mel = tonal_mel[:, :, : sum(sizes)]
    whole = vocode(vocoder, mel)[0].float().numpy()
    joined, joins = stream_mel(vocoder, mel, sizes)
    assert joined.shape == whole.shape  # exact length
    assert len(joins) >= 1
    assert snr_db(whole, joined) >= MIN_SNR_DB


def test_vocoder_joins_do_not_click(model, tonal_mel):
    vocoder = model.pipeline.vocoder
    joined, joins = stream_mel(vocoder, tonal_mel[:, :, :180], [30, 30, 30, 30, 30, 30])
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
    joined, joins = stream_mel(vocoder, mel, sizes)
    whole = vocode(vocoder, mel)[0].numpy()
    assert snr_db(whole, joined) >= MIN_SNR_DB
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


def test_windows_do_not_depend_on_batching():
    tokens = torch.arange(37)
    for chunk in (4, 12, 37, 40):
        one_by_one = list(stepwise_windows(tokens.split(1), chunk))
        for size in (3, 8, 16, 37):
            windows = list(stepwise_windows(tokens.split(size), chunk))
            assert [(w.tolist(), f) for w, f in windows] == [(w.tolist(), f) for w, f in one_by_one]
        ends = [len(w) for w, _ in one_by_one]
        assert ends == [*(e for e in islice(window_ends(chunk), 10) if e <= 37), 37]
        assert [f for _, f in one_by_one][-1] and not any(f for _, f in one_by_one[:-1])


def test_windows_double_after_the_first_up_to_the_largest():
    assert list(islice(window_ends(25), 6)) == [25, 75, 175, 275, 375, 475]  # 25, 50, 100, 100, ...
    assert list(islice(window_ends(4, largest=10), 5)) == [4, 12, 22, 32, 42]
    assert list(islice(window_ends(120), 3)) == [120, 240, 360]  # a first window over the largest stays
    assert list(islice(window_ends(25), 3))[-1] == MAX_WINDOW_TOKENS + 75
    with pytest.raises(ValueError, match="window"):
        next(window_ends(0))


def test_stream_chunk_tokens_is_validated():
    with pytest.raises(ValueError, match="stream_chunk_tokens"):
        GptSovitsParams.build("balanced", stream_chunk_tokens=2)
    with pytest.raises(ValueError, match="stream_chunk_tokens"):
        GptSovitsParams.build("balanced", stream_chunk_tokens=True)
    assert GptSovitsParams.build("balanced").stream_chunk_tokens is None
