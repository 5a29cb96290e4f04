"""Row groups of the many-row stack (`t2s_layer_mma_triton.step_groups`): which rows a group takes, and on
which CUDA streams its kernels run inside a step (forked from the caller's stream and joined back, so a
graph capture records them as branches). Streams decide only when kernels run, never what they compute:
a row's kernels are those of its group alone, so its numbers are the same in any arrangement.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator

import torch
import triton

from voicehub.runtime.kernels.t2s_layer_mma_config import MmaConfig

GEMM_PRIORITY = -1  # MmaConfig.attn_stream: the GEMM streams' priority (lower is sooner; the default is 0)


def row_spans(n_rows: int, cfg: MmaConfig) -> list[tuple[int, int]]:
    """cfg.row_groups: [lo, hi) of each group, whole row blocks, at least cfg.group_rows rows a group but the last."""
    n_groups = max(1, min(cfg.row_groups, n_rows // max(cfg.block_m, cfg.group_rows)))
    size = triton.cdiv(triton.cdiv(n_rows, n_groups), cfg.block_m) * cfg.block_m
    return [(lo, min(lo + size, n_rows)) for lo in range(0, n_rows, size)]


@functools.cache
def _stream(device: torch.device, index: int, priority: int, thread: int) -> torch.cuda.Stream:
    # per thread: two threads may capture graphs at once, and a capture joins the streams it forks
    return torch.cuda.Stream(device, priority=priority)


class GroupStreams:
    """The streams of one step's row groups. On the CPU, or with one group, every kernel runs in order on
    the caller's stream. With several groups:
    - default: group 0 on the caller's stream, group g on a side stream; each attention waits for the one
      before it in (layer, group) order (`attention`), so the attentions take turns while the other
      groups' GEMMs run;
    - cfg.attn_stream: every group's GEMMs on a side stream of higher priority (GEMM_PRIORITY), the
      attentions in (layer, group) order on the caller's stream, each after its group's qkv and before
      its group's next GEMM: a GEMM's programs are dispatched before pending attention programs."""

    def __init__(self, x: torch.Tensor, n_groups: int, cfg: MmaConfig) -> None:
        self.parallel = x.is_cuda and n_groups > 1  # else every kernel in order on the caller's stream
        self.own_attention = self.parallel and cfg.attn_stream
        self.main = torch.cuda.current_stream(x.device) if x.is_cuda else None
        self.turn: torch.cuda.Event | None = None
        thread = threading.get_ident()
        if not self.parallel:
            self.gemm_streams = [self.main] * n_groups
        elif self.own_attention:
            self.gemm_streams = [_stream(x.device, g, GEMM_PRIORITY, thread) for g in range(n_groups)]
        else:
            self.gemm_streams = [self.main] + [_stream(x.device, g, 0, thread) for g in range(1, n_groups)]
        for stream in self._side():
            stream.wait_stream(self.main)

    def _side(self) -> list[torch.cuda.Stream]:
        return [s for s in self.gemm_streams if s is not self.main]  # none unless parallel

    def gemms(self, g: int) -> contextlib.AbstractContextManager:
        """Where group g's GEMMs (qkv, out-projection, FFN, head) run."""
        return torch.cuda.stream(self.gemm_streams[g]) if self.parallel else contextlib.nullcontext()

    @contextlib.contextmanager
    def attention(self, g: int) -> Iterator[None]:
        """Where group g's attention runs: after its qkv and the attention before it, before its next GEMM."""
        if not self.parallel:
            yield
            return
        gemm = self.gemm_streams[g]
        stream = self.main if self.own_attention else gemm
        if self.own_attention:
            stream.wait_stream(gemm)  # its qkv (and the attention before it: the same stream)
        elif self.turn is not None:
            stream.wait_event(self.turn)
        with torch.cuda.stream(stream):
            yield
        if self.own_attention:
            gemm.wait_stream(stream)
        else:
            self.turn = torch.cuda.Event()
            self.turn.record(stream)

    def join(self) -> None:
        """The caller's stream waits for every group's last kernel."""
        for stream in self._side():
            self.main.wait_stream(stream)
