"""A long mel vocoded as windows of a few fixed widths, each output sample equal to one-shot vocoding.

BigVGAN is convolutional: an output sample depends on the mel frames within `receptive_field` of its
own frame and on nothing else, except at the mel's two ends, where the borders are padded. So a window
that reaches `context` >= that many frames past the frames it keeps, on each side that is not an end of
the mel, gives those frames exactly what vocoding the whole mel gives (up to float rounding). Windows
are at most `width` frames; the last one ends at the mel's end and is shorter, run as a masked row of
the full width (model.py: the border padding of a row that ends there). So a mel of any length reaches
the vocoder at a bounded set of shapes, which CUDA graphs can hold (vocoder_graphs.py: cuDNN builds its
convolution plans per shape, ~150 ms of host time for each new BigVGAN length on the H200).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from voicehub.models.gpt_sovits.bigvgan.model import BigVGAN, BigVGANConfig, vocode

ACTIVATION_REACH = 6  # input samples either side that an anti-aliased activation's output reads
POST_CONV_REACH = 3  # conv_pre and conv_post: kernel 7


def receptive_field(conf: BigVGANConfig) -> int:
    """Mel frames either side of an output sample's own frame that it may depend on (an upper bound:
    every convolution's and activation's reach at its rate, summed along the deepest path)."""
    reach = float(POST_CONV_REACH)  # conv_pre, at the frame rate
    per_frame = 1  # samples per mel frame at the current rate
    for rate, kernel in zip(conf.upsample_rates, conf.upsample_kernel_sizes):
        reach += (kernel // rate + 1) / per_frame  # the transposed conv, in its input's samples
        per_frame *= rate
        deepest = 0
        for k, dilations in zip(conf.resblock_kernel_sizes, conf.resblock_dilation_sizes):
            if conf.resblock == "1":  # activation, dilated conv, activation, conv per dilation
                path = sum(2 * ACTIVATION_REACH + d * (k - 1) // 2 + (k - 1) // 2 for d in dilations)
            else:  # activation, dilated conv per dilation
                path = sum(ACTIVATION_REACH + d * (k - 1) // 2 for d in dilations)
            deepest = max(deepest, path)
        reach += deepest / per_frame
    reach += (ACTIVATION_REACH + POST_CONV_REACH) / per_frame  # activation_post, conv_post
    return math.ceil(reach)


@dataclass(frozen=True)
class Window:
    """Mel frames [lo, hi) are vocoded; the audio of frames [keep_lo, keep_hi) is kept."""

    lo: int
    hi: int
    keep_lo: int
    keep_hi: int


def plan_windows(n_frames: int, width: int, context: int) -> list[Window]:
    """Windows of at most `width` frames whose kept frames tile [0, n_frames) in order, each kept frame
    at least `context` frames from its window's borders except at the mel's own ends (one window when
    n_frames <= width)."""
    if n_frames < 1:
        raise ValueError(f"a mel of {n_frames} frames has nothing to vocode")
    if width <= 2 * context:
        raise ValueError(f"windows of {width} frames keep nothing with {context} frames of context a side")
    windows: list[Window] = []
    keep_lo = 0
    while True:
        lo = max(keep_lo - context, 0)
        if lo + width >= n_frames:
            windows.append(Window(lo, n_frames, keep_lo, n_frames))
            return windows
        keep_hi = lo + width - context
        windows.append(Window(lo, lo + width, keep_lo, keep_hi))
        keep_lo = keep_hi


# vocode_rows(mel windows [num_mels, n_i], width) -> audio [rows, >= max n_i * hop]: row i is the vocoder
# of window i alone, right-padded to `width` frames (or fewer, when one window) and masked
# (vocode_masked_rows, or a graph replay, whose output the next call may overwrite)
VocodeRows = Callable[[Sequence[torch.Tensor], int], torch.Tensor]


def vocode_masked_rows(vocoder: BigVGAN, mels: Sequence[torch.Tensor], width: int) -> torch.Tensor:
    """Eager `VocodeRows`: the windows zero-padded to `width` frames, one masked vocoder call."""
    weight = vocoder.conv_pre.weight
    batch = weight.new_zeros(len(mels), vocoder.conf.num_mels, width)
    for i, mel in enumerate(mels):
        batch[i, :, : mel.shape[1]] = mel
    valid = torch.tensor([m.shape[1] for m in mels], dtype=torch.int32, device=weight.device)
    return vocode(vocoder, batch, valid)


def vocode_windowed(
    vocoder: BigVGAN,
    mel: torch.Tensor,
    width: int,
    rows_per_call: int,
    vocode_rows: VocodeRows | None = None,
    context: int | None = None,
) -> torch.Tensor:
    """mel [1, num_mels, n] denormalised -> audio [1, n * hop], equal to `vocode(vocoder, mel)` up to float
    rounding, from windows of `width` frames (`plan_windows`; context: `receptive_field` unless given),
    at most `rows_per_call` a call."""
    context = receptive_field(vocoder.conf) if context is None else context
    hop = vocoder.conf.hop_size
    rows = vocode_rows or (lambda mels, w: vocode_masked_rows(vocoder, mels, w))
    windows = plan_windows(mel.shape[2], width, context)
    pieces = []
    for first in range(0, len(windows), rows_per_call):
        group = windows[first : first + rows_per_call]
        audio = rows([mel[0, :, w.lo : w.hi] for w in group], width)  # the next call may overwrite it
        kept = [audio[i, (w.keep_lo - w.lo) * hop : (w.keep_hi - w.lo) * hop] for i, w in enumerate(group)]
        pieces.append(torch.cat(kept))
    return torch.cat(pieces)[None] if len(pieces) > 1 else pieces[0][None]
