"""Split-K for the many-row stack's GEMMs (`t2s_layer_mma_triton`): a fixed partition of the reduction.

A GEMM with `splits` > 1 launches `splits` programs per output tile (row block, column block); split s
multiplies the K chunks [s * span, (s + 1) * span) (span: the chunks divided evenly, rounded up, so a
split may be empty: its partial is 0). Each program stores its fp32 partial, then counts on an int32
counter per tile (acq_rel); the last of a tile to arrive sums the partials in split order 0, 1, ...
from memory (never its own registers first: the order must not depend on which program finished
last), runs the GEMM's epilogue and sets the counter back to 0 (so the counters, zeroed once per
call, are zero again for the next GEMM). The partition depends only on the model's K and the config,
never on the batch, and a partial's element depends only on its own row: a row's result is bitwise
the same alone or in any batch. No float atomics.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl


@triton.jit
def _mm(a, b, acc, IEEE: tl.constexpr):
    # fp32 operands (tests, fp32 models) in full precision, not TF32; fp16 ones on the tensor cores
    if IEEE:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _split_is_last(acc, part_ptr, count_ptr, tile, split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   SPLITS: tl.constexpr):  # fmt: skip
    # store this split's partial [BLOCK_M, BLOCK_N] of the tile; True in the tile's last program to arrive
    idx = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    tl.store(part_ptr + (tile * SPLITS + split) * (BLOCK_M * BLOCK_N) + idx, acc)
    tl.debug_barrier()  # every thread's partial is written before the counter says so
    return tl.atomic_add(count_ptr + tile, 1, sem="acq_rel") == SPLITS - 1


@triton.jit
def _split_sum(part_ptr, count_ptr, tile, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr):
    # the tile's partials summed in split order (fp32); the counter left at 0 for the next use
    idx = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    base = part_ptr + tile * SPLITS * (BLOCK_M * BLOCK_N) + idx
    acc = tl.load(base)
    for s in tl.static_range(1, SPLITS):
        acc += tl.load(base + s * (BLOCK_M * BLOCK_N))
    tl.store(count_ptr + tile, 0)
    return acc


def k_span(n_in: int, block_k: int, splits: int) -> int:
    """K elements per split: the reduction's chunks of block_k divided evenly, rounded up."""
    return triton.cdiv(triton.cdiv(n_in, block_k), splits) * block_k


# int32 counters [n], at 0 when the next kernel runs: all of a step's counters are zeroed by one fill
# (`t2s_layer_mma_scratch.Scratch.allocate_groups`)
CounterFactory = Callable[[int], torch.Tensor]


def split_scratch(
    n_rows: int, block_m: int, gemms: list[tuple[int, int, int]], device: torch.device,
    counters: CounterFactory,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(part fp32, count int32 from `counters`) large enough for every GEMM of `gemms`: (n_out, block_n,
    splits). One pair serves every GEMM in turn: each leaves the counters at 0 when it ends (zeroed
    once per call: a scratch reused across calls stays valid)."""
    row_blocks = triton.cdiv(n_rows, block_m)
    tiles = [row_blocks * triton.cdiv(n_out, block_n) for n_out, block_n, _ in gemms]
    parts = [t * s * block_m * bn for t, (_, bn, s) in zip(tiles, gemms) if s > 1]
    part = torch.empty(max(parts, default=1), device=device, dtype=torch.float32)
    if not parts:  # no split GEMM: nothing counts, and no memset joins the step's graph
        return part, torch.empty(1, device=device, dtype=torch.int32)
    return part, counters(max(tiles))
