"""Decoding a latent in overlapping windows, so audio for a long sentence starts early.

The decoder is convolutional, so a window of latent frames decoded together with enough
frames of context on each side gives nearly the samples the one-shot decode gives; the
remaining edge differences are hidden by a short linear cross-fade where windows meet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch


def plan_windows(n_frames: int, window: int, crossfade: int) -> list[tuple[int, int]]:
    """[start, end) frame ranges covering n_frames; the last is never shorter than the cross-fade."""
    if n_frames <= window:
        return [(0, n_frames)]
    starts = list(range(0, n_frames, window))
    if n_frames - starts[-1] < max(crossfade, window // 2):
        starts.pop()  # fold a short remainder into the window before it
    ends = starts[1:] + [n_frames]
    return list(zip(starts, ends))


def decode_windows(
    decode: Callable[[torch.Tensor], torch.Tensor],
    z: torch.Tensor,
    hop: int,
    window: int,
    context: int,
    crossfade: int,
) -> Iterator[tuple[np.ndarray, bool]]:
    """Yield (float32 audio, is_last) pieces whose concatenation is the decode of z [1, C, T] (T * hop samples).

    decode: latent [1, C, t] -> audio [1, t * hop]. Each window is decoded with `context` frames
    either side; all but the last also decode `crossfade` frames past their end, which are
    blended into the next window's first samples.
    """
    n_frames = z.shape[2]
    windows = plan_windows(n_frames, window, crossfade)
    fade_len = crossfade * hop
    ramp = (np.arange(fade_len, dtype=np.float32) + 0.5) / max(fade_len, 1)
    tail: np.ndarray | None = None
    for k, (start, end) in enumerate(windows):
        is_last = k == len(windows) - 1
        over = 0 if is_last else crossfade
        lo, hi = max(0, start - context), min(n_frames, end + over + context)
        audio = decode(z[:, :, lo:hi])[0].float().cpu().numpy()
        piece = audio[(start - lo) * hop : (end + over - lo) * hop]
        if tail is not None:
            piece = piece.copy()
            piece[:fade_len] = tail * (1 - ramp) + piece[:fade_len] * ramp
        body_len = (end - start) * hop
        tail = None if is_last else piece[body_len:]
        yield np.ascontiguousarray(piece[:body_len], dtype=np.float32), is_last
