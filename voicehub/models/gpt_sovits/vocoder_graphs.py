"""CUDA graphs of BigVGAN windows: the streaming path's (one row) and the stream engine's (many rows).

BigVGAN pads its borders (zeros in the convolutions, replication in the anti-aliased activations), so a
right-padded window would change the frames near its end: graphs are captured per exact window length.
Rows are another matter: BigVGAN convolves each row alone, so the stream engine's windows of one length
replay the graph of the next row bucket (VOCODER_ROW_BUCKETS) with the missing rows zeros, exactly.
`VocoderGraphs` keeps them (acoustic_graphs.AcousticGraphs owns one per model and locks around it);
shapes past MAX_VOCODER_FRAMES, past MAX_VOCODER_ROW_FRAMES for their rows, or new once
MAX_VOCODER_GRAPHS are held run eagerly, and say so (`eager_reason`). A new activation kernel or a
compiled forward drops the graphs (they would replay the old code).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from voicehub.models.gpt_sovits.bigvgan import BigVGAN, vocode
from voicehub.models.gpt_sovits.encoder_graphs import forwards_of
from voicehub.runtime.cuda_graphs import BucketedGraphRunner, GraphBudget, GraphPreset
from voicehub.runtime.kv_cache import pick_bucket

MAX_VOCODER_FRAMES = 2048  # longest vocoder window replayed from a graph (~22 s)
MAX_VOCODER_GRAPHS = 96  # (rows, exact length) graphs kept; a new shape past that runs eagerly
VOCODER_ROW_BUCKETS = (1, 2, 4, 8, 16, 32)  # windows per graph: 1 streamed; the stream engine's batches
MAX_VOCODER_ROW_FRAMES = 32 * 160  # rows x frames of one graph of many rows (bounds its memory)
log = logging.getLogger("voicehub.models.gpt_sovits")


class VocoderGraphs:
    """BigVGAN windows replayed from graphs captured per (rows, exact frames) (module docstring). One row:
    the streaming path's windows; more: the stream engine's windows of one length, the rows padded with
    zeros up to a row bucket (BigVGAN convolves each row alone: a padded row changes no real row).
    Not thread-safe (AcousticGraphs locks)."""

    def __init__(
        self,
        vocoder: BigVGAN,
        device: torch.device,
        max_frames: int = MAX_VOCODER_FRAMES,
        max_graphs: int = MAX_VOCODER_GRAPHS,
        row_buckets: Sequence[int] = VOCODER_ROW_BUCKETS,
        max_row_frames: int = MAX_VOCODER_ROW_FRAMES,
    ):
        self.vocoder, self.device = vocoder, device
        self.max_frames = max_frames
        self.row_buckets, self.max_row_frames = tuple(sorted(row_buckets)), max_row_frames
        assert self.row_buckets[0] == 1, "one-row graphs serve the streaming path"
        self.runner: BucketedGraphRunner | None = None
        self._inputs: dict[tuple[int, int], torch.Tensor] = {}
        self._identity: tuple | None = None
        self.budget = GraphBudget(max_graphs)  # keys captured or being captured by the current runner
        self._keys = self.budget.keys

    def current_runner(self) -> BucketedGraphRunner:
        """The graphs of what the vocoder runs now (all dropped when that changed)."""
        voc = self.vocoder
        identity = (voc.activation_post.kernel, forwards_of(voc))
        if identity != self._identity or self.runner is None:
            self.reset()
            self._identity = identity
            keys = [
                (r, n) for r in self.row_buckets for n in range(1, self.max_frames + 1)
                if r == 1 or r * n <= self.max_row_frames
            ]  # fmt: skip
            self.runner = BucketedGraphRunner(self._step, keys, GraphPreset.LAZY, self.device)
        return self.runner

    def reset(self) -> None:
        if self.runner is not None:
            self.runner.reset()
        self.runner = None
        self._keys.clear()

    @property
    def captured(self) -> list[tuple[int, int]]:
        return [] if self.runner is None else self.runner.captured_buckets

    def rows_per_call(self, n_frames: int) -> int:
        """Most windows of n_frames one graph holds (its rows x frames bounded by max_row_frames)."""
        return max([r for r in self.row_buckets if r * n_frames <= self.max_row_frames], default=1)

    def key(self, n_rows: int, n_frames: int) -> tuple[int, int]:
        """The graph of n_rows windows of n_frames (n_rows <= rows_per_call(n_frames))."""
        return pick_bucket(n_rows, self.row_buckets), n_frames

    def capture(self, n_frames: int, n_rows: int = 1) -> None:
        """Capture (n_rows, n_frames) now unless it is captured or refused (see `eager_reason`)."""
        key = self.key(n_rows, n_frames)
        runner = self.current_runner()  # drops the graphs if what the vocoder runs changed
        if self._why_eager(key) is None and key not in self._keys:
            self._input_of(key)  # allocated outside the capture, as every static input
            self._keys.add(key)
            runner.run(key)

    def _step(self, key: tuple[int, int]) -> torch.Tensor:
        return self.vocoder(self._input_of(key))[:, 0]  # [rows, frames * hop]

    def _input_of(self, key: tuple[int, int]) -> torch.Tensor:
        buf = self._inputs.get(key)
        if buf is None:
            w = self.vocoder.conv_pre.weight
            buf = torch.zeros(key[0], self.vocoder.conf.num_mels, key[1], device=w.device, dtype=w.dtype)
            self._inputs[key] = buf
        return buf

    def replayable(self, n_frames: int) -> bool:
        """Whether a window of n_frames replays a graph (captured, or there is room to capture it)."""
        return self.eager_reason(1, n_frames) is None

    def eager_reason(self, n_rows: int, n_frames: int) -> str | None:
        """None when n_rows windows of n_frames replay a graph (captured, or there is room to capture
        it); else why they run eagerly: 'too_long' (past max_frames, or past max_row_frames for
        n_rows) or 'graph_limit' (max_graphs held)."""
        self.current_runner()  # drops the graphs if what the vocoder runs changed
        if n_rows > self.rows_per_call(n_frames):
            return "too_long"
        return self._why_eager(self.key(n_rows, n_frames))

    def _why_eager(self, key: tuple[int, int]) -> str | None:
        # `eager_reason` for the graphs as they are now (the caller has checked what the vocoder runs)
        def say(_: str) -> None:
            log.warning(
                "vocoder window of %d frames (%d rows a call) runs eagerly: graphs hold windows of <= %d frames, "
                "at most %d shapes (%d captured)", key[1], key[0], self.max_frames, self.budget.max_graphs,
                len(self._keys),
            )  # fmt: skip

        return self.budget.why_eager(key, key[1] > self.max_frames, say)

    def vocode(self, mel: torch.Tensor) -> torch.Tensor:
        """mel [1, num_mels, n] denormalised -> audio [1, n * hop] (a copy), as `bigvgan.vocode`."""
        if self.eager_reason(1, mel.shape[2]) is not None:  # one walk of the vocoder a window
            return vocode(self.vocoder, mel)
        return self.vocode_rows([mel[0]])

    def vocode_rows(self, mels: Sequence[torch.Tensor]) -> torch.Tensor:
        """mels: windows [num_mels, n] of one length, denormalised, for which `eager_reason` said None ->
        audio [len(mels), n * hop] (a copy), each row as `bigvgan.vocode` of the window alone."""
        key = self.key(len(mels), mels[0].shape[1])
        buf = self._input_of(key)
        for i, mel in enumerate(mels):
            buf[i].copy_(mel)  # cast to the vocoder's dtype, as vocode() does
        buf[len(mels) :].zero_()  # padded rows: zeros (each row is convolved alone)
        self._keys.add(key)
        assert self.runner is not None, "eager_reason first: it checks what the vocoder runs"
        return self.runner.run(key)[: len(mels)].clone()
