"""The floor a CUDA graph puts under each kernel of a chain: N tiny dependent kernels in one graph.

The many-row T2S step is ~100 kernels (4 a layer, 24 layers, the head), and its GEMM chain costs
~21 us a layer at 16 rows and at 64 alike (`t2s_rows_timeline_h100.json`): latency, not bytes. This
probe times what any kernel in such a chain costs with no work in it, so the next step (fewer kernel
boundaries: a persistent layer kernel) knows what it can win. Each kernel's programs read one value
the previous kernel wrote and write it plus one (the chain's dependency, through memory); timed as
graphs of N kernels at several grid sizes (1 program, one per SM, four per SM), PDL off and on. Beside
them, what a persistent kernel pays instead: one kernel of N phases split by grid barriers (an atomic
counter each program adds to, then spins on), at 1 program and one per SM.

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


@triton.jit
def _grid_barrier(count_ptr, target):
    # every program's stores before it are seen by every program after it: the CTA's threads meet, one
    # release-add a program, then each spins (acquire) until all nprog programs have added (target)
    tl.debug_barrier()
    tl.atomic_add(count_ptr, 1, sem="release", scope="gpu")
    while tl.atomic_add(count_ptr, 0, sem="acquire", scope="gpu") < target:
        pass
    tl.debug_barrier()


@triton.jit
def _barrier_chain_kernel(x_ptr, count_ptr, n_phases):
    # one persistent program per SM, n_phases phases split by grid barriers: phase k reads the value its
    # neighbour wrote in phase k - 1 (half k % 2 of x) and writes it plus one (the other half)
    i, n = tl.program_id(0), tl.num_programs(0)
    for k in range(n_phases):
        src, dst = (k % 2) * n, ((k + 1) % 2) * n
        tl.store(x_ptr + dst + i, tl.load(x_ptr + src + (i + 1) % n) + 1)
        _grid_barrier(count_ptr, (k + 1) * n)


def barrier_chain(x: torch.Tensor, count: torch.Tensor, n_phases: int, grid: int) -> None:
    """One kernel of `grid` co-resident programs (at most one per SM) and n_phases - 1 grid barriers
    between phases: what a persistent layer kernel pays where the chain pays a kernel boundary.
    Counter and buffer are zeroed first (two more kernels, in the graph too)."""
    count.zero_()
    x[: 2 * grid].zero_()
    _barrier_chain_kernel[(grid,)](x, count, n_phases)


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
        count = torch.zeros(1, dtype=torch.int32)
        barrier_chain(x, count, 5, 1)  # the interpreter runs programs one by one: one program
        assert int(x[1]) == 5 and int(count) == 5, "each phase adds one, each barrier counts one"
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
    count = torch.zeros(1, dtype=torch.int32, device=x.device)
    for grid in (1, sms):
        graph = capture(lambda grid=grid: barrier_chain(x, count, N_KERNELS, grid))
        ms = event_ms(graph.replay, WARMUP, REPS)
        assert x[: 2 * grid].tolist() == [N_KERNELS] * grid + [N_KERNELS - 1] * grid, "every phase ran"
        rows.append(
            {"grid": grid, "persistent": True, "graph_us": ms * 1e3, "us_per_barrier": ms * 1e3 / N_KERNELS}
        )
        print(f"grid {grid:4} one kernel, {N_KERNELS - 1} grid barriers {ms * 1e3:8.1f} us a graph,"
              f" {rows[-1]['us_per_barrier']:5.2f} us a phase", flush=True)  # fmt: skip
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
