"""The acoustic half of the stream engine's round (serving.py): encoder, CFM and vocoder batches.

`AcousticRoundMixin` holds `StreamEngine`'s methods for step 3 of serving.py's round: which ready
streams share a CFM batch (most urgent first), their encoder rows in padded calls, and when held
vocoder windows are vocoded. It is a mixin, not an object of its own, because every step reads and
ends the engine's runs (`_runs`, `_end`) and counts into its stats; the engine owns that state.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING

import torch

from voicehub.models.gpt_sovits.batch_acoustic import (
    CfmPiece,
    EncoderRow,
    VocoderWindow,
    encode_rows,
    solve_pieces,
    vocode_windows,
)

if TYPE_CHECKING:
    from voicehub.models.gpt_sovits.encoder_graphs import EncoderRowGraphs
    from voicehub.models.gpt_sovits.pipeline import Pipeline
    from voicehub.models.gpt_sovits.serving_config import EngineStats, ServingConfig
    from voicehub.models.gpt_sovits.serving_stream import StreamRun

log = logging.getLogger("voicehub.models.gpt_sovits")  # the engine's logger: serving.py's


class AcousticRoundMixin:
    """CFM batches, encoder rows and vocoder flushes of `StreamEngine`'s round. The engine provides
    the attributes below, `_end(run, error)` (take a run out and end its stream) and `_has_t2s_work()`."""

    config: ServingConfig
    pipeline: Pipeline
    stats: EngineStats
    encoder_graphs: EncoderRowGraphs | None
    recent_cfm_batches: deque[tuple[int, ...]]
    _runs: list[StreamRun]  # admitted
    _held: list[VocoderWindow]  # vocoder windows waiting to share a call

    def _acoustic(self) -> None:
        self._cfm_batches()
        self._flush_vocoder(force=not self._has_t2s_work())  # no T2S work: nothing more to wait for

    def _cfm_batches(self) -> None:
        n_batches = 0
        while True:
            now = time.perf_counter()
            ready = sorted((r for r in self._runs if r.is_acoustic_ready), key=lambda r: r.priority)
            if not ready:
                return
            head = ready[0]
            if self._has_t2s_work() and not head.is_urgent(now, self.config.urgent_s):
                # T2S has work and nothing here is urgent: one batch keeps the buffers growing, none
                # while a new stream still waits for the tokens of its first window
                if n_batches or any(r.stream.first_chunk_at is None for r in self._runs):
                    return
            steps = head.sample_steps
            batch = [r for r in ready if r.sample_steps == steps][: self.config.max_cfm_batch]
            self._run_batch(batch)
            n_batches += 1

    def _run_batch(self, runs: list[StreamRun]) -> None:
        """One CFM call for `runs` (those whose window needs none just flush); their vocoder windows join
        the held ones, vocoded now or later (`_flush_vocoder`)."""
        windows: list[VocoderWindow] = []
        pieces: list[CfmPiece] = []
        t0 = time.perf_counter()
        features = self._encode(runs)
        for run in runs:
            if run not in self._runs:  # its encoder row failed
                continue
            try:
                piece = run.prepare_piece(windows, features.get(run))
            except Exception as error:
                self._end(run, error)
                continue
            if piece is not None:
                pieces.append(piece)
        self.stats.encoder_s += time.perf_counter() - t0
        if pieces:
            t0 = time.perf_counter()
            try:
                mels = solve_pieces(self.pipeline.sovits.cfm.estimator, pieces, self.pipeline.acoustic_graphs)
            except Exception as error:
                log.exception("CFM batch of %d rows failed; its streams fail", len(pieces))
                for piece in pieces:
                    self._end(piece.owner, error)
                return
            self.stats.cfm_calls += 1
            self.stats.cfm_rows += len(pieces)
            self.recent_cfm_batches.append(tuple(p.owner.stream.id for p in pieces))
            for piece, mel in zip(pieces, mels):
                piece.owner.absorb_piece(mel, windows)
            self.stats.cfm_s += time.perf_counter() - t0
        for run in runs:  # tails that needed no vocoder call
            self._emit_ready(run)
        self._held += windows
        self._flush_vocoder(force=False)  # a first chunk's window goes now, with every window held

    def _encode(self, runs: list[StreamRun]) -> dict[StreamRun, torch.Tensor]:
        """The SoVITS encoder of every run whose next window is due, in padded calls -> features."""
        rows: list[EncoderRow] = []
        for run in runs:
            try:
                row = run.encoder_row()
            except Exception as error:
                self._end(run, error)
                continue
            if row is not None:
                rows.append(row)
        if not rows:
            return {}
        out: dict[StreamRun, torch.Tensor] = {}
        size = self.config.max_encoder_batch
        for chunk in (rows[lo : lo + size] for lo in range(0, len(rows), size)):
            try:
                features, calls = encode_rows(self.pipeline.sovits, chunk, self.encoder_graphs)
            except Exception as error:
                log.exception("SoVITS encoder batch of %d rows failed; its streams fail", len(chunk))
                for row in chunk:
                    self._end(row.owner, error)
                continue
            self.stats.add_encoder(calls, len(chunk))
            out.update((row.owner, fea) for row, fea in zip(chunk, features))
        return out

    def _flush_vocoder(self, force: bool) -> None:
        """Vocode the held windows (of streams still running), batched by length, when forced, not
        holding, max_vocoder_batch are held, or one's stream is urgent (no chunk yet, or under urgent_s
        from running dry); else they wait for more windows to share their calls."""
        held = self._held = [w for w in self._held if w.owner in self._runs]
        if not held:
            return
        now, urgent_s = time.perf_counter(), self.config.urgent_s
        if not (
            force
            or not self.config.hold_vocoder
            or len(held) >= self.config.max_vocoder_batch
            or any(w.owner.is_urgent(now, urgent_s) for w in held)
        ):
            return
        self._held = []
        self.stats.vocoder_flushes += 1
        self._vocode(held)
        for run in dict.fromkeys(w.owner for w in held):
            self._emit_ready(run)

    def _vocode(self, windows: list[VocoderWindow]) -> None:
        t0 = time.perf_counter()
        try:
            audio, calls = vocode_windows(
                self.pipeline.vocoder, windows, self.config.max_vocoder_batch,
                self.pipeline.acoustic_graphs, self.config.vocoder_bucket_frames,
            )  # fmt: skip
        except Exception as error:
            log.exception("vocoder batch of %d windows failed; its streams fail", len(windows))
            for window in windows:
                if window.owner in self._runs:
                    self._end(window.owner, error)
            return
        self.stats.add_vocoder(calls, len(windows))
        self.stats.vocoder_s += time.perf_counter() - t0
        for window, samples in zip(windows, audio):
            window.owner.absorb_window(window, samples)

    def _emit_ready(self, run: StreamRun) -> None:
        if run not in self._runs:
            return
        run.send_ready()
        if run.is_done:
            self._runs.remove(run)
            run.stream._end(None)
