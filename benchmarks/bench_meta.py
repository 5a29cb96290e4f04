"""What every benchmark records about the tree it ran (the commit), and the timers and graph capture
they share.

The device machine receives a copy of the working tree whose `.git` may lag behind it, so the
caller can name the commit (`VOICEHUB_COMMIT`, set by gpu_session.sh from the lead's checkout);
otherwise git is asked, and None is recorded when neither knows.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any


def tree_commit() -> str | None:
    named = os.environ.get("VOICEHUB_COMMIT", "").strip()
    if named:
        return named
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:  # no git on the machine
        return None
    return rev or None


def event_ms(fn: Callable[[], Any], warmup: int, reps: int) -> float:
    """Median ms of one call on the GPU, each timed by CUDA events (launch overhead included)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def capture(fn: Callable[[], Any]) -> Any:
    """A CUDA graph of one call of fn, after two warm-up calls (Triton's compiles, cuBLAS's workspace)
    on a side stream outside the capture."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def host_ms(fn: Callable[[], Any]) -> float:
    """Host ms of one call, the GPU's queue drained before and after it (when CUDA is initialised: a
    CPU-only run times the call alone)."""
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    if sync:
        sync()
    t0 = time.perf_counter()
    fn()
    if sync:
        sync()
    return (time.perf_counter() - t0) * 1e3
