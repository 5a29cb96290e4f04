"""The many-row stack's scratch (`t2s_layer_mma_triton`): the buffers its kernels hand each other within a
step, made per call (inside a CUDA graph, from the graph's pool), every row group's counters zeroed by one
fill."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from voicehub.runtime.kernels.t2s_ffn_fused_triton import fused_scratch_gemm
from voicehub.runtime.kernels.t2s_ffn_ticket_triton import ticket_scratch
from voicehub.runtime.kernels.t2s_layer import StackWeights
from voicehub.runtime.kernels.t2s_layer_mma_attention_triton import attn_span
from voicehub.runtime.kernels.t2s_layer_mma_config import MmaConfig
from voicehub.runtime.kernels.t2s_layer_mma_prenorm_triton import row_block_counters
from voicehub.runtime.kernels.t2s_layer_mma_splitk_triton import split_scratch
from voicehub.runtime.kernels.t2s_triton_common import attention_scratch


@dataclass
class Scratch:
    """Buffers the kernels hand to each other, [B, D] unless noted: q, x_attn (a layer's input), x_ffn
    (LN1's output), attn (merged heads), model dtype; out_attn, out_ffn (bias-free linear outputs, fp32);
    h [B, F] (the FFN's hidden units; [1, F], unused, with ffn_slices); count [B, H] int32; the attention
    blocks' partials m, l [B * H * splits] and part [B * H * splits, DH] (fp32); the split GEMMs'
    partials gemm_part (fp32; also the fused FFN's slice partials) and their per-tile counters gemm_count
    (int32, zero between kernels); with prenorm, row_count: int32 per row block (zero between kernels),
    the out-proj / ffn2 normalisers'; with attn_out, out_part [B, H, D] fp32 (each head's share of the
    out-projection) and out_count [B] int32, zero between kernels (one-element placeholders without it);
    with ffn_tickets, ticket (`ticket_scratch`: the ticketed FFN's partials and counters). counters: every
    int32 counter above that a kernel counts on (placeholders not), at 0 before a step's first kernel."""

    q: torch.Tensor
    x_attn: torch.Tensor
    x_ffn: torch.Tensor
    attn: torch.Tensor
    out_attn: torch.Tensor
    out_ffn: torch.Tensor
    h: torch.Tensor
    count: torch.Tensor
    m: torch.Tensor
    l: torch.Tensor  # noqa: E741
    part: torch.Tensor
    splits: int  # attention blocks of the whole cache: the merge's fixed shape
    gemm_part: torch.Tensor
    gemm_count: torch.Tensor
    row_count: torch.Tensor
    out_part: torch.Tensor
    out_count: torch.Tensor
    ticket: tuple  # the ticketed FFN's partials and counters (`ticket_scratch`), () without it
    counters: tuple[torch.Tensor, ...] = ()

    @classmethod
    def allocate(cls, n_rows: int, weights: StackWeights, max_slots: int, cfg: MmaConfig) -> Scratch:
        """One row group's scratch, its counters zeroed (one fill)."""
        return cls.allocate_groups([n_rows], weights, max_slots, cfg)[0]

    @classmethod
    def allocate_groups(
        cls, group_rows: list[int], weights: StackWeights, max_slots: int, cfg: MmaConfig
    ) -> list[Scratch]:
        """A scratch per row group (`row_spans`), every group's counters zeroed by one fill: each
        counter would otherwise be a memset of its own in the step's graph (~1 us each on an H100)."""
        scratch = [cls._allocate(n, weights, max_slots, cfg) for n in group_rows]
        pending = [c for s in scratch for c in s.counters]
        if pending:
            torch._foreach_zero_(pending)  # one multi-tensor kernel on CUDA
        return scratch

    @classmethod
    def _allocate(cls, n_rows: int, weights: StackWeights, max_slots: int, cfg: MmaConfig) -> Scratch:
        dim, dtype, dev = weights.head_weight.shape[1], weights.head_weight.dtype, weights.head_weight.device
        made: list[torch.Tensor] = []

        def counters(n: int) -> torch.Tensor:  # zeroed by allocate_groups, with every group's
            made.append(torch.empty(n, device=dev, dtype=torch.int32))
            return made[-1]

        ffn_dim = weights.layers[0].ffn1_weight.shape[0]
        xs = torch.empty(4, n_rows, dim, device=dev, dtype=dtype)
        outs = torch.empty(2, n_rows, dim, device=dev, dtype=torch.float32)
        # fused FFN: no h between its GEMMs (a one-row placeholder), its partials one tile a row block
        h = torch.empty(1 if cfg.ffn_slices else n_rows, ffn_dim, device=dev, dtype=dtype)
        gemms = [(3 * dim, cfg.block_n, cfg.qkv_splits), (dim, cfg.block_n, cfg.out_splits)]
        if cfg.ffn_slices:
            gemms.append(fused_scratch_gemm(dim, cfg.ffn_slices))
        else:
            gemms += [(ffn_dim, cfg.ffn_block, cfg.ffn1_splits), (dim, cfg.block_n, cfg.ffn2_splits)]
        part_shape = (n_rows, weights.n_head, dim) if cfg.attn_out else (1,)
        out_count = counters(n_rows) if cfg.attn_out else torch.empty(1, device=dev, dtype=torch.int32)
        return cls(*xs, *outs, h, *attention_scratch(n_rows, weights, max_slots, attn_span(cfg)),
                   *split_scratch(n_rows, cfg.block_m, gemms, dev, counters),
                   row_block_counters(n_rows, cfg.block_m, cfg.prenorm, dev, counters),
                   torch.empty(part_shape, device=dev, dtype=torch.float32), out_count,
                   ticket_scratch(n_rows, dim, ffn_dim, cfg, dev, counters) if cfg.ffn_tickets else (),
                   tuple(made))  # fmt: skip
