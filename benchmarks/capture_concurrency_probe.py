"""Which work on a second thread leaves a first thread's CUDA-graph capture (thread-local mode) valid?

The load could capture the T2S graphs on one thread while another builds the acoustic graphs or reads
weights; CUDA's documentation restricts a thread-local capture's own thread only, but reports differ on
whether a synchronizing call from another thread on the same device invalidates it. Each scenario runs
in its own process: thread A captures ~400 small launches spread over ~200 ms (thread_local mode, its own
stream) while thread B runs one kind of call in a loop; the row says whether A's capture ended, whether
its graph replays to the right value, and what B raised.

    python benchmarks/capture_concurrency_probe.py --out capture_concurrency_probe_h200.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time

SCENARIOS = [
    "none",  # B idle: the control
    "device_synchronize",  # torch.cuda.synchronize()
    "default_stream_synchronize",  # the legacy default stream's synchronize
    "side_stream_synchronize",  # a pooled (non-blocking) stream's synchronize
    "item",  # a kernel then .item() on the default stream
    "h2d_pageable",  # a pageable host tensor copied to the device (cudaMemcpy on the default stream)
    "d2h",  # .cpu()
    "malloc_new_segment",  # allocations that need a new cudaMalloc segment
    "conv1d_new_shape",  # cuDNN plans for new shapes (what the acoustic warm-ups do)
    "eager_on_side_stream",  # kernels on a pooled stream, no sync
    "capture_on_side_stream",  # B captures its own graph (thread-local) at the same time
]


def child(scenario: str) -> dict:
    import torch

    dev = torch.device("cuda")
    torch.ones(1, device=dev).add_(1)
    torch.cuda.synchronize()
    x = torch.zeros(1024, device=dev)
    stop = threading.Event()
    b_error: list[str] = []
    b_calls = [0]

    def b_loop() -> None:
        side = torch.cuda.Stream(dev)
        shape = 100
        try:
            while not stop.is_set():
                if scenario == "device_synchronize":
                    torch.cuda.synchronize()
                elif scenario == "default_stream_synchronize":
                    torch.cuda.default_stream(dev).synchronize()
                elif scenario == "side_stream_synchronize":
                    with torch.cuda.stream(side):
                        torch.ones(8, device=dev).mul_(2)
                    side.synchronize()
                elif scenario == "item":
                    torch.ones(8, device=dev).sum().item()
                elif scenario == "h2d_pageable":
                    torch.ones(1 << 16).to(dev)
                elif scenario == "d2h":
                    torch.ones(1 << 16, device=dev).cpu()
                elif scenario == "malloc_new_segment":
                    torch.empty((1 << 22) + b_calls[0] * 4096, device=dev, dtype=torch.uint8)
                elif scenario == "conv1d_new_shape":
                    shape += 1
                    w = torch.randn(32, 16, 5, device=dev, dtype=torch.float16)
                    torch.nn.functional.conv1d(torch.randn(1, 16, shape, device=dev, dtype=torch.float16), w)
                elif scenario == "eager_on_side_stream":
                    with torch.cuda.stream(side):
                        torch.ones(8, device=dev).mul_(2)
                elif scenario == "capture_on_side_stream":
                    g = torch.cuda.CUDAGraph()
                    y = torch.zeros(8, device=dev)
                    with torch.cuda.stream(side):
                        y.add_(1)
                        g.capture_begin(capture_error_mode="thread_local")
                        for _ in range(20):
                            y.add_(1)
                            time.sleep(0.0005)
                        g.capture_end()
                    g.replay()
                    side.synchronize()
                    torch.cuda.current_stream().wait_stream(side)
                else:
                    time.sleep(0.001)
                b_calls[0] += 1
        except Exception as exc:  # recorded: the row says what B's call raised
            b_error.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")

    a_stream = torch.cuda.Stream(dev)
    with torch.cuda.stream(a_stream):
        x.add_(1)  # warm-up on the capture stream
    a_stream.synchronize()
    x.zero_()
    torch.cuda.synchronize()
    thread = threading.Thread(target=b_loop)
    graph = torch.cuda.CUDAGraph()
    n = 400
    a_error = None
    thread.start()
    time.sleep(0.02)
    try:
        with torch.cuda.stream(a_stream):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                for _ in range(n):
                    x.add_(1)
                    time.sleep(0.0005)
            finally:
                graph.capture_end()
    except Exception as exc:
        a_error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    stop.set()
    thread.join()
    replay_ok = None
    if a_error is None:
        try:
            x.zero_()
            graph.replay()
            torch.cuda.synchronize()
            replay_ok = bool((x == n).all().item())
        except Exception as exc:
            a_error = f"replay {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    return {
        "scenario": scenario,
        "capture_ok": a_error is None,
        "replay_equal": replay_ok,
        "capture_error": a_error,
        "b_calls": b_calls[0],
        "b_error": b_error[0] if b_error else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--child", default=None)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    import torch

    rows = []
    for scenario in SCENARIOS:
        proc = subprocess.run(
            [sys.executable, __file__, "--out", args.out, "--child", scenario],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        row = json.loads(lines[-1]) if lines else {
            "scenario": scenario, "capture_ok": False, "child_rc": proc.returncode,
            "stderr_tail": proc.stderr[-400:],
        }  # fmt: skip
        rows.append(row)
        print(f"{scenario:28s} capture_ok={row.get('capture_ok')} replay={row.get('replay_equal')} "
              f"b_calls={row.get('b_calls')} a_err={row.get('capture_error')} b_err={row.get('b_error')}")  # fmt: skip
    meta = {
        "benchmark": "capture_concurrency_probe",
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "command": "python benchmarks/capture_concurrency_probe.py --out " + args.out,
        "capture": "thread A: 400 x.add_(1) launches, 0.5 ms apart, thread_local mode, its own stream",
    }
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
