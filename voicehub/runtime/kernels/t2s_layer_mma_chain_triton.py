"""The many-row stack's GEMM chain (`t2s_layer_mma_triton`) as one persistent kernel a layer (MmaConfig.gemm_chain).

Between two attentions the stack runs ffn1, ffn2 and the next layer's qkv: three kernels, each a short
chain of dependent memory round trips (weights, MMA, split-K partials and counters, the row norm), and
each paying a kernel boundary (the previous kernel's drain, the next one's ramp) before its first load.
Here one kernel runs all three GEMMs' tiles (the same tiles with the same operations as the three kernels,
so the same bits): tile g of the sequence [ffn1's | ffn2's | qkv's] goes to program g % G, each program
walking its tiles in order. A tile waits only for what it reads, on int32 counters (polled with plain
loads, then acquire): an ffn2 tile for the ffn1 tiles of its K range of h (`t2s_ffn_ticket_triton`), a qkv
tile for its row block's LN2 (stored by ffn2's last tile of the row block, `_norm_rows_if_last`); each
loads its first weights before it waits. The last layer's chain stops after ffn2 (the head follows).

No deadlock: every tile waits only for tiles before it in the sequence, so the first unfinished tile
always runs, provided its program is resident. The kernel is launched cooperatively on the GPU (CUDA
keeps all G programs resident at once, or refuses the launch), G = SMs x MmaConfig.gemm_chain_per_sm (at most
the tiles); Triton's interpreter runs programs one by one in order, so there G is the tile count (a tile
each). The last program to end sets the counters back to 0 (zeroed once per call: a scratch reused across
calls stays valid). Needs prenorm and attn_out (no out-projection kernel, LN1 and LN2 stored once per row
block) and one row group (`MmaConfig`); launched without PDL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from voicehub.runtime.kernels.t2s_ffn_ticket_triton import _ffn1_tile, _ffn2_tile, _unravel, _wait_count
from voicehub.runtime.kernels.t2s_layer import LayerWeights
from voicehub.runtime.kernels.t2s_layer_mma_gemm_triton import _a_dot, _qkv_out, _w_chunk
from voicehub.runtime.kernels.t2s_layer_mma_splitk_triton import _split_is_last, _split_sum, k_span

if TYPE_CHECKING:
    from voicehub.runtime.kernels.t2s_layer_mma_config import MmaConfig
    from voicehub.runtime.kernels.t2s_layer_mma_triton import Scratch

# sync's layout: the programs ended, then ffn2's ready counters (row block, K split), then qkv's (row block)
_DONE, _READY = tl.constexpr(0), tl.constexpr(1)


@triton.jit
def _qkv_tile(
    v, x_ptr, w_ptr, bias_ptr, q_ptr, count_ptr, k_ptr, v_ptr, len_ptr, part_ptr, gcount_ptr, ready_ptr,
    n_rows, dim, max_slots, span, n_cols, skb, skh, sks, svb, svh, svs,
    N_HEAD: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLITS: tl.constexpr, IEEE: tl.constexpr,
):  # fmt: skip
    # qkv's tile v (row block, output tile c, split) as `_qkv_kernel` computes it with prenorm (x: the LN2
    # ffn2 stored in x_attn, a plain GEMM), once its row block's LN2 is stored
    rb, c, split = _unravel(v, n_cols, SPLITS)
    rows = rb * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < n_rows
    outs = c * BLOCK_N + tl.arange(0, BLOCK_N)
    k_lo = split * span
    w = _w_chunk(
        w_ptr, outs, 3 * dim, k_lo + tl.arange(0, BLOCK_K), dim
    )  # no kernel writes W: before the wait
    _wait_count(ready_ptr + rb, 1)
    if c + split == 0:  # the counters the next attention adds to start at 0 (the last attention read them)
        heads = tl.arange(0, HEADS)
        tl.store(count_ptr + rows[:, None] * N_HEAD + heads[None, :], tl.zeros([BLOCK_M, HEADS], tl.int32),
                 mask=rmask[:, None] & (heads < N_HEAD)[None, :])  # fmt: skip
    acc = _a_dot(x_ptr, w_ptr, w, rows, rmask, outs, 3 * dim, dim, k_lo, tl.minimum(dim, k_lo + span), BLOCK_M,
                 BLOCK_N, BLOCK_K, IEEE)  # fmt: skip
    if SPLITS == 1:
        _qkv_out(acc, bias_ptr, q_ptr, k_ptr, v_ptr, len_ptr, rows, rmask, outs, dim, max_slots, skb, skh, sks,
                 svb, svh, svs, HEAD_DIM)  # fmt: skip
    elif _split_is_last(acc, part_ptr, gcount_ptr, rb * n_cols + c, split, BLOCK_M, BLOCK_N, SPLITS):
        acc = _split_sum(part_ptr, gcount_ptr, rb * n_cols + c, BLOCK_M, BLOCK_N, SPLITS)
        _qkv_out(acc, bias_ptr, q_ptr, k_ptr, v_ptr, len_ptr, rows, rmask, outs, dim, max_slots, skb, skh, sks,
                 svb, svh, svs, HEAD_DIM)  # fmt: skip


@triton.jit
def _chain_kernel(
    x1_ptr, w1_ptr, b1_ptr, h_ptr, part1_ptr, count1_ptr,
    w2_ptr, out_ptr, part2_ptr, count2_ptr, b2_ptr, n2w_ptr, n2b_ptr, xa_ptr, rcount_ptr,
    wq_ptr, bq_ptr, q_ptr, acount_ptr, k_ptr, v_ptr, len_ptr, part3_ptr, count3_ptr, sync_ptr,
    n_rows, dim, ffn_dim, eps, span1, span2, span3, max_slots, skb, skh, sks, svb, svh, svs,
    N_HEAD: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_F: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
    SPLITS1: tl.constexpr, SPLITS2: tl.constexpr, SPLITS3: tl.constexpr, IEEE: tl.constexpr, QKV: tl.constexpr,
):  # fmt: skip
    # x1: LN1 (x_ffn, stored by the attention); ffn1 -> h; ffn2 -> out (fp32) and LN2 -> xa (x_attn); QKV: the
    # next layer's qkv from xa -> q, k and v at slot lengths (and the attention counters acount zeroed)
    row_blocks = tl.cdiv(n_rows, BLOCK_M)
    f_tiles = tl.cdiv(ffn_dim, BLOCK_F)
    n_tiles = tl.cdiv(dim, BLOCK_N)
    q_tiles = tl.cdiv(3 * dim, BLOCK_N)
    n1 = row_blocks * f_tiles * SPLITS1
    n12 = n1 + row_blocks * SPLITS2 * n_tiles
    total = n12 + (row_blocks * q_tiles * SPLITS3 if QKV else 0)
    ready1 = sync_ptr + _READY  # [row block, ffn2 split]: ffn1 tiles of its K range stored
    ready2 = ready1 + row_blocks * SPLITS2  # [row block]: its LN2 stored
    for g in range(tl.program_id(0), total, tl.num_programs(0)):
        if g < n1:
            _ffn1_tile(g, x1_ptr, out_ptr, b2_ptr, n2w_ptr, n2b_ptr, w1_ptr, b1_ptr, x1_ptr, h_ptr, part1_ptr,
                       count1_ptr, ready1, n_rows, dim, ffn_dim, eps, span1, span2, f_tiles, BLOCK_M, BLOCK_F,
                       BLOCK_K, BLOCK_D, SPLITS1, SPLITS2, IEEE, True)  # fmt: skip
        elif g < n12:
            _ffn2_tile(g - n1, h_ptr, w2_ptr, out_ptr, part2_ptr, count2_ptr, ready1, x1_ptr, b2_ptr, n2w_ptr,
                       n2b_ptr, xa_ptr, rcount_ptr, n_rows, dim, ffn_dim, eps, span2, n_tiles, ready2, BLOCK_M,
                       BLOCK_N, BLOCK_F, BLOCK_K, BLOCK_D, SPLITS2, IEEE, True, QKV)  # fmt: skip
        else:
            _qkv_tile(g - n12, xa_ptr, wq_ptr, bq_ptr, q_ptr, acount_ptr, k_ptr, v_ptr, len_ptr, part3_ptr,
                      count3_ptr, ready2, n_rows, dim, max_slots, span3, q_tiles, skb, skh, sks, svb, svh, svs,
                      N_HEAD, HEADS, HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_K, SPLITS3, IEEE)  # fmt: skip
    tl.debug_barrier()
    if tl.atomic_add(sync_ptr + _DONE, 1, sem="acq_rel") == tl.num_programs(0) - 1:
        for i in range(0, row_blocks * (SPLITS2 + 1)):  # every program has ended: nothing reads them now
            tl.store(ready1 + i, 0)
        tl.store(sync_ptr + _DONE, 0)


def chain_scratch(n_rows: int, dim: int, ffn_dim: int, cfg: MmaConfig, device: torch.device) -> tuple:
    """(part1, count1, part2, count2, part3, count3, sync): ffn1's, ffn2's and qkv's split-K partials (fp32)
    and per-tile counters (each GEMM its own: their tiles run at once), and the ended / ready counters
    (int32), the counters zeroed (each call leaves them at 0)."""
    row_blocks = triton.cdiv(n_rows, cfg.block_m)
    gemms = [(ffn_dim, cfg.ffn_block, cfg.ffn1_splits), (dim, cfg.block_n, cfg.ffn2_splits),
             (3 * dim, cfg.block_n, cfg.qkv_splits)]  # fmt: skip
    tiles = [row_blocks * triton.cdiv(n_out, block) for n_out, block, _ in gemms]
    counts = torch.zeros(sum(tiles) + _READY.value + row_blocks * (cfg.ffn2_splits + 1), device=device,
                         dtype=torch.int32)  # fmt: skip
    out, at = [], 0
    for n, (_, block, splits) in zip(tiles, gemms):
        out += [
            torch.empty(n * splits * cfg.block_m * block, device=device, dtype=torch.float32),
            counts[at : at + n],
        ]
        at += n
    return (*out, counts[at:])


def chain_programs(n_tiles: int, cfg: MmaConfig, device: torch.device) -> tuple[int, dict]:
    """The chain's program count and launch options: SMs x cfg.gemm_chain_per_sm (at most the tiles), launched
    cooperatively (all resident at once, or the launch fails; cfg.gemm_chain_maxnreg: ptxas's register cap)
    on a GPU; the tile count on the interpreter, which runs programs one by one in order (a tile each: every
    tile's wait is over before it starts)."""
    if device.type != "cuda":
        return n_tiles, {}
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    options = {"launch_cooperative_grid": True}
    if cfg.gemm_chain_maxnreg:
        options["maxnreg"] = cfg.gemm_chain_maxnreg
    return min(n_tiles, sms * cfg.gemm_chain_per_sm), options


def chain_stage(
    s: Scratch, layer: LayerWeights, following: LayerWeights | None, k_next: torch.Tensor | None,
    v_next: torch.Tensor | None, lengths: torch.Tensor, eps: float, cfg: MmaConfig,
) -> None:  # fmt: skip
    """What ffn1_stage, ffn2_stage and the following layer's qkv_stage leave (s.h, s.out_ffn, LN2 -> s.x_attn;
    s.q, k_next and v_next at slot lengths, s.count zeroed), in one kernel (s.chain: `chain_scratch`);
    following None (the last layer): ffn1 and ffn2 only."""
    n_rows, dim = s.q.shape
    ffn_dim, n_head = s.h.shape[1], s.count.shape[1]
    span1, span2 = k_span(dim, cfg.block_k, cfg.ffn1_splits), k_span(ffn_dim, cfg.block_k, cfg.ffn2_splits)
    if span2 % cfg.ffn_block:
        raise ValueError(f"chain: ffn2's K span {span2} is not a whole number of ffn_block {cfg.ffn_block}")
    row_blocks = triton.cdiv(n_rows, cfg.block_m)
    n_tiles = row_blocks * (triton.cdiv(ffn_dim, cfg.ffn_block) * cfg.ffn1_splits
                            + triton.cdiv(dim, cfg.block_n) * cfg.ffn2_splits)  # fmt: skip
    qkv = following is not None
    if qkv:
        n_tiles += row_blocks * triton.cdiv(3 * dim, cfg.block_n) * cfg.qkv_splits
    else:  # unread without QKV: any tensors of the right kinds
        following, k_next, v_next = layer, s.q[:, None, None], s.q[:, None, None]
    grid, options = chain_programs(n_tiles, cfg, s.q.device)
    _chain_kernel[(grid,)](
        s.x_ffn, layer.ffn1_weight, layer.ffn1_bias, s.h, *s.chain[:2],
        layer.ffn2_weight, s.out_ffn, *s.chain[2:4], layer.ffn2_bias, layer.norm2_weight, layer.norm2_bias,
        s.x_attn, s.row_count,
        following.qkv_weight, following.qkv_bias, s.q, s.count, k_next, v_next, lengths, *s.chain[4:],
        n_rows, dim, ffn_dim, eps, span1, span2, k_span(dim, cfg.block_k, cfg.qkv_splits), k_next.shape[2],
        *k_next.stride()[:3], *v_next.stride()[:3],
        N_HEAD=n_head, HEADS=triton.next_power_of_2(n_head), HEAD_DIM=dim // n_head, BLOCK_M=cfg.block_m,
        BLOCK_F=cfg.ffn_block, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, BLOCK_D=triton.next_power_of_2(dim),
        SPLITS1=cfg.ffn1_splits, SPLITS2=cfg.ffn2_splits, SPLITS3=cfg.qkv_splits, IEEE=s.q.dtype == torch.float32,
        QKV=qkv, num_warps=cfg.gemm_warps, num_stages=cfg.gemm_stages, **options,
    )  # fmt: skip
