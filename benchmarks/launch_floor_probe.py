"""The floor a CUDA graph puts under each kernel of a chain: N tiny dependent kernels in one graph.

The many-row T2S step is ~100 kernels (4 a layer, 24 layers, the head), and its GEMM chain costs
~21 us a layer at 16 rows and at 64 alike (`t2s_rows_timeline_h100.json`): latency, not bytes. This
probe times what any kernel in such a chain costs with no work in it, so the next step (fewer kernel
boundaries: a persistent layer kernel) knows what it can win. Each kernel's programs read one value
the previous kernel wrote and write it plus one (the chain's dependency, through memory); timed as
graphs of N kernels at several grid sizes (1 program, one per SM, four per SM), PDL off and on.

    python benchmarks/launch_floor_probe.py --out results/launch_floor_h100.json
    TRITON_INTERPRET=1 python benchmarks/launch_floor_probe.py --device cpu  # smoke test: the values
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import triton
import triton.language as tl
from bench_meta import capture, event_ms, tree_commit

from voicehub.runtime.kernels.t2s_triton_common import _await_previous, _launch

N_KERNELS = 96  # a step's layer kernels (4 x 24)
WARMUP, REPS = 3, 20


@triton.jit
def _touch_kernel(x_ptr, PDL: tl.constexpr):
    _await_previous(PDL)  # nothing to load before the previous kernel's store
    i = tl.program_id(0)
    tl.store(x_ptr + i, tl.load(x_ptr + i) + 1)


def chain(x: torch.Tensor, n_kernels: int, grid: int, pdl: bool) -> None:
    """n_kernels launches, each adding one to x[:grid] after the previous one's store."""
    options = _launch(SimpleNamespace(pdl=pdl), x.device)
    for _ in range(n_kernels):
        _touch_kernel[(grid,)](x, **options)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--device", default="cuda", help="cuda; cpu only smoke-tests the script (TRITON_INTERPRET=1)"
    )
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    x = torch.zeros(4096, dtype=torch.int32, device=args.device)
    if args.device != "cuda":
        chain(x, 3, 8, pdl=False)
        assert x[:8].tolist() == [3] * 8 and not x[8:].any(), "each kernel adds one"
        print("cpu smoke: ok")
        return
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for grid in (1, sms, 4 * sms):
        for pdl in (False, True):
            x.zero_()
            graph = capture(lambda grid=grid, pdl=pdl: chain(x, N_KERNELS, grid, pdl))
            ms = event_ms(graph.replay, WARMUP, REPS)
            assert int(x[0]) == N_KERNELS * (2 + WARMUP + REPS), "every kernel of every run ran"
            rows.append(
                {"grid": grid, "pdl": pdl, "graph_us": ms * 1e3, "us_per_kernel": ms * 1e3 / N_KERNELS}
            )
            print(f"grid {grid:4} pdl {pdl!s:5} {ms * 1e3:8.1f} us a graph, {rows[-1]['us_per_kernel']:5.2f} us a kernel",
                  flush=True)  # fmt: skip
    meta = {
        "benchmark": "launch_floor",
        "gpu": torch.cuda.get_device_name(),
        "platform": platform.platform(),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "triton": triton.__version__,
            "voicehub_commit": tree_commit(),
        },  # fmt: skip
        "sizes": {"n_kernels": N_KERNELS, "sms": sms},
        "warmups": f"2 eager chains before the capture, {WARMUP} replays",
        "repetitions": f"median of {REPS} replays (CUDA events)",
        "command": " ".join(["python", *sys.argv]),
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"results": rows, "meta": meta}, indent=1))


if __name__ == "__main__":
    main()
