"""Eager v3 acoustic path on tiny files: token-to-sample accounting, chunking, speed, determinism.

The reference mel is injected (random log-mel values): this path takes the mel as an input, and
voicehub/audio/mel.py computes it from audio in the pipeline.
"""

from __future__ import annotations

import pytest
import torch
from gpt_sovits_fixtures import random_reference, random_target

from voicehub.models.gpt_sovits.bigvgan import load_bigvgan, make_bigvgan_folder, vocode
from voicehub.models.gpt_sovits.sovits import (
    SAMPLES_PER_TOKEN,
    decode_mel,
    encode_reference,
    load_sovits_v3,
    make_sovits_checkpoint,
)
from voicehub.models.gpt_sovits.sovits.synth import T_CHUNK


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("synth")
    sovits = load_sovits_v3(make_sovits_checkpoint(d / "s2Gv3.pth", "tiny", seed=0))
    vocoder = load_bigvgan(make_bigvgan_folder(d / "bigvgan", "tiny", seed=0))
    return sovits, vocoder


def test_n_tokens_give_n_times_960_samples(models):
    sovits, vocoder = models
    prompt = random_reference(sovits)
    for n in (4, 20, 48):  # multiples of 4: 3.75 mel frames per token is then whole
        codes, phones = random_target(sovits, n)
        mel = decode_mel(
            sovits, prompt, codes, phones, sample_steps=2, generator=torch.Generator().manual_seed(0)
        )
        audio = vocode(vocoder, mel)
        assert audio.shape == (1, n * SAMPLES_PER_TOKEN)
        assert torch.isfinite(audio).all() and audio.std() > 1e-4
    # Otherwise the mel has floor(3.75 n) frames, as upstream's nearest interpolation gives.
    codes, phones = random_target(sovits, 21)
    assert decode_mel(sovits, prompt, codes, phones, 1).shape == (1, 100, 78)


def test_reference_prompt_is_trimmed_to_common_length(models):
    sovits, _ = models
    prompt = random_reference(sovits, n_tokens=40)
    assert prompt.fea.shape[2] == prompt.mel.shape[2] == 150  # floor(3.75 * 40) < mel frames
    long = random_reference(sovits, n_tokens=200)
    assert long.mel.shape[2] == 468  # at most T_REF prompt frames


def test_long_input_is_solved_in_chunks_and_joined(models, monkeypatch):
    sovits, _ = models
    prompt = random_reference(sovits)
    codes, phones = random_target(sovits, 300)  # 1125 frames > T_CHUNK - 150
    calls = []
    import voicehub.models.gpt_sovits.sovits.synth as synth

    real = synth.solve
    monkeypatch.setattr(
        synth,
        "solve",
        lambda est, mu, p, noise, n: calls.append((mu.shape[1], p.shape[2])) or real(est, mu, p, noise, n),
    )
    mel = decode_mel(sovits, prompt, codes, phones, 2, generator=torch.Generator().manual_seed(0))
    assert mel.shape == (1, 100, 1125) and torch.isfinite(mel).all()
    chunk = T_CHUNK - 150
    # Each call sees prompt + chunk; the second chunk is prompted by the first one's last 150 frames.
    assert calls == [(T_CHUNK, 150), (150 + 1125 - chunk, 150)]


def test_speed_changes_length_as_upstream(models):
    sovits, _ = models
    prompt = random_reference(sovits)
    codes, phones = random_target(sovits, 40)
    for speed in (1.3, 0.8):
        mel = decode_mel(sovits, prompt, codes, phones, 1, speed=speed)
        assert mel.shape[2] == int((int(80 / speed) + 1) * 1.875)


def test_same_seed_same_mel_and_other_seed_differs(models):
    sovits, _ = models
    prompt = random_reference(sovits)
    codes, phones = random_target(sovits, 24)
    run = lambda s: decode_mel(sovits, prompt, codes, phones, 4, generator=torch.Generator().manual_seed(s))  # noqa: E731
    assert torch.equal(run(1), run(1))
    assert not torch.allclose(run(1), run(2))


def test_reference_from_audio_through_voicehub_spectrograms(models):
    # The pipeline's reference features: 24 kHz log-mel for the prompt, 32 kHz linear spec for style.
    from voicehub.audio.mel import V3_MEL, MelSpectrogram, linear_spectrogram, norm_spec

    sovits, vocoder = models
    seconds = 1.6
    t24 = torch.arange(int(24000 * seconds)) / 24000
    t32 = torch.arange(int(32000 * seconds)) / 32000
    audio24 = 0.3 * torch.sin(2 * torch.pi * (180 + 90 * t24) * t24)
    audio32 = 0.3 * torch.sin(2 * torch.pi * (180 + 90 * t32) * t32)
    mel = MelSpectrogram(V3_MEL)(audio24)
    spec = linear_spectrogram(audio32, 2048, 640, 2048)
    n_ref = 40  # 1.6 s of 25 Hz tokens
    g = torch.Generator().manual_seed(3)
    prompt = encode_reference(
        sovits,
        torch.randint(0, sovits.arch.n_bins, (1, 1, n_ref), generator=g),
        torch.randint(1, 700, (1, 12), generator=g),
        spec,
        mel,
    )
    assert prompt.mel.shape[2] == min(mel.shape[2], 150)
    # encode_reference owns the normalisation: the prompt is norm_spec of the raw log-mel, applied once
    torch.testing.assert_close(prompt.mel, norm_spec(mel)[:, :, : prompt.mel.shape[2]])
    codes, phones = random_target(sovits, 16)
    audio = vocode(vocoder, decode_mel(sovits, prompt, codes, phones, 2))
    assert audio.shape == (1, 16 * SAMPLES_PER_TOKEN) and torch.isfinite(audio).all()
