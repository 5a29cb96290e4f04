"""Where a CUDA graph's step spends its time, kernel by kernel: which kernels run, on which stream, when,
and how much of the step has two or more of them on the GPU at once.

`graph_timeline` replays a captured graph under the PyTorch profiler (CUPTI traces the kernels inside a
graph replay) and returns each replay's kernels; `summary` reduces one replay to the numbers that say
whether parallel streams overlap: the step's wall time (first kernel start to last kernel end), the
kernels' summed time, the time at least one / at least two run, the idle gaps (and the largest, with the
kernels on either side: profiled replays of a graph with side streams hold one ~190 us gap at the first
fork that the event-timed replays do not, so compare such variants by busy time), and for the attention
kernels the time they run beside another kernel (what row groups are for: `t2s_rows_probe.py --timeline`).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch


def kernel_events(trace: dict) -> list[dict]:
    """A Chrome trace's (torch.profiler's export) GPU kernels: name, stream, start and duration in µs,
    start relative to the first kernel, in start order."""
    # kineto writes "kernel" (older releases "Kernel"); the stream is args.stream, else the event's tid
    found = [
        e
        for e in trace.get("traceEvents", [])
        if str(e.get("cat")).lower() == "kernel" and e.get("ph") == "X"
    ]
    if not found:
        return []
    t0 = min(float(e["ts"]) for e in found)
    out = [
        {"name": e["name"], "stream": int(e.get("args", {}).get("stream", e.get("tid", -1))), "start": float(e["ts"]) - t0,
         "dur": float(e["dur"])}
        for e in found
    ]  # fmt: skip
    return sorted(out, key=lambda e: e["start"])


def covered(intervals: Iterable[tuple[float, float]], at_least: int = 1) -> float:
    """The length of time covered by at least `at_least` of the [start, end) intervals at once."""
    edges = sorted((t, step) for a, b in intervals if b > a for t, step in ((a, 1), (b, -1)))
    total, depth, last = 0.0, 0, None
    for t, step in edges:
        if depth >= at_least and last is not None:
            total += t - last
        depth += step
        last = t
    return total


def overlap(a: Iterable[tuple[float, float]], b: Iterable[tuple[float, float]]) -> float:
    """The time during which some interval of a and some interval of b both run."""
    a, b = list(a), list(b)
    # |A ∩ B| = |A| + |B| - |A ∪ B| over the unions of each set
    return covered(a) + covered(b) - covered(a + b)


def idle_gaps(events: list[dict]) -> Iterator[tuple[float, dict, dict]]:
    """Each time with no kernel running, between the first start and the last end: (its length in µs, the
    kernel whose end opens it, the kernel whose start closes it), in time order. Gaps are measured from the
    latest end so far (a long kernel covers the shorter ones it overlaps)."""
    end, last = None, None
    for e in sorted(events, key=lambda e: e["start"]):
        if end is not None and e["start"] > end:
            yield e["start"] - end, last, e
        if end is None or e["start"] + e["dur"] > end:
            end, last = e["start"] + e["dur"], e


def largest_gap(events: list[dict]) -> dict:
    """The longest idle gap (`idle_gaps`), with the kernels on either side (names and streams)."""
    best = {"us": 0.0, "after": None, "before": None}
    for us, after, before in idle_gaps(events):
        if us > best["us"]:
            best = {"us": us, "after": f"{after['name']}@{after['stream']}",
                    "before": f"{before['name']}@{before['stream']}"}  # fmt: skip
    return best


def summary(
    events: list[dict], is_attention: Callable[[str], bool] = lambda name: "attention" in name
) -> dict:
    """One replay's kernels reduced to where the step's time goes (µs)."""
    spans = [(e["start"], e["start"] + e["dur"]) for e in events]
    attn = [s for s, e in zip(spans, events) if is_attention(e["name"])]
    other = [s for s, e in zip(spans, events) if not is_attention(e["name"])]
    wall = max((b for _, b in spans), default=0.0) - min((a for a, _ in spans), default=0.0)
    busy = covered(spans)
    by_name: dict[str, dict] = {}
    by_stream: dict[str, dict] = {}
    for e in events:
        for table, key in ((by_name, e["name"]), (by_stream, str(e["stream"]))):
            row = table.setdefault(key, {"count": 0, "us": 0.0})
            row["count"] += 1
            row["us"] += e["dur"]
    return {
        "n_kernels": len(events),
        "wall_us": wall,
        "kernel_sum_us": sum(e["dur"] for e in events),
        "busy_us": busy,
        "idle_us": wall - busy,
        "largest_gap": largest_gap(events),
        "two_or_more_us": covered(spans, at_least=2),
        "attention_us": covered(attn),
        "attention_beside_other_us": overlap(attn, other),
        "by_name": by_name,
        "by_stream": by_stream,
    }


def gaps_by_pair(events: list[dict], min_us: float = 1.0, top: int = 8) -> list[dict]:
    """The idle gaps of at least min_us (no kernel running), grouped by the kernels on either side (the
    one whose end opens the gap, the one whose start closes it): count and summed µs, the largest
    groups first. Where a loop's GPU time goes between its graphs: after which kernel the device waits."""
    groups: dict[tuple[str, str], dict] = {}
    for us, after, before in idle_gaps(events):
        if us >= min_us:
            row = groups.setdefault((after["name"], before["name"]), {"count": 0, "us": 0.0})
            row["count"] += 1
            row["us"] += us
    ranked = sorted(groups.items(), key=lambda kv: -kv[1]["us"])[:top]
    return [{"after": a, "before": b, **row} for (a, b), row in ranked]


TOP_KERNELS = 16  # loop_against_replay's kernels by name, the largest summed times


def loop_against_replay(loop: list[dict], replay: list[dict]) -> dict:
    """A serving loop's kernels against its graphs replayed alone (each a whole traced run), each read over
    the middle half of its trace (the steady state: no admission, no tail): the window, its kernels, the
    share of it the device is busy and idle, its gaps of 2 us or more (`gaps_by_pair`), its kernels by name
    (count and summed µs, the TOP_KERNELS largest: a replayed step's cost by kernel), and the kernels only the
    loop runs."""
    out, names = {}, {}
    for part, events in (("loop", loop), ("replay", replay)):
        span = max(e["start"] + e["dur"] for e in events)
        mid = [e for e in events if span / 4 <= e["start"] < 3 * span / 4]
        s = summary(mid)
        out[part] = {"window_us": s["wall_us"], "n_kernels": s["n_kernels"], "busy_share": s["busy_us"] / s["wall_us"],
                     "idle_share": s["idle_us"] / s["wall_us"], "gaps": gaps_by_pair(mid, min_us=2.0),
                     "kernels": dict(sorted(s["by_name"].items(), key=lambda kv: -kv[1]["us"])[:TOP_KERNELS])}  # fmt: skip
        names[part] = s["by_name"]
    out["loop_only_kernels"] = {k: v for k, v in names["loop"].items() if k not in names["replay"]}
    return out


def traced(fn: Callable[[], object]) -> tuple[object, list[dict]]:
    """fn() run once under the profiler (CUDA activity), synced: what it returned and its GPU kernels
    (`kernel_events`)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        value = fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return value, kernel_events(json.loads(path.read_text()))


REPLAYS, WARMUP = 3, 3  # graph_timeline's profiled and unprofiled replays


def graph_timeline(
    graph: torch.cuda.CUDAGraph, replays: int = REPLAYS, warmup: int = WARMUP
) -> list[list[dict]]:
    """Each of `replays` profiled replays of graph (after `warmup` unprofiled ones): its kernel events."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(replays):
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                graph.replay()
                torch.cuda.synchronize()
            path = Path(tmp) / f"replay{i}.json"
            prof.export_chrome_trace(str(path))
            events = kernel_events(json.loads(path.read_text()))
            if not events:
                raise RuntimeError("the profiler traced no kernel of the graph replay (CUPTI unavailable?)")
            out.append(events)
    return out
