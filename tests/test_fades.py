"""Chunk joining: fade curves, cross-fades, the streaming joiner, and the click meter."""

import numpy as np
import pytest

from voicehub.audio.fades import (
    StreamJoiner,
    crossfade,
    fade_curves,
    fade_in,
    fade_out,
    join_chunks,
    max_join_jump,
    parse_fade_shape,
)

SR = 24000


def _sine(n, freq=220.0, phase=0.0, start=0):
    t = (np.arange(n) + start) / SR
    return (0.5 * np.sin(2 * np.pi * freq * t + phase)).astype(np.float32)


def test_curves_sum_to_one_in_amplitude_or_power():
    rise, fall = fade_curves(240, "linear")
    np.testing.assert_allclose(rise + fall, 1.0, atol=1e-6)
    rise, fall = fade_curves(240, "equal_power")
    np.testing.assert_allclose(rise**2 + fall**2, 1.0, atol=1e-6)
    assert np.all(np.diff(rise) > 0) and np.all(np.diff(fall) < 0)
    np.testing.assert_allclose(rise, fall[::-1], atol=1e-6)
    with pytest.raises(ValueError, match="linear, equal_power"):
        parse_fade_shape("cubic")


def test_linear_crossfade_of_one_signal_is_lossless():
    whole = _sine(4800)
    overlap = 480
    a, b = whole[:2640], whole[2640 - overlap :]
    np.testing.assert_allclose(crossfade(a, b, overlap, "linear"), whole, atol=1e-6)


def test_stream_joiner_equals_whole_join():
    rng = np.random.default_rng(0)
    chunks = [rng.standard_normal(n).astype(np.float32) for n in (900, 500, 1200, 480)]
    whole, joins = join_chunks(chunks, overlap=240)
    assert len(whole) == sum(map(len, chunks)) - 3 * 240 and len(joins) == 3
    joiner = StreamJoiner(240)
    streamed = np.concatenate([joiner.push(c) for c in chunks] + [joiner.finish()])
    np.testing.assert_array_equal(streamed, whole)
    assert joiner.joins == joins == [660 + 120, 660 + 260 + 120, 660 + 260 + 960 + 120]


def test_join_without_overlap_is_concatenation():
    chunks = [_sine(300), _sine(200, start=300)]
    whole, joins = join_chunks(chunks, overlap=0)
    np.testing.assert_array_equal(whole, np.concatenate(chunks))
    assert joins == [300]


def test_click_meter_sees_hard_splice_not_crossfade():
    smooth = _sine(4800)
    assert max_join_jump(smooth, [2400], SR)[0] < 2.0
    a, b = _sine(2400), _sine(2400, phase=np.pi / 2, start=2400)  # a 0 -> 0.5 jump at the join: a click
    hard, joins = join_chunks([a, b], overlap=0)
    assert max_join_jump(hard, joins, SR)[0] > 10.0
    a, b = _sine(2640), _sine(2640, phase=np.pi / 2, start=2400)  # same splice, 10 ms equal-power cross-fade
    soft, joins = join_chunks([a, b], overlap=240)
    assert max_join_jump(soft, joins, SR)[0] < 3.0


def test_click_meter_edge_cases():
    silent_click = np.zeros(2000, np.float32)
    silent_click[1000] = 0.5
    assert np.isinf(max_join_jump(silent_click, [1000], SR)[0])
    assert max_join_jump(np.zeros(2000, np.float32), [1000], SR)[0] == 0.0
    with pytest.raises(ValueError, match="outside"):
        max_join_jump(silent_click, [5000], SR)


def test_fade_in_and_out():
    x = np.ones(1000, np.float32)
    y = fade_in(x, 100)
    assert y[0] < 0.02 and y[99] > 0.99 and np.all(y[100:] == 1) and np.all(x == 1)
    z = fade_out(x, 100, "linear")
    assert z[-1] < 0.01 and np.all(z[:900] == 1)
    assert fade_out(np.ones(10, np.float32), 100).shape == (10,)  # fade longer than the audio


def test_bad_overlaps():
    with pytest.raises(ValueError, match="overlap"):
        crossfade(np.zeros(10), np.zeros(5), 6)
    with pytest.raises(ValueError, match="shorter than the overlap"):
        StreamJoiner(100).push(np.zeros(50))
    with pytest.raises(ValueError, match=">= 0"):
        StreamJoiner(-1)
