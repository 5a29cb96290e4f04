"""What the stream engine (serving.py) captures when it starts, with the model's graph preset `full` or
`minimal`: a CUDA graph captured inside a round (a warm-up with its cuDNN plans, then the capture) stalls
every stream, so the shapes its batches take are captured before the first round. Other shapes are
captured on first use (`EngineStats.captures_in_rounds` counts them) or, for the encoder, run eagerly.
With `lazy`, `off` or no CUDA nothing is captured here.
"""

from __future__ import annotations

from itertools import islice
from typing import NamedTuple

import torch

from voicehub.models.gpt_sovits.acoustic_graphs import LOAD_SPEEDS
from voicehub.models.gpt_sovits.batch_acoustic import VocoderRows
from voicehub.models.gpt_sovits.encoder_graphs import EncoderRowGraphs, RowEncoderKey
from voicehub.models.gpt_sovits.pipeline import Pipeline
from voicehub.models.gpt_sovits.serving_config import ENGINE_LOAD_WINDOWS, ServingConfig
from voicehub.models.gpt_sovits.sovits.synth import T_REF
from voicehub.models.gpt_sovits.streaming import window_ends
from voicehub.models.gpt_sovits.window_shapes import cfm_piece_frames, feature_frames
from voicehub.runtime.cuda_graphs import GraphPreset
from voicehub.runtime.kv_cache import pick_bucket

AT_START = (GraphPreset.FULL, GraphPreset.MINIMAL)


class StartGraphs(NamedTuple):
    """The keys captured when the engine started: vocoder (rows, frames), encoder (rows, tokens,
    phonemes, speed), CFM (rows, frames) and the masked one-row vocoder graphs (1, frames, 'masked')."""

    vocoder: list[tuple[int, int]]
    encoder: list[RowEncoderKey]
    cfm: list[tuple[int, int]]
    masked: list[tuple[int, int, str]]


def engine_window_frames(
    hop: int, sample_rate: int, chunk_tokens: int, speed: float, bucket_frames: int, n_windows: int
) -> list[int]:
    """Frames of the first `n_windows` vocoder windows (none a sentence's last) of a long sentence in
    the stream engine (windows of `window_ends(chunk_tokens)`), as `VocoderRows` makes them: the lengths
    worth capturing. Nothing is vocoded."""
    rows = VocoderRows(hop, sample_rate, bucket_frames=bucket_frames)
    lengths: list[int] = []
    made = 0
    # a window each push once the first is long enough
    for end in islice(window_ends(chunk_tokens), 4 * n_windows + 1):
        if len(lengths) >= n_windows:
            break
        total = feature_frames(end, speed)
        window = rows.push(torch.zeros(1, 1, total - made), None)
        made = total
        if window is not None:
            lengths.append(window.n_frames)
    return lengths


def _first_windows(pipeline: Pipeline, config: ServingConfig) -> set[int]:
    """Frames of a long sentence's first ENGINE_LOAD_WINDOWS vocoder windows at LOAD_SPEEDS."""
    conf, bucket = pipeline.vocoder.conf, config.vocoder_bucket_frames
    return {
        n for speed in LOAD_SPEEDS for n in engine_window_frames(
            conf.hop_size, conf.sampling_rate, config.chunk_tokens, speed, bucket, ENGINE_LOAD_WINDOWS
        )
    }  # fmt: skip


def masked_start_keys(pipeline: Pipeline, config: ServingConfig) -> list[tuple[int, int, str]]:
    """The masked one-row vocoder graphs of every frame bucket up to the longest first window's: windows
    off the grid (a short sentence whole, a window with no history to grow into; every window with
    vocoder_bucket_frames 1) replay them."""
    graphs = pipeline.acoustic_graphs
    if graphs is None or graphs.preset not in AT_START:
        return []
    most = graphs.vocoder.masked_key(max(_first_windows(pipeline, config)))
    return [k for k in graphs.vocoder.masked_keys() if k[0] == 1 and k[1] <= most[1]]


def vocoder_start_shapes(pipeline: Pipeline, config: ServingConfig) -> list[tuple[int, int]]:
    """(rows, frames) vocoder graphs: with `full`, every row bucket of every grid length up to the longest
    of a long sentence's first ENGINE_LOAD_WINDOWS windows at the common chunk and speeds (a sentence's
    last window may take any of them); with `minimal` those windows' lengths only."""
    graphs, bucket = pipeline.acoustic_graphs, config.vocoder_bucket_frames
    if graphs is None or bucket == 1 or graphs.preset not in AT_START:
        return []
    windows = _first_windows(pipeline, config)
    lengths = windows if graphs.preset is GraphPreset.MINIMAL else range(bucket, max(windows) + 1, bucket)
    shapes = []
    for n in sorted(n for n in lengths if n % bucket == 0):
        rows = min(config.max_vocoder_batch, graphs.vocoder.rows_per_call(n))
        most, _ = graphs.vocoder.key(rows, n)  # the largest row bucket a call of n frames takes
        shapes += [(r, n) for r in graphs.vocoder.row_buckets if r <= most]
    return shapes


def encoder_start_keys(
    pipeline: Pipeline, config: ServingConfig, graphs: EncoderRowGraphs | None
) -> list[RowEncoderKey]:
    """(rows, tokens, phonemes, speed) encoder graphs: every shape of the engine's coarse buckets
    (encoder_graphs.py) up to its batches' rows, at LOAD_SPEEDS (other speeds run eagerly, 'not_captured')."""
    acoustic = pipeline.acoustic_graphs
    if graphs is None or acoustic is None or acoustic.preset not in AT_START:
        return []
    rows = graphs.row_buckets
    most = pick_bucket(min(config.max_cfm_batch, config.max_encoder_batch, rows[-1]), rows)
    return sorted(k for s in LOAD_SPEEDS for k in graphs.all_keys(s) if k[0] <= most)


def cfm_start_keys(pipeline: Pipeline, config: ServingConfig) -> list[tuple[int, int]]:
    """(rows, frames) CFM graphs at the fast preset's steps: every row bucket up to its CFM batches' rows,
    prompted by a reference of 5 s or more (T_REF frames), at the frames of a long sentence's first
    ENGINE_LOAD_WINDOWS pieces at the common speeds; with `full` every frame bucket from a piece of one new
    frame up to the largest of those (a sentence's last piece may take any of them)."""
    graphs = pipeline.acoustic_graphs
    if graphs is None or graphs.preset not in AT_START:
        return []
    rows = graphs.cfm.row_buckets
    most = pick_bucket(min(config.max_cfm_batch, rows[-1]), rows)
    pieces = {
        n for speed in LOAD_SPEEDS for n in cfm_piece_frames(T_REF, config.chunk_tokens, speed, ENGINE_LOAD_WINDOWS)
    }  # fmt: skip
    frames = {graphs.cfm.key(1, n)[1] for n in pieces}
    if graphs.preset is GraphPreset.FULL:
        frames = {f for f in graphs.cfm.frame_buckets if graphs.cfm.key(1, T_REF + 1)[1] <= f <= max(frames)}
    return sorted((r, f) for r in rows if r <= most for f in frames)


def capture_start_graphs(
    pipeline: Pipeline, config: ServingConfig, encoder_graphs: EncoderRowGraphs | None
) -> StartGraphs:
    """Capture the start sets (masked vocoder, vocoder, encoder, CFM) -> the keys held afterwards."""
    masked = masked_start_keys(pipeline, config)
    shapes = vocoder_start_shapes(pipeline, config)
    keys = encoder_start_keys(pipeline, config, encoder_graphs)
    cfm = cfm_start_keys(pipeline, config)
    acoustic = pipeline.acoustic_graphs
    masked_held = acoustic.capture_masked_vocoder(masked) if masked else []
    return StartGraphs(
        acoustic.capture_vocoder(shapes) if shapes else [],
        encoder_graphs.capture(keys) if keys else [],
        acoustic.capture_cfm(cfm) if cfm else [],
        masked_held,
    )
