"""The quality gate's measurements and thresholds, on synthetic audio with stand-in ASR and speaker
models (fast), plus one end-to-end check with Whisper and resemblyzer on the Piper voice."""

from __future__ import annotations

import numpy as np
import pytest

from voicehub.bench.quality import (
    GATE_THRESHOLDS,
    InvalidAudioError,
    QualityGate,
    QualityReport,
    silences,
)

RATE = 16_000
TEXT = "the cat sat on the mat"


def speechlike(seconds=2.0, pause=(0.9, 1.2), lead=0.2, trail=0.3, seed=0):
    """Harmonic bursts with a pause inside and silence at both ends: float32 [n]."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    x = sum(np.sin(2 * np.pi * f * t + rng.uniform(0, 6)) / k for k, f in enumerate((140, 280, 420, 900), 1))
    x *= 0.25 * (1 + 0.5 * np.sin(2 * np.pi * 4 * t))
    quiet = (t < lead) | (t >= seconds - trail) | ((t >= pause[0]) & (t < pause[1]))
    x[quiet] = 0.0
    return x.astype(np.float32)


class FakeTranscriber:
    def __init__(self, *heard):
        self.heard = list(heard)

    def transcribe(self, audio, sample_rate, language="en"):
        return self.heard.pop(0)


class FakeSpeaker:
    def __init__(self, value=0.999):
        self.value, self.calls = value, 0

    def similarity(self, a, b, sample_rate):
        self.calls += 1
        return self.value


def gate(eager_heard=TEXT, candidate_heard=TEXT, similarity=0.999, language="en"):
    return QualityGate(language, FakeTranscriber(eager_heard, candidate_heard), FakeSpeaker(similarity))


def test_silences_are_measured_where_they_were_made():
    lead, trail, internal = silences(speechlike(), RATE)
    assert lead == pytest.approx(0.2, abs=0.011)
    assert trail == pytest.approx(0.3, abs=0.011)
    assert internal == pytest.approx(0.3, abs=0.021)


def test_identical_audio_is_accepted():
    x = speechlike()
    report = gate().compare(x, x.copy(), RATE, TEXT)
    assert report.accepted and report.reasons == ()
    assert report.eager.loudness_lufs == report.candidate.loudness_lufs


def test_small_changes_within_thresholds_are_accepted():
    x = speechlike()
    y = x * 10 ** (0.2 / 20) + 1e-4 * np.random.default_rng(1).standard_normal(x.size).astype(np.float32)
    assert gate().compare(x, y.astype(np.float32), RATE, TEXT).accepted


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda x: x * 10 ** (1.0 / 20), "loudness off"),
        (lambda x: np.clip(x * 3, -1, 1), "new clipping"),
        (lambda x: np.concatenate([x, np.zeros(int(0.06 * x.size), np.float32)]), "duration off"),
        (lambda x: np.roll(x, int(0.15 * RATE)), "leading silence changed"),
        (lambda x: np.roll(x, -int(0.15 * RATE)), "trailing silence changed"),
        (
            lambda x: np.concatenate(
                [
                    x[: int(0.5 * RATE)],
                    np.zeros(int(0.15 * RATE), np.float32),
                    x[int(0.5 * RATE) : -int(0.15 * RATE)],
                ]
            ),
            "internal silence changed",
        ),
    ],
)
def test_signal_regressions_are_rejected_with_reasons(make, reason):
    x = speechlike()
    report = gate().compare(x, make(x).astype(np.float32), RATE, TEXT)
    assert not report.accepted
    assert any(r.startswith(reason) for r in report.reasons), report.reasons


def test_intelligibility_regression_uses_wer_for_english_and_cer_for_japanese():
    x = speechlike()
    report = gate(candidate_heard="the cat sat on the hat").compare(x, x, RATE, TEXT)
    assert report.error_metric == "wer" and report.candidate.error_rate == pytest.approx(1 / 6)
    assert any(r.startswith("WER up by 0.167") for r in report.reasons)
    ja = "今日はいい天気です"
    report = gate(ja, "今日はいい天気でず", language="ja").compare(x, x, RATE, ja)
    assert report.error_metric == "cer" and report.candidate.error_rate == pytest.approx(1 / 9)
    assert any(r.startswith("CER up") for r in report.reasons)
    # a tiny change is within 0.02 absolute
    long_text = " ".join(["word"] * 60)
    ok = gate(long_text, " ".join(["word"] * 59 + ["bird"])).compare(x, x, RATE, long_text)
    assert ok.accepted, ok.reasons


def test_low_speaker_similarity_is_rejected():
    x = speechlike()
    report = gate(similarity=0.97).compare(x, x, RATE, TEXT)
    assert report.reasons == ("speaker similarity 0.970 < 0.98",)


@pytest.mark.parametrize(
    ("candidate", "why"),
    [
        (np.array([], np.float32), "empty"),
        (np.full(RATE, np.nan, np.float32), "NaN"),
        (np.zeros(2 * RATE, np.float32), "silent"),
        (speechlike()[: int(0.3 * RATE)], "shorter than"),
    ],
)
def test_invalid_candidate_audio_is_rejected_without_scoring_it(candidate, why):
    speaker = FakeSpeaker()
    g = QualityGate("en", FakeTranscriber(TEXT), speaker)
    report = g.compare(speechlike(), candidate, RATE, TEXT)
    assert not report.accepted and len(report.reasons) == 1 and why in report.reasons[0]
    assert speaker.calls == 0 and report.speaker_similarity is None


def test_invalid_eager_audio_raises():
    with pytest.raises(InvalidAudioError, match="eager"):
        gate().compare(np.zeros(RATE, np.float32), speechlike(), RATE, TEXT)


def test_unmeasured_metrics_are_not_accepted():
    x = speechlike()
    report = gate().compare(x, x, RATE, TEXT)
    d = report.to_dict()
    d["speaker_similarity"] = None
    assert QualityReport.from_dict(d).reasons == ("speaker similarity not measured",)


def test_report_round_trips_and_recomputes_reasons():
    x = speechlike()
    report = gate(similarity=0.5).compare(x, x * 0.5, RATE, TEXT)
    d = report.to_dict()
    assert d["thresholds"] == GATE_THRESHOLDS.to_dict() and d["accepted"] is False
    again = QualityReport.from_dict(d)
    assert again == report and list(again.reasons) == d["reasons"]


@pytest.mark.asr
def test_real_gate_on_the_piper_voice(transcriber):
    """Whisper + resemblyzer: the same seed is accepted; slower speech is rejected for its duration."""
    pytest.importorskip("resemblyzer", reason="speaker similarity needs resemblyzer (see the quality extra)")
    from voicehub.hub import AutoModelForTextToSpeech

    model = AutoModelForTextToSpeech.from_pretrained()
    text = "Please call me back when you have a moment to talk about the weather."
    eager = model.generate(text, seed=7)
    again = model.generate(text, seed=7)
    slow = model.generate(text, seed=7, length_scale=1.15)
    g = QualityGate("en", transcriber=transcriber)
    same = g.compare(eager.audio, again.audio, eager.sample_rate, text)
    assert same.accepted, same.reasons
    assert same.speaker_similarity >= 0.98 and same.eager.error_rate <= 0.1
    slower = g.compare(eager.audio, slow.audio, eager.sample_rate, text)
    assert any(r.startswith("duration off") for r in slower.reasons)
    assert slower.speaker_similarity > 0.8  # the same voice, only slower
