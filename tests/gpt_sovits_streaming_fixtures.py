"""Shared set-up of the streaming tests (test_gpt_sovits_streaming*.py): a mel vocoded in chunks through
`VocoderStream`, held to one-shot vocoding by SNR. The tiny set's `model` and `voice` fixtures come from
conftest.py.
"""

from __future__ import annotations

import numpy as np
import torch

from voicehub.models.gpt_sovits.streaming import VocoderStream

SR = 24000
MIN_SNR_DB = 30.0  # issue 4: joined vocoder output vs one-shot vocoding


def snr_db(ref: np.ndarray, test: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref**2) / np.sum((ref - test) ** 2)))


def stream_mel(vocoder, mel: torch.Tensor, sizes: list[int]) -> tuple[np.ndarray, list[int]]:
    voc = VocoderStream(vocoder)
    pieces, start = [], 0
    for k, n in enumerate(sizes):
        pieces.append(voc.push(mel[:, :, start : start + n], is_last=k == len(sizes) - 1))
        start += n
    assert start == mel.shape[2]
    return np.concatenate(pieces), voc.joiner.joins
