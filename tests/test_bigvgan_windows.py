"""BigVGAN's masked rows and windowed vocoding (bigvgan/model.py, bigvgan/windows.py), CPU float32/64."""

from __future__ import annotations

import pytest
import torch

from voicehub.models.gpt_sovits.bigvgan import BigVGANConfig, load_bigvgan, make_bigvgan_folder, vocode
from voicehub.models.gpt_sovits.bigvgan.checkpoint import V2_24KHZ_100BAND_256X
from voicehub.models.gpt_sovits.bigvgan.windows import (
    Window,
    plan_windows,
    receptive_field,
    vocode_masked_rows,
    vocode_windowed,
)

HOP = 256


@pytest.fixture(scope="module")
def vocoder(tmp_path_factory):
    return load_bigvgan(make_bigvgan_folder(tmp_path_factory.mktemp("bigvgan"), "tiny", seed=3))


def _mel(frames: int, seed: int, rows: int = 1) -> torch.Tensor:
    return torch.randn(rows, 100, frames, generator=torch.Generator().manual_seed(seed)) - 6


def test_masked_rows_equal_each_row_vocoded_alone(vocoder):
    # rows right-padded with noise (not zeros): the mask alone must keep it out of every valid sample
    mel = _mel(40, seed=1, rows=4)
    valid = [40, 23, 1, 9]
    audio = vocode(vocoder, mel, torch.tensor(valid, dtype=torch.int32))
    assert audio.shape == (4, 40 * HOP)
    for b, n in enumerate(valid):
        alone = vocode(vocoder, mel[b : b + 1, :, :n])[0]
        assert torch.allclose(audio[b, : n * HOP], alone, atol=1e-5, rtol=1e-4), f"row {b} ({n} frames)"


def test_without_the_mask_the_padding_would_leak(vocoder):
    # the test above can fail: the same padded row unmasked differs near its end
    mel = _mel(40, seed=1)
    alone = vocode(vocoder, mel[:, :, :23])[0]
    unmasked = vocode(vocoder, mel)[0, : 23 * HOP]
    assert not torch.allclose(unmasked, alone, atol=1e-3)


def test_receptive_field_bounds_where_a_frame_reaches(vocoder):
    # float64: a frame changed by a step changes no sample farther than receptive_field frames away
    model = vocoder.double()
    try:
        mel = _mel(80, seed=2).double()
        bumped = mel.clone()
        bumped[:, :, 40] += 1.0
        diff = (vocode(model, bumped) - vocode(model, mel))[0].abs().view(80, HOP).amax(dim=1)
        reach = receptive_field(model.conf)
        changed = (diff > 0).nonzero().flatten()
        assert changed.min() >= 40 - reach and changed.max() <= 40 + reach
        assert changed.max() - 40 >= reach // 2  # a bound, but not a loose one
    finally:
        vocoder.float()


def test_published_config_reach():
    assert receptive_field(BigVGANConfig.from_json(V2_24KHZ_100BAND_256X, "published")) == 43


@pytest.mark.parametrize("n_frames", [1, 30, 64, 65, 100, 190, 301])
@pytest.mark.parametrize("rows_per_call", [1, 3])
def test_windows_equal_one_shot_vocoding(vocoder, n_frames: int, rows_per_call: int):
    mel = _mel(n_frames, seed=n_frames)
    got = vocode_windowed(vocoder, mel, width=64, rows_per_call=rows_per_call)
    want = vocode(vocoder, mel)
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-4)


def test_too_little_context_shows(vocoder):
    mel = _mel(190, seed=5)
    got = vocode_windowed(vocoder, mel, width=64, rows_per_call=2, context=2)
    assert not torch.allclose(got, vocode(vocoder, mel), atol=1e-3)


def test_masked_rows_pad_to_the_width(vocoder):
    mels = [_mel(10, seed=6)[0], _mel(33, seed=7)[0]]
    audio = vocode_masked_rows(vocoder, mels, 48)
    assert audio.shape == (2, 48 * HOP)
    assert torch.allclose(audio[1, : 33 * HOP], vocode(vocoder, mels[1][None])[0], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("n_frames", [1, 99, 100, 101, 250, 1000])
def test_plan_tiles_the_mel_with_context_inside_each_window(n_frames: int):
    width, context = 100, 20
    windows = plan_windows(n_frames, width, context)
    assert windows[0].keep_lo == 0 and windows[-1].keep_hi == n_frames == windows[-1].hi
    for w, nxt in zip(windows, windows[1:]):
        assert w.keep_hi == nxt.keep_lo
    for w in windows:
        assert 0 <= w.lo <= w.keep_lo < w.keep_hi <= w.hi <= n_frames and w.hi - w.lo <= width
        assert w.lo == 0 or w.keep_lo - w.lo >= context
        assert w.hi == n_frames or w.hi - w.keep_hi >= context
    if n_frames <= width:
        assert windows == [Window(0, n_frames, 0, n_frames)]


def test_plan_rejects_what_it_cannot_tile():
    with pytest.raises(ValueError, match="nothing to vocode"):
        plan_windows(0, 100, 20)
    with pytest.raises(ValueError, match="keep nothing"):
        plan_windows(500, 40, 20)
