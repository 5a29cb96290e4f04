"""VITS streaming: the first chunk comes early, chunks join into generate()'s audio without clicks,
and the windowed latent decode matches the one-shot decode."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from voicehub.models.vits import load, resolve
from voicehub.models.vits.streaming import decode_windows, plan_windows

THREE_SENTENCES = "Good morning. The weather is fine today. See you soon."
LONG_SENTENCE = "The decoder cuts this one sentence into several windows."
STREAM_TOL = (
    1e-3  # max abs difference between joined chunks and generate() (cross-fades of near-equal signals)
)
MIN_SNR_DB = 30.0
SMALL = {"window_frames": 24, "context_frames": 8, "crossfade_frames": 2}  # many joins in a short text


@pytest.fixture(scope="module")
def joe():
    return load(resolve("en_US-joe-medium"))


def _snr_db(ref: np.ndarray, test: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref**2) / max(np.sum((ref - test) ** 2), 1e-20)))


def test_first_chunk_before_the_rest_is_synthesized(joe, monkeypatch):
    calls = {"latent": 0, "decode": 0}
    net = joe.network
    latent, decode = net.latent, net.decode

    def counting_latent(*args, **kwargs):
        calls["latent"] += 1
        return latent(*args, **kwargs)

    def counting_decode(*args, **kwargs):
        calls["decode"] += 1
        return decode(*args, **kwargs)

    monkeypatch.setattr(net, "latent", counting_latent)
    monkeypatch.setattr(net, "decode", counting_decode)
    stream = joe.stream(THREE_SENTENCES, seed=1, **SMALL)
    assert calls == {"latent": 0, "decode": 0}  # nothing is made before it is asked for
    first = next(stream)
    assert calls["latent"] == 1 and calls["decode"] == 1  # one sentence's latent, one window decoded
    assert first.index == 0 and not first.is_last and first.text == "Good morning."
    rest = list(stream)
    assert calls["latent"] == 3 and calls["decode"] == len(rest) + 1


def test_chunks_join_into_generate(joe):
    kwargs = {"seed": 3, "sentence_silence": 0.1, **SMALL}
    chunks = list(joe.stream(THREE_SENTENCES, **kwargs))
    whole = joe.generate(THREE_SENTENCES, **kwargs).audio
    joined = np.concatenate([c.audio for c in chunks])
    assert joined.shape == whole.shape
    assert np.abs(joined - whole).max() <= STREAM_TOL
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert [c.is_last for c in chunks] == [False] * (len(chunks) - 1) + [True]
    starts = np.cumsum([0] + [len(c.audio) for c in chunks[:-1]]) / joe.sample_rate
    np.testing.assert_allclose([c.start_s for c in chunks], starts)
    assert {c.text for c in chunks} == {"Good morning.", "The weather is fine today.", "See you soon."}
    assert all(c.phonemes and c.audio.dtype == np.float32 and c.sample_rate == 22050 for c in chunks)


def _clicks(audio: np.ndarray, joins: np.ndarray, sample_rate: int) -> list[bool]:
    """A join clicks when its sample step is over 3x the median step of the 20 ms around it and
    also the largest step there (speech alone often steps past 3x the median, never as an outlier
    exactly at every join)."""
    half = int(0.010 * sample_rate)
    flags = []
    for j in joins:
        steps = np.abs(np.diff(audio[j - half : j + half]))
        jump = abs(float(audio[j]) - float(audio[j - 1]))
        flags.append(jump > max(3 * float(np.median(steps)), float(np.delete(steps, half - 1).max())))
    return flags


def test_no_clicks_at_joins(joe):
    chunks = list(joe.stream(LONG_SENTENCE, seed=5, **SMALL))
    assert len(chunks) >= 4
    audio = np.concatenate([c.audio for c in chunks])
    joins = np.cumsum([len(c.audio) for c in chunks[:-1]])
    assert not any(_clicks(audio, joins, joe.sample_rate))
    # The detector does catch bad joins: windows decoded without context or cross-fade click.
    naive = list(joe.stream(LONG_SENTENCE, seed=5, window_frames=24, context_frames=0, crossfade_frames=0))
    naive_joins = np.cumsum([len(c.audio) for c in naive[:-1]])
    assert sum(_clicks(np.concatenate([c.audio for c in naive]), naive_joins, joe.sample_rate)) >= 3


@pytest.fixture(scope="module")
def latent_and_one_shot(joe):
    """A sentence's latent z [1, C, T] and its one-shot decode."""
    from voicehub.models.vits.config import VitsParams

    (sentence,) = list(joe.phonemize(LONG_SENTENCE))
    with torch.inference_mode():
        z = joe._latent(sentence, VitsParams.build(joe.voice), None, torch.Generator().manual_seed(11))
        return z, joe.network.decode(z)[0].numpy()


@pytest.mark.parametrize(("window", "context", "crossfade"), [(48, 24, 2), (16, 4, 2)])
def test_windowed_decode_matches_one_shot(joe, latent_and_one_shot, window, context, crossfade):
    z, one_shot = latent_and_one_shot
    hop = joe.architecture.hop_length
    with torch.inference_mode():
        pieces = [a for a, _ in decode_windows(joe.network.decode, z, hop, window, context, crossfade)]
    windowed = np.concatenate(pieces)
    assert len(pieces) == len(plan_windows(z.shape[2], window, crossfade)) > 1
    assert windowed.shape == one_shot.shape
    assert _snr_db(one_shot, windowed) >= MIN_SNR_DB


def test_windowed_decode_without_context_falls_short(joe, latent_and_one_shot):
    """Control: with no context frames the windows' zero-padded edges cost far more than 30 dB."""
    z, one_shot = latent_and_one_shot
    with torch.inference_mode():
        windowed = np.concatenate([a for a, _ in decode_windows(joe.network.decode, z, 256, 16, 0, 0)])
    assert _snr_db(one_shot, windowed) < MIN_SNR_DB


def test_plan_windows_covers_every_frame():
    for n in (1, 7, 16, 17, 40, 100):
        plan = plan_windows(n, 16, 2)
        assert plan[0][0] == 0 and plan[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(plan, plan[1:]))
        assert all(e - s >= min(n, 2) for s, e in plan)
