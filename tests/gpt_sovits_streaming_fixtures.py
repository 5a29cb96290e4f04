"""Shared set-up of the streaming tests (test_gpt_sovits_streaming*.py): the tiny set's model and voice,
and a mel vocoded in chunks through `VocoderStream`, held to one-shot vocoding by SNR.

Test modules import the fixtures by name, and with them gpt_sovits_fixtures' `tiny_set` and
`reference_wav` that `model` and `voice` use: pytest looks a fixture up in the test's own module.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gpt_sovits_fixtures import REFERENCE_TEXT, reference_wav, tiny_set  # noqa: F401 (fixtures)

from voicehub.models.gpt_sovits import Voice, load
from voicehub.models.gpt_sovits.streaming import VocoderStream

SR = 24000
MIN_SNR_DB = 30.0  # issue 4: joined vocoder output vs one-shot vocoding


@pytest.fixture(scope="module")
def model(tiny_set):  # noqa: F811
    return load(tiny_set)


@pytest.fixture(scope="module")
def voice(reference_wav):  # noqa: F811
    return Voice(reference_wav, REFERENCE_TEXT, "en")


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
