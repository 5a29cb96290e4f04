"""benchmarks/kernel_timeline.py: a profiler trace's kernels and how much of a step runs side by side."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "kernel_timeline.py"


@pytest.fixture(scope="module")
def tl():
    spec = importlib.util.spec_from_file_location("kernel_timeline", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _kernel(name, stream, ts, dur):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}


def test_kernel_events_keep_only_kernels_relative_to_the_first(tl):
    trace = {
        "traceEvents": [
            _kernel("_linear_kernel", 7, 1010.0, 5.0),
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 990.0, "dur": 3.0},
            _kernel("_qkv_kernel", 7, 1000.0, 4.0),
            {"ph": "i", "cat": "kernel", "name": "marker", "ts": 900.0},
            {
                "ph": "X",
                "cat": "Kernel",
                "name": "_head_kernel",
                "ts": 1020.0,
                "dur": 1.0,
                "tid": 9,
            },  # older kineto
        ]
    }
    events = tl.kernel_events(trace)
    assert [(e["name"], e["stream"], e["start"], e["dur"]) for e in events] == [
        ("_qkv_kernel", 7, 0.0, 4.0),
        ("_linear_kernel", 7, 10.0, 5.0),
        ("_head_kernel", 9, 20.0, 1.0),
    ]
    assert tl.kernel_events({"traceEvents": []}) == []


def test_covered_counts_time_with_enough_intervals_at_once(tl):
    spans = [(0, 10), (5, 15), (20, 30), (25, 26)]
    assert tl.covered(spans) == 25  # [0, 15) and [20, 30)
    assert tl.covered(spans, at_least=2) == 6  # [5, 10) and [25, 26)
    assert tl.covered(spans, at_least=3) == 0
    assert tl.overlap([(0, 10)], [(5, 15), (8, 20)]) == 5
    assert tl.overlap([(0, 4)], [(4, 8)]) == 0  # touching is not overlapping


def test_summary_splits_the_step_into_busy_idle_and_side_by_side(tl):
    events = [
        {"name": "_qkv_kernel", "stream": 7, "start": 0.0, "dur": 8.0},
        {"name": "_attention_kernel", "stream": 7, "start": 10.0, "dur": 20.0},
        {"name": "_qkv_kernel", "stream": 9, "start": 12.0, "dur": 8.0},  # beside the attention
        {"name": "_attention_kernel", "stream": 9, "start": 30.0, "dur": 10.0},
    ]
    s = tl.summary(events)
    assert s["n_kernels"] == 4 and s["wall_us"] == 40.0 and s["kernel_sum_us"] == 46.0
    assert s["busy_us"] == 38.0 and s["idle_us"] == 2.0 and s["two_or_more_us"] == 8.0
    assert s["attention_us"] == 30.0 and s["attention_beside_other_us"] == 8.0
    assert s["by_name"]["_qkv_kernel"] == {"count": 2, "us": 16.0}
    assert s["by_stream"]["9"] == {"count": 2, "us": 18.0}
    # the gap 8-10 (the qkv on stream 7 ends; the attention on 7 starts); 20-30 is covered by the attention
    assert s["largest_gap"] == {"us": 2.0, "after": "_qkv_kernel@7", "before": "_attention_kernel@7"}


def test_largest_gap_is_measured_from_the_latest_end_so_far(tl):
    events = [
        {"name": "a", "stream": 1, "start": 0.0, "dur": 50.0},  # a long kernel covers b's end
        {"name": "b", "stream": 2, "start": 5.0, "dur": 5.0},
        {"name": "c", "stream": 2, "start": 20.0, "dur": 5.0},
        {"name": "d", "stream": 1, "start": 53.0, "dur": 1.0},
        {"name": "e", "stream": 2, "start": 60.0, "dur": 1.0},
    ]
    assert tl.largest_gap(events) == {"us": 6.0, "after": "d@1", "before": "e@2"}
    assert tl.largest_gap(events[:1]) == {"us": 0.0, "after": None, "before": None}


def test_gaps_by_pair_groups_idle_time_by_the_kernels_around_it(tl):
    events = [
        {"name": "head", "stream": 1, "start": 0.0, "dur": 5.0},
        {"name": "qkv", "stream": 1, "start": 15.0, "dur": 5.0},  # 10 us after head
        {"name": "head", "stream": 1, "start": 20.5, "dur": 5.0},  # 0.5 us: under min_us
        {"name": "copy", "stream": 2, "start": 28.0, "dur": 1.0},  # 2.5 us after head
        {"name": "head", "stream": 1, "start": 29.0, "dur": 5.0},
        {"name": "qkv", "stream": 1, "start": 40.0, "dur": 5.0},  # 6 us after head
    ]
    assert tl.gaps_by_pair(events, min_us=1.0) == [
        {"after": "head", "before": "qkv", "count": 2, "us": 16.0},
        {"after": "head", "before": "copy", "count": 1, "us": 2.5},
    ]
    assert tl.gaps_by_pair(events, min_us=1.0, top=1) == [
        {"after": "head", "before": "qkv", "count": 2, "us": 16.0}
    ]
    assert tl.gaps_by_pair(events, min_us=20.0) == []


def test_loop_against_replay_reads_the_middle_half_of_each_trace(tl):
    def run(names, gap):  # 8 kernels of 10 us, `gap` us apart, from t = 0
        return [{"name": n, "stream": 7, "start": i * (10.0 + gap), "dur": 10.0} for i, n in enumerate(names)]

    loop = run(
        ["step", "step", "step", "snap", "step", "step", "step", "step"], 5.0
    )  # span 115: [28.75, 86.25)
    replay = run(["step"] * 8, 0.0)  # span 80: [20, 60)
    got = tl.loop_against_replay(loop, replay)
    # loop window: kernels starting at 30, 45, 60, 75 (the 'snap' at 45); replay: at 20, 30, 40, 50
    assert got["loop"]["n_kernels"] == 4 and got["loop"]["window_us"] == 55.0
    assert got["loop"]["idle_share"] == 15.0 / 55.0 and got["loop"]["busy_share"] == 40.0 / 55.0
    assert got["loop"]["gaps"] == [{"after": "step", "before": "snap", "count": 1, "us": 5.0},
                                   {"after": "snap", "before": "step", "count": 1, "us": 5.0},
                                   {"after": "step", "before": "step", "count": 1, "us": 5.0}]  # fmt: skip
    assert (
        got["replay"]["n_kernels"] == 4 and got["replay"]["idle_share"] == 0.0 and got["replay"]["gaps"] == []
    )
    assert got["loop"]["kernels"] == {"step": {"count": 3, "us": 30.0}, "snap": {"count": 1, "us": 10.0}}
    assert got["replay"]["kernels"] == {"step": {"count": 4, "us": 40.0}}
    assert got["loop_only_kernels"] == {"snap": {"count": 1, "us": 10.0}}
