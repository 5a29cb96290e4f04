"""CUDA graphs of BigVGAN: mels of any length, one at a time (the streaming path's windows, the
per-sentence path's whole mels), and the stream engine's windows (many rows).

BigVGAN pads its borders (zeros in the convolutions, replication in the anti-aliased activations), so a
right-padded window would change the frames near its end unless it runs masked. Rows are another matter:
BigVGAN convolves each row alone, so the stream engine's windows of one length replay the graph of the
next row bucket (VOCODER_ROW_BUCKETS) with the missing rows zeros, exactly, per exact window length (its
windows sit on a grid of a few lengths). A mel of any length (`vocode_mel`) is cut into windows as wide
as the largest SENTENCE_FRAME_BUCKETS, with the receptive field as context (bigvgan/windows.py), and
replays masked graphs: one row right-padded to a SENTENCE_FRAME_BUCKETS length, or a row bucket of
full-width windows. Each row's length is a device buffer of the graph, so every length reaches cuDNN at
these few shapes (it builds plans per shape: ~150 ms a new length on the H200, conv_plan_probe_h200.json),
and the audio equals one-shot vocoding up to float rounding. A streamed window of the common chunk sizes
(73-120 frames) replays the 128-frame one: one graph at load where exact lengths took four.
`VocoderGraphs` keeps them (acoustic_graphs.AcousticGraphs owns one per model and locks around it);
the engine's shapes past MAX_VOCODER_FRAMES, past MAX_VOCODER_ROW_FRAMES for their rows, or new once
MAX_VOCODER_GRAPHS are held run eagerly, and say so (`eager_reason`). A new activation kernel or a
compiled forward drops the graphs (they would replay the old code).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from voicehub.models.gpt_sovits.bigvgan import BigVGAN
from voicehub.models.gpt_sovits.bigvgan.windows import receptive_field, vocode_windowed
from voicehub.models.gpt_sovits.encoder_graphs import forwards_of
from voicehub.runtime.cuda_graphs import BucketedGraphRunner, GraphBudget, GraphPreset
from voicehub.runtime.kv_cache import pick_bucket

MAX_VOCODER_FRAMES = 2048  # longest vocoder window replayed from a graph (~22 s)
MAX_VOCODER_GRAPHS = 96  # (rows, exact length) graphs kept; a new shape past that runs eagerly
VOCODER_ROW_BUCKETS = (1, 2, 4, 8, 16, 32)  # windows per graph: 1 streamed; the stream engine's batches
MAX_VOCODER_ROW_FRAMES = 32 * 160  # rows x frames of one graph of many rows (bounds its memory)
# Masked one-row graphs of a whole mel (`vocode_mel`): a mel of n frames up to the largest is right-padded
# to the next of these (at most half again: 513 -> 768); a longer one runs windows of the largest width
# (938 frames kept, 43 a side of context for the published config), as many rows a call as
# MAX_VOCODER_ROW_FRAMES allows (4). 8 + 2 graphs in all, whatever the lengths.
SENTENCE_FRAME_BUCKETS = (64, 128, 192, 256, 384, 512, 768, 1024)
MASKED = "masked"  # third element of a masked graph's key: (rows, frames, MASKED)
log = logging.getLogger("voicehub.models.gpt_sovits")


class VocoderGraphs:
    """BigVGAN replayed from graphs (module docstring): masked graphs for mels of any length
    (`vocode_mel`), and graphs per (rows, exact frames) for the stream engine's windows of one length, the
    rows padded with zeros up to a row bucket (BigVGAN convolves each row alone: a padded row changes no
    real row). Not thread-safe (AcousticGraphs locks)."""

    def __init__(
        self,
        vocoder: BigVGAN,
        device: torch.device,
        max_frames: int = MAX_VOCODER_FRAMES,
        max_graphs: int = MAX_VOCODER_GRAPHS,
        row_buckets: Sequence[int] = VOCODER_ROW_BUCKETS,
        max_row_frames: int = MAX_VOCODER_ROW_FRAMES,
        sentence_buckets: Sequence[int] = SENTENCE_FRAME_BUCKETS,
    ):
        self.vocoder, self.device = vocoder, device
        self.max_frames = max_frames
        self.row_buckets, self.max_row_frames = tuple(sorted(row_buckets)), max_row_frames
        assert self.row_buckets[0] == 1, "a mel alone is one row"
        self.runner: BucketedGraphRunner | None = None
        self._inputs: dict[tuple, torch.Tensor] = {}
        self._valid: dict[tuple, torch.Tensor] = {}  # masked graphs' row lengths (frames, int32)
        self.context = receptive_field(vocoder.conf)  # frames of context a side of a sentence's windows
        self.sentence_buckets = tuple(sorted(sentence_buckets))
        self.sentence_width = self.sentence_buckets[-1]  # a longer mel runs windows of this width
        self.sentence_rows = self.rows_per_call(self.sentence_width)
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
            keys += self.masked_keys()
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

    def masked_keys(self) -> list[tuple[int, int, str]]:
        """Keys of every masked graph `vocode_mel` replays: one row at each SENTENCE_FRAME_BUCKETS length,
        and full-width windows at the row buckets it calls with."""
        one_row = [(1, n, MASKED) for n in self.sentence_buckets]
        rows = [(r, self.sentence_width, MASKED) for r in self.row_buckets if 1 < r <= self.sentence_rows]
        return one_row + rows

    def masked_key(self, n_frames: int) -> tuple[int, int, str]:
        """The masked graph of one mel of n_frames <= the largest SENTENCE_FRAME_BUCKETS."""
        return 1, pick_bucket(n_frames, self.sentence_buckets), MASKED

    def capture_masked(self, keys: Sequence[tuple[int, int, str]] | None = None) -> None:
        """Capture masked graphs of `keys` (default: every one) now, each once (largest first: later
        captures reuse the pool's memory)."""
        runner = self.current_runner()
        for key in sorted(self.masked_keys() if keys is None else keys, key=lambda k: -k[0] * k[1]):
            if key in runner.captured_buckets:
                continue
            self._input_of(key)  # static inputs are allocated outside the capture
            self._valid_of(key)
            runner.run(key)

    def _step(self, key: tuple) -> torch.Tensor:
        if len(key) == 3:  # masked: each row's length from its static buffer
            return self.vocoder(self._input_of(key), self._valid_of(key))[:, 0]
        return self.vocoder(self._input_of(key))[:, 0]  # [rows, frames * hop]

    def _valid_of(self, key: tuple) -> torch.Tensor:
        buf = self._valid.get(key)
        if buf is None:
            device = self.vocoder.conv_pre.weight.device  # the static mel's, as `_input_of`
            buf = torch.full((key[0],), key[1], dtype=torch.int32, device=device)
            self._valid[key] = buf
        return buf

    def _input_of(self, key: tuple) -> torch.Tensor:
        buf = self._inputs.get(key)
        if buf is None:
            w = self.vocoder.conv_pre.weight
            buf = torch.zeros(key[0], self.vocoder.conf.num_mels, key[1], device=w.device, dtype=w.dtype)
            self._inputs[key] = buf
        return buf

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

    def vocode_mel(self, mel: torch.Tensor) -> torch.Tensor:
        """mel [1, num_mels, n] denormalised, any n -> audio [1, n * hop] (a copy), equal to `bigvgan.vocode`
        of the whole mel up to float rounding, from masked graphs (module docstring), each captured on first
        use unless `capture_masked` ran."""
        self.current_runner()  # drops the graphs if what the vocoder runs changed
        return vocode_windowed(self.vocoder, mel, self.sentence_width, self.sentence_rows, self._replay_masked,
                              context=self.context)  # fmt: skip

    def _replay_masked(self, mels: Sequence[torch.Tensor], width: int) -> torch.Tensor:
        # bigvgan.windows.VocodeRows: the windows as masked rows of one graph; its output is static
        if len(mels) == 1:
            key = self.masked_key(mels[0].shape[1])  # the key load-time shapes name (`masked_key`)
        else:
            key = (pick_bucket(len(mels), self.row_buckets), width, MASKED)
        buf, valid = self._input_of(key), self._valid_of(key)
        for i, mel in enumerate(mels):
            buf[i, :, : mel.shape[1]].copy_(mel)  # cast to the vocoder's dtype; the rest is masked
            valid[i].fill_(mel.shape[1])  # a fill kernel: no host-to-device copy to wait for
        valid[len(mels) :].fill_(0)
        assert self.runner is not None
        return self.runner.run(key)
