"""The stream engine's configuration (`ServingConfig`) and counters (`EngineStats`); serving.py runs it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from voicehub.models.gpt_sovits.batch_acoustic import EncoderCalls, VocoderCalls

# Vocoder windows of the default windows (25, 50, then 100 tokens; engine_window_frames) with their left
# context and lookahead: a sentence's first 73 / 86 / 93 frames at the fast preset's speed 1.3, balanced's
# 1.1 and 1.0, its second 180 / 206 / 224, then 325 / 378 / 411, its last any. Multiples of 32 make them
# 64 (first windows end early), 192 / 256 / 256, 352 / 384 / 416: a few (rows, length) graphs serve every
# window, for <= 10% more vocoded frames on the steady windows.
VOCODER_BUCKET_FRAMES = 32
ENGINE_LOAD_WINDOWS = 4  # a long sentence's first windows whose lengths the engine captures at start


@dataclass(frozen=True)
class ServingConfig:
    """Engine sizes and policy. max_streams: T2S rows (streams decoding at once); max_queue: requests
    waiting for a row before `submit` raises QueueFullError; chunk_tokens: the first window of a request
    that gives no stream_chunk_tokens (later ones grow: streaming.window_ends); max_cfm_batch /
    max_vocoder_batch / max_encoder_batch: rows per CFM / vocoder / SoVITS encoder call (max_encoder_batch
    1: the encoder per stream, `decode_encp` itself); urgent_s: slack under which a stream gets another
    CFM batch in the same round (and its vocoder windows run now); vocoder_bucket_frames: vocoder windows
    grow (by left context) to a multiple of this, so more share a call and a graph (1: the windows' own
    lengths, each on the masked one-row graph of its frame bucket; see VOCODER_BUCKET_FRAMES);
    hold_vocoder: vocoder windows of streams more than urgent_s from running dry wait (across rounds)
    for others to share their call, until max_vocoder_batch wait or one is urgent (False: each CFM
    batch's windows are vocoded right after it); stop_check_interval: T2S steps per round."""

    max_streams: int = 64
    max_queue: int = 64
    chunk_tokens: int = 25
    max_cfm_batch: int = 16
    max_encoder_batch: int = 64
    max_vocoder_batch: int = 32
    urgent_s: float = 0.5
    vocoder_bucket_frames: int = VOCODER_BUCKET_FRAMES
    hold_vocoder: bool = True
    stop_check_interval: int = 8

    def __post_init__(self) -> None:
        for name in (
            "max_streams",
            "chunk_tokens",
            "max_cfm_batch",
            "max_vocoder_batch",
            "max_encoder_batch",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"ServingConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.vocoder_bucket_frames < 1 or self.stop_check_interval < 1:
            raise ValueError("ServingConfig: vocoder_bucket_frames and stop_check_interval must be >= 1")
        if self.max_queue < 0 or self.urgent_s < 0:
            raise ValueError("ServingConfig: max_queue and urgent_s must be >= 0")


SLOW_ROUND_S = 0.1  # a round longer than this counts in EngineStats.slow_rounds


@dataclass
class EngineStats:
    """Counters since the engine was built (seconds are host time; a CUDA stage is timed to its sync).
    vocoder_calls / vocoder_rows: calls and windows; vocoder_replayed: windows replayed from graphs
    (vocoder_padded_rows: zero rows padding them to a row bucket; vocoder_off_grid: windows of a length
    off the bucket grid, replayed one a call); vocoder_eager: windows run eagerly, by reason (see
    batch_acoustic.VocoderCalls); vocoder_flushes: times held windows were vocoded. encoder_calls /
    encoder_rows: SoVITS encoder calls (graph replays and eager calls) and rows; encoder_replayed: rows
    replayed from graphs (encoder_padded_rows: zero rows padding them to a row bucket); encoder_eager:
    rows run eagerly, by reason (see batch_acoustic.EncoderCalls). round_s_max: the longest round;
    slow_rounds: rounds longer than SLOW_ROUND_S; captures_in_rounds: CUDA graphs captured inside rounds
    (first uses of the acoustic stage's and the engine encoder's shapes: each stalls every stream)."""

    rounds: int = 0
    round_s_max: float = 0.0
    slow_rounds: int = 0
    captures_in_rounds: int = 0
    t2s_s: float = 0.0
    cfm_calls: int = 0
    cfm_rows: int = 0
    cfm_s: float = 0.0
    vocoder_calls: int = 0
    vocoder_rows: int = 0
    vocoder_s: float = 0.0
    vocoder_replayed: int = 0
    vocoder_padded_rows: int = 0
    vocoder_off_grid: int = 0
    vocoder_eager: dict[str, int] = field(default_factory=dict)
    vocoder_flushes: int = 0
    encoder_calls: int = 0
    encoder_rows: int = 0
    encoder_s: float = 0.0  # the encoder call and the CFM pieces' preparation
    encoder_replayed: int = 0
    encoder_padded_rows: int = 0
    encoder_eager: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {k: dict(v) if isinstance(v, dict) else v for k, v in vars(self).items()}

    def add_vocoder(self, calls: VocoderCalls, n_rows: int) -> None:
        self.vocoder_calls += calls.calls
        self.vocoder_rows += n_rows
        self.vocoder_replayed += calls.replayed
        self.vocoder_padded_rows += calls.padded_rows
        self.vocoder_off_grid += calls.off_grid
        for reason, n in calls.eager.items():
            self.vocoder_eager[reason] = self.vocoder_eager.get(reason, 0) + n

    def add_encoder(self, calls: EncoderCalls, n_rows: int) -> None:
        self.encoder_calls += calls.calls
        self.encoder_rows += n_rows
        self.encoder_replayed += calls.replayed
        self.encoder_padded_rows += calls.padded_rows
        for reason, n in calls.eager.items():
            self.encoder_eager[reason] = self.encoder_eager.get(reason, 0) + n
