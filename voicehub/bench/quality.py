"""The quality gate: a candidate's audio against the eager audio of the same text and seed.

Measured on the CPU from the audio a run returns: intelligibility (Whisper: WER, or CER for
Chinese/Japanese, against the input text), speaker similarity (resemblyzer's GE2E encoder),
loudness (pyloudnorm LUFS), clipping, duration and leading/trailing/internal silence. The
thresholds below were fixed before anything was measured; a report is accepted only when every
metric was measured and none regressed beyond them.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np

from voicehub.errors import MissingDependencyError, VoiceHubError

CLIP_LEVEL = 0.999  # |sample| at or above this counts as clipped
SILENT_PEAK = 1e-4  # a peak below this is silence, not speech
FRAME_S = 0.010  # seconds per frame of the silence analysis
SILENCE_DB = -40.0  # a frame is silent this many dB below the loudest frame
MIN_PAUSE_S = 0.050  # internal silence counts pauses at least this long
MIN_LOUDNESS_S = 0.4  # pyloudnorm's gating block: shorter audio has no integrated loudness
CER_LANGUAGES = frozenset({"zh", "ja", "yue"})  # scored by characters: no spaces between words
RESEMBLYZER_INSTALL = 'pip install "voicehub[quality]" && pip install --no-deps resemblyzer==0.1.4'


class InvalidAudioError(VoiceHubError, ValueError):
    """Audio that cannot be scored: empty, NaN/inf, silent or too short."""


@dataclass(frozen=True)
class QualityThresholds:
    """Fixed before measuring; loosening them makes evidence files invalid (see evidence.py)."""

    max_error_rate_increase: float = 0.02  # absolute WER/CER
    min_speaker_similarity: float = 0.98  # cosine of GE2E embeddings, candidate vs eager
    max_loudness_diff_lu: float = 0.5
    max_duration_diff_ratio: float = 0.02
    max_silence_diff_s: float = 0.100  # each of leading, trailing, internal
    max_new_clipped_samples: int = 0

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


GATE_THRESHOLDS = QualityThresholds()


def invalid_reason(audio: np.ndarray, sample_rate: int) -> str | None:
    """Why `audio` (float [n]) cannot be scored, or None."""
    if audio.ndim != 1:
        return f"audio must be mono [n], got shape {audio.shape}"
    if audio.size == 0:
        return "empty audio"
    if not np.isfinite(audio).all():
        return "audio holds NaN or infinite samples"
    if float(np.abs(audio).max()) < SILENT_PEAK:
        return "silent audio"
    if audio.size / sample_rate < MIN_LOUDNESS_S:
        return f"audio shorter than {MIN_LOUDNESS_S} s: loudness cannot be measured"
    return None


def silences(audio: np.ndarray, sample_rate: int) -> tuple[float, float, float]:
    """(leading, trailing, internal) silence in seconds; internal sums pauses >= MIN_PAUSE_S."""
    # audio: [n]
    hop = max(1, round(FRAME_S * sample_rate))
    n_frames = len(audio) // hop
    if n_frames == 0:
        return 0.0, 0.0, 0.0
    frames = audio[: n_frames * hop].astype(np.float64).reshape(n_frames, hop)
    rms = np.sqrt((frames**2).mean(axis=1)) + 1e-12
    voiced = 20 * np.log10(rms / rms.max()) >= SILENCE_DB
    idx = np.flatnonzero(voiced)
    first, last = int(idx[0]), int(idx[-1])
    leading = first * hop / sample_rate
    trailing = (len(audio) - (last + 1) * hop) / sample_rate
    internal, run = 0, 0
    for v in voiced[first : last + 1]:
        if v:
            internal += run if run * FRAME_S >= MIN_PAUSE_S else 0
            run = 0
        else:
            run += 1
    return leading, trailing, internal * hop / sample_rate


def loudness_lufs(audio: np.ndarray, sample_rate: int) -> float:
    """Integrated loudness (ITU-R BS.1770) in LUFS."""
    try:
        import pyloudnorm
    except ImportError as exc:
        raise MissingDependencyError('pyloudnorm is missing: pip install "voicehub[quality]"') from exc
    return float(pyloudnorm.Meter(sample_rate).integrated_loudness(audio.astype(np.float64)))


@dataclass(frozen=True)
class AudioMetrics:
    """What the gate measures on one audio; `invalid` says why it could not be measured."""

    duration_s: float
    invalid: str | None = None
    peak: float | None = None
    n_clipped: int | None = None
    loudness_lufs: float | None = None
    leading_silence_s: float | None = None
    trailing_silence_s: float | None = None
    internal_silence_s: float | None = None
    transcript: str | None = None
    error_rate: float | None = None

    @classmethod
    def measure(cls, audio: np.ndarray, sample_rate: int) -> AudioMetrics:
        """Signal metrics of float [n] audio (no ASR)."""
        audio = np.asarray(audio)
        why = invalid_reason(audio, sample_rate)
        if why is not None:
            return cls(duration_s=audio.size / sample_rate, invalid=why)
        lead, trail, internal = silences(audio, sample_rate)
        return cls(
            duration_s=audio.size / sample_rate,
            peak=float(np.abs(audio).max()),
            n_clipped=int((np.abs(audio) >= CLIP_LEVEL).sum()),
            loudness_lufs=loudness_lufs(audio, sample_rate),
            leading_silence_s=lead,
            trailing_silence_s=trail,
            internal_silence_s=internal,
        )


def error_metric(language: str) -> str:
    return "cer" if language.split("-")[0].lower() in CER_LANGUAGES else "wer"


def _signal_reasons(e: AudioMetrics, c: AudioMetrics, t: QualityThresholds) -> list[str]:
    reasons = []
    if abs(c.loudness_lufs - e.loudness_lufs) > t.max_loudness_diff_lu:
        reasons.append(
            f"loudness off by {abs(c.loudness_lufs - e.loudness_lufs):.2f} LU (> {t.max_loudness_diff_lu})"
        )
    if c.n_clipped - e.n_clipped > t.max_new_clipped_samples:
        reasons.append(f"new clipping: {c.n_clipped} clipped samples vs {e.n_clipped} in eager")
    ratio = abs(c.duration_s - e.duration_s) / e.duration_s
    if ratio > t.max_duration_diff_ratio:
        reasons.append(f"duration off by {100 * ratio:.1f}% (> {100 * t.max_duration_diff_ratio:.0f}%)")
    for name in ("leading", "trailing", "internal"):
        diff = abs(getattr(c, f"{name}_silence_s") - getattr(e, f"{name}_silence_s"))
        if diff > t.max_silence_diff_s:
            reasons.append(
                f"{name} silence changed by {1000 * diff:.0f} ms (> {1000 * t.max_silence_diff_s:.0f} ms)"
            )
    return reasons


@dataclass(frozen=True)
class QualityReport:
    """Candidate vs eager for one text and seed; `reasons` lists every rejection."""

    text: str
    language: str
    sample_rate: int
    eager: AudioMetrics
    candidate: AudioMetrics
    speaker_similarity: float | None
    thresholds: QualityThresholds = field(default=GATE_THRESHOLDS)

    @property
    def error_metric(self) -> str:
        return error_metric(self.language)

    def judge(self) -> tuple[str, ...]:
        """The reasons to reject, recomputed from the metrics and thresholds."""
        e, c, t = self.eager, self.candidate, self.thresholds
        if e.invalid:
            return (f"eager audio invalid: {e.invalid}",)
        if c.invalid:
            return (f"invalid audio: {c.invalid}",)
        reasons = _signal_reasons(e, c, t)
        if e.error_rate is None or c.error_rate is None:
            reasons.append("intelligibility not measured")
        elif c.error_rate - e.error_rate > t.max_error_rate_increase:
            reasons.append(
                f"{self.error_metric.upper()} up by {c.error_rate - e.error_rate:.3f} "
                f"({e.error_rate:.3f} -> {c.error_rate:.3f}; > {t.max_error_rate_increase})"
            )
        if self.speaker_similarity is None:
            reasons.append("speaker similarity not measured")
        elif self.speaker_similarity < t.min_speaker_similarity:
            reasons.append(f"speaker similarity {self.speaker_similarity:.3f} < {t.min_speaker_similarity}")
        return tuple(reasons)

    @property
    def reasons(self) -> tuple[str, ...]:
        return self.judge()

    @property
    def accepted(self) -> bool:
        return not self.judge()

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "language": self.language,
            "sample_rate": self.sample_rate,
            "error_metric": self.error_metric,
            "eager": asdict(self.eager),
            "candidate": asdict(self.candidate),
            "speaker_similarity": self.speaker_similarity,
            "thresholds": self.thresholds.to_dict(),
            "accepted": self.accepted,
            "reasons": list(self.reasons),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> QualityReport:
        return cls(
            text=d["text"],
            language=d["language"],
            sample_rate=int(d["sample_rate"]),
            eager=AudioMetrics(**d["eager"]),
            candidate=AudioMetrics(**d["candidate"]),
            speaker_similarity=d["speaker_similarity"],
            thresholds=QualityThresholds(**d["thresholds"]),
        )


class Transcribes(Protocol):
    def transcribe(self, audio: np.ndarray, sample_rate: int, language: str = "en") -> str: ...


class ComparesSpeakers(Protocol):
    def similarity(self, a: np.ndarray, b: np.ndarray, sample_rate: int) -> float: ...


class SpeakerEncoder:
    """resemblyzer's GE2E encoder on the CPU: cosine similarity of two utterances' embeddings."""

    def __init__(self) -> None:
        try:
            with warnings.catch_warnings():
                # resemblyzer imports scipy.ndimage.morphology, deprecated in SciPy: not our warning to show
                warnings.simplefilter("ignore", DeprecationWarning)
                from resemblyzer import VoiceEncoder, preprocess_wav
        except ImportError as exc:
            raise MissingDependencyError(
                f"speaker similarity needs resemblyzer: {RESEMBLYZER_INSTALL}"
            ) from exc
        self._preprocess = preprocess_wav
        self._encoder = VoiceEncoder("cpu", verbose=False)

    def embed(self, audio: np.ndarray, sample_rate: int) -> np.ndarray:
        """[256] unit-norm embedding of float [n] audio."""
        wav = self._preprocess(np.asarray(audio, np.float32), source_sr=sample_rate)
        return self._encoder.embed_utterance(wav)

    def similarity(self, a: np.ndarray, b: np.ndarray, sample_rate: int) -> float:
        ea, eb = self.embed(a, sample_rate), self.embed(b, sample_rate)
        return float(np.dot(ea, eb) / (np.linalg.norm(ea) * np.linalg.norm(eb)))


class QualityGate:
    """`QualityGate(language="en").compare(eager, candidate, sample_rate, text) -> QualityReport`.

    The transcriber (Whisper base) and speaker encoder load on first use; tests pass their own.
    """

    def __init__(
        self,
        language: str = "en",
        transcriber: Transcribes | None = None,
        speaker_encoder: ComparesSpeakers | None = None,
        thresholds: QualityThresholds = GATE_THRESHOLDS,
        whisper_size: str = "base",
    ) -> None:
        self.language = language
        self.thresholds = thresholds
        self._transcriber = transcriber
        self._speaker = speaker_encoder
        self._whisper_size = whisper_size

    def _score(self, audio: np.ndarray, sample_rate: int, text: str) -> tuple[str, float]:
        from voicehub.bench.asr import Transcriber, char_error_rate, word_error_rate

        if self._transcriber is None:
            self._transcriber = Transcriber(self._whisper_size)
        hyp = self._transcriber.transcribe(audio, sample_rate, language=self.language)
        rate = char_error_rate if error_metric(self.language) == "cer" else word_error_rate
        return hyp, rate(text, hyp)

    def measure(self, audio: np.ndarray, sample_rate: int, text: str) -> AudioMetrics:
        """Signal metrics plus transcript and error rate (none of these for invalid audio)."""
        metrics = AudioMetrics.measure(audio, sample_rate)
        if metrics.invalid:
            return metrics
        transcript, rate = self._score(np.asarray(audio, np.float32), sample_rate, text)
        return AudioMetrics(**{**asdict(metrics), "transcript": transcript, "error_rate": rate})

    def compare(self, eager: np.ndarray, candidate: np.ndarray, sample_rate: int, text: str) -> QualityReport:
        """Score `candidate` against `eager` (both float [n] at `sample_rate`, same text and seed).

        Raises InvalidAudioError when the eager audio itself cannot be scored.
        """
        e = self.measure(eager, sample_rate, text)
        if e.invalid:
            raise InvalidAudioError(f"the eager (reference) audio cannot be scored: {e.invalid}")
        c = self.measure(candidate, sample_rate, text)
        similarity = None
        if not c.invalid:
            if self._speaker is None:
                self._speaker = SpeakerEncoder()
            similarity = self._speaker.similarity(
                np.asarray(eager, np.float32), np.asarray(candidate, np.float32), sample_rate
            )
        return QualityReport(text, self.language, sample_rate, e, c, similarity, self.thresholds)
