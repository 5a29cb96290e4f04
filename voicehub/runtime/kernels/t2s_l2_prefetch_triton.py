"""L2 prefetches of the many-row stack's attention kernel (`t2s_layer_mma_attention_triton`): bytes that a
later kernel of the step reads, moved into L2 while memory has room, with `cp.async.bulk.prefetch.L2`
(sm_90+: no register holds them, nothing waits for them, no value changes).

Why: a layer's attention streams ~63 MB of K/V at 64 rows (KV 480), while the ~22 us of GEMMs between two
attentions read ~6 MB of weights, every one a miss (151 MB of weights a step cycle through a 50 MB L2), so
memory sits nearly idle half the layer and each GEMM waits on memory's latency, not L2's.
- MmaConfig.kv_prefetch: each attention program ends by prefetching its span's first tiles of the next
  layer's K/V (`kv_targets`), which that layer's attention then reads from L2;
- MmaConfig.w_prefetch: each attention program starts by prefetching its share of the weights the next
  GEMMs read (this layer's FFN, the next layer's QKV and out-projection: `weight_targets`).
Earlier forms lost (benchmarks/results/README.md, H100): a side-stream kernel of per-line `prefetch.global.L2`
for the next layer's K/V (+5% a step) or the next weights (+1.2-1.5%). These issue one bulk instruction per
8 KB tile or weight share from the attention's own programs, no extra kernel; each lane (thread) issues at
most one prefetch. Triton's interpreter has neither L2 nor inline PTX: on the
CPU nothing is prefetched (`kv_prefetched`, `weights_prefetched`), and the tests check the targets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

if TYPE_CHECKING:
    from voicehub.runtime.kernels.t2s_layer_mma_config import MmaConfig

N_WEIGHTS = 4  # ranges of weights_prefetched: W1, W2 of this layer, W_qkv, W_o of the next


@triton.jit
def prefetch_l2(ptrs, nbytes, on):
    # cp.async.bulk.prefetch.L2 of nbytes (a multiple of 16, 16-byte aligned) at each pointer where on
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $3; mov.b32 $0, 0; }",
        "=r,l,r,r", [ptrs, on.to(tl.int32), nbytes], dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip


@triton.jit
def kv_targets(
    kn_ptr, vn_ptr, len_ptr, b, h, split, n_slots, pf_slots, skb, skh, sks, svb, svh, svs,
    BLOCK_S: tl.constexpr, TILES: tl.constexpr, LANES: tl.constexpr,
):  # fmt: skip
    # MmaConfig.kv_prefetch: what lane i of the program of (split, h, b) prefetches (one lane a thread): tile
    # i // 2 of its span's K (i even) or V (odd) in the next layer's cache, over the slots below the row's
    # length + 1, n_slots and pf_slots, as (pointer, bytes, on); lanes past those tiles are off
    lane = tl.arange(0, LANES)
    hi = tl.minimum(tl.minimum(tl.load(len_ptr + b).to(tl.int32) + 1, n_slots), pf_slots)
    first = split * TILES * BLOCK_S + (lane // 2) * BLOCK_S
    on = (lane // 2 < TILES) & (first < hi)
    slots = tl.minimum(hi - first, BLOCK_S)
    b64 = b.to(tl.int64)
    is_k = lane % 2 == 0
    k_at = kn_ptr + b64 * skb + h * skh + first * sks
    ptrs = tl.where(is_k, k_at, vn_ptr + b64 * svb + h * svh + first * svs)
    nbytes = tl.where(is_k, slots * sks, slots * svs) * (kn_ptr.dtype.element_ty.primitive_bitwidth // 8)
    return ptrs, nbytes, on


@triton.jit
def weight_targets(w1_ptr, w2_ptr, w3_ptr, w4_ptr, n1, n2, n3, n4, pid, n_prog, LANES: tl.constexpr):
    # MmaConfig.w_prefetch: lane r < 4 of program pid (of n_prog) prefetches its share of weight range r (n_r
    # bytes, a multiple of 16): shares of equal 16-byte multiples, the last ones shorter or empty (off)
    lane = tl.arange(0, LANES)
    nbytes = tl.where(lane == 0, n1, tl.where(lane == 1, n2, tl.where(lane == 2, n3, n4)))
    share = tl.cdiv(tl.cdiv(nbytes, n_prog), 16) * 16
    off = pid * share  # < 2**31: a weight matrix of a few MB
    size = tl.minimum(nbytes - off, share)
    elems = off // (w1_ptr.dtype.element_ty.primitive_bitwidth // 8)
    at = tl.where(lane == 0, w1_ptr, tl.where(lane == 1, w2_ptr, tl.where(lane == 2, w3_ptr, w4_ptr)))
    return at + elems, size, (lane < 4) & (size > 0)


def kv_prefetched(cfg: MmaConfig, k_layer: torch.Tensor, kv_next: tuple | None) -> bool:
    """Whether the attention prefetches the next layer's K/V (cfg.kv_prefetch, a next layer given, a CUDA
    cache). ValueError where it cannot: a GPU before sm_90 (no bulk prefetch), a tile's slots not one
    contiguous run of whole 16-byte units, too few lanes."""
    if not (cfg.kv_prefetch and kv_next is not None and k_layer.is_cuda):
        return False
    _needs_sm90(k_layer.device, "kv_prefetch")
    head_dim = k_layer.shape[-1]
    for t in (k_layer, *kv_next):
        runs = t.stride(-1) == 1 and t.stride(-2) == head_dim and head_dim * t.element_size() % 16 == 0
        if not runs or t.stride() != k_layer.stride():
            raise ValueError(f"MmaConfig.kv_prefetch needs caches of one layout whose slots are contiguous runs of"
                             f" 16-byte units; got strides {t.stride()} for head dim {k_layer.shape[-1]}")  # fmt: skip
    if 2 * cfg.attn_tiles > 32 * cfg.attn_warps:
        raise ValueError(f"MmaConfig.kv_prefetch: a program prefetches K and V of {cfg.attn_tiles} tiles, one a "
                         f"thread; {cfg.attn_warps} warps are too few")  # fmt: skip
    return True


def weights_prefetched(cfg: MmaConfig, w_next: tuple | None) -> bool:
    """Whether the attention prefetches w_next (cfg.w_prefetch, N_WEIGHTS CUDA tensors given). ValueError
    where it cannot: a GPU before sm_90, a tensor not one contiguous run of whole 16-byte units, mixed dtypes."""
    if not (cfg.w_prefetch and w_next is not None and w_next[0].is_cuda):
        return False
    _needs_sm90(w_next[0].device, "w_prefetch")
    for w in w_next:
        whole = w.is_contiguous() and w.data_ptr() % 16 == 0 and w.numel() * w.element_size() % 16 == 0
        if not whole or w.dtype != w_next[0].dtype or len(w_next) != N_WEIGHTS:
            raise ValueError(f"MmaConfig.w_prefetch needs {N_WEIGHTS} contiguous {w_next[0].dtype} tensors of whole "
                             f"16-byte units; got {tuple(w.shape)} {w.dtype}")  # fmt: skip
    return True


def _needs_sm90(device: torch.device, field: str) -> None:
    if torch.cuda.get_device_capability(device) < (9, 0):
        raise ValueError(f"MmaConfig.{field} needs sm_90+ (cp.async.bulk.prefetch.L2): turn it off here")
