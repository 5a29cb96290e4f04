"""The next layer's K/V brought into L2 while this layer's GEMMs run (MmaConfig.kv_prefetch).

A 64-row step is a chain of latency-bound GEMM kernels (~25 us a layer, the memory bus mostly idle)
and bandwidth-bound attention kernels (~60-100 MB of K/V a layer at 64 rows). After a layer's
attention, one small kernel on a side stream (forked from the step and joined at its end, inside the
step's CUDA graph) issues `prefetch.global.L2` for the first kv_prefetch cached slots of every head of
every row of the next layer, so that attention finds part of its bytes in L2. A prefetch is a hint:
it returns nothing and changes no value, so results are bitwise those without it.
"""

from __future__ import annotations

import functools
import threading

import torch
import triton
import triton.language as tl

PREFETCH_LINES = 1024  # prefetch instructions a program issues per loop trip (8 per thread at 4 warps)


@triton.jit
def _kv_prefetch_kernel(
    len_ptr, k_ptr, v_ptr, n_slots, max_slots, skb, skh, svb, svh, slot_elems,
    N_HEAD: tl.constexpr, LINES: tl.constexpr,
):  # fmt: skip
    # Program (b, 0): the 128-byte lines of slots [0, min(lengths[b], n_slots, max_slots)) of each head's K
    # (slot_elems elements a slot, slots contiguous); (b, 1): V's
    b = tl.program_id(0)
    n = tl.minimum(tl.minimum(tl.load(len_ptr + b).to(tl.int32), n_slots), max_slots)
    per_line: tl.constexpr = 8 * 128 // k_ptr.dtype.element_ty.primitive_bitwidth
    n_lines = tl.cdiv(n * slot_elems, per_line)  # a head's lines
    if tl.program_id(1) == 0:
        row = k_ptr + b.to(tl.int64) * skb
        stride = skh
    else:
        row = v_ptr + b.to(tl.int64) * svb
        stride = svh
    if n_lines > 0:
        total = N_HEAD * n_lines
        for first in range(0, total, LINES):
            idx = tl.minimum(first + tl.arange(0, LINES), total - 1)  # past the end: the last line again
            at = row + (idx // n_lines) * stride + (idx % n_lines).to(tl.int64) * per_line
            tl.inline_asm_elementwise(
                "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [at], dtype=tl.int32, is_pure=False, pack=1
            )  # fmt: skip


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    # one per thread: a graph capture joins the streams it forks, and two threads may capture at once
    return _thread_stream(device, threading.get_ident())


@functools.cache
def _thread_stream(device: torch.device, thread: int) -> torch.cuda.Stream:
    return torch.cuda.Stream(device)


def prefetch_kv(
    k_layer: torch.Tensor, v_layer: torch.Tensor, lengths: torch.Tensor, n_slots: int, max_slots: int
) -> None:
    """k_layer, v_layer [B, H, S, Dh] (slots contiguous): the first min(lengths, n_slots, max_slots) slots
    of each row's heads into L2, by one kernel on a side stream that waits for the work queued so far and
    runs beside what follows (`join_prefetch` joins it)."""
    n_rows, n_head, _, head_dim = k_layer.shape
    if k_layer.stride(2) != head_dim or v_layer.stride(2) != head_dim:
        raise ValueError("prefetch_kv: the caches' slots must be contiguous ([B, H, S, Dh] with Dh packed)")
    side = _side_stream(k_layer.device)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _kv_prefetch_kernel[(n_rows, 2)](
            lengths, k_layer, v_layer, n_slots, max_slots, k_layer.stride(0), k_layer.stride(1),
            v_layer.stride(0), v_layer.stride(1), head_dim, N_HEAD=n_head, LINES=PREFETCH_LINES,
        )  # fmt: skip


def join_prefetch(device: torch.device) -> None:
    """The current stream waits for the prefetches (a graph capture must join every stream it forked)."""
    torch.cuda.current_stream().wait_stream(_side_stream(device))
