"""L2 prefetches of the many-row stack's attention kernel (`t2s_layer_mma_attention_triton`): bytes that a
later kernel of the step reads, moved into L2 while memory has room, with `cp.async.bulk.prefetch.L2`
(sm_90+: no register holds them, nothing waits for them, no value changes).

Why: a layer's attention streams ~63 MB of K/V at 64 rows (KV 480), while the ~22 us of GEMMs between two
attentions read ~6 MB of weights, every one a miss (151 MB of weights a step cycle through a 50 MB L2), so
memory sits nearly idle half the layer and each GEMM waits on memory's latency, not L2's.
- MmaConfig.kv_prefetch: each attention program ends by prefetching its span's first tiles of the next
  layer's K/V (`kv_targets`), which that layer's attention then reads from L2;
- MmaConfig.kv_prefetch_own: each attention program starts by prefetching its own span's K/V (`kv_targets`
  over this layer), so its tile loop's later loads find them in L2;
- MmaConfig.w_prefetch: each attention program starts by prefetching its share of the weights the next
  GEMMs read (this layer's FFN, the next layer's QKV and out-projection: `weight_targets`).
Earlier forms lost (benchmarks/results/README.md, H100): a side-stream kernel of per-line `prefetch.global.L2`
for the next layer's K/V (+5% a step) or the next weights (+1.2-1.5%). These issue one bulk instruction per
8 KB tile or weight share from the attention's own programs, no extra kernel; each lane (thread) issues at
most one prefetch. Triton's interpreter has neither L2 nor inline PTX: on the CPU nothing is prefetched
(`kv_prefetched`, `kv_own_prefetched`, `weights_prefetched`), and the tests check the targets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

if TYPE_CHECKING:
    from voicehub.runtime.kernels.t2s_layer_mma_config import MmaConfig

N_WEIGHTS = 4  # ranges of weights_prefetched: W1, W2 of this layer, W_qkv, W_o of the next
# one bulk prefetch's most bytes: ptxas takes sizes in [0, 1048560] (its SASS keeps 16 bits of size / 16)
MAX_BYTES = (1 << 20) - 16


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
    # MmaConfig.kv_prefetch / kv_prefetch_own: what lane i of the program of (split, h, b) prefetches (one lane a
    # thread): tile i // 2 of its span's K (i even) or V (odd) in the caches kn, vn (the next layer's, or this
    # one's), over the slots below the row's length + 1, n_slots and pf_slots, as (pointer, bytes, on); lanes past
    # those tiles are off
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
def weight_targets(w1_ptr, w2_ptr, w3_ptr, w4_ptr, n1, n2, n3, n4, split, h, b, LANES: tl.constexpr):
    # MmaConfig.w_prefetch: lane r < 4 of the program of (split, h, b) prefetches its share of weight range r
    # (n_r bytes, a multiple of 16): the grid's programs in (b, h, split) order take shares of equal 16-byte
    # multiples (at most MAX_BYTES: `weights_prefetched`), the last ones shorter or empty (off)
    pid = (b * tl.num_programs(1) + h) * tl.num_programs(0) + split
    n_prog = tl.num_programs(0) * tl.num_programs(1) * tl.num_programs(2)
    lane = tl.arange(0, LANES)
    nbytes = tl.where(lane == 0, n1, tl.where(lane == 1, n2, tl.where(lane == 2, n3, n4)))
    share = tl.cdiv(tl.cdiv(nbytes, n_prog), 16) * 16
    off = pid * share  # < 2**31: a weight matrix of a few MB
    size = tl.minimum(nbytes - off, share)
    elems = off // (w1_ptr.dtype.element_ty.primitive_bitwidth // 8)
    at = tl.where(lane == 0, w1_ptr, tl.where(lane == 1, w2_ptr, tl.where(lane == 2, w3_ptr, w4_ptr)))
    return at + elems, size, (lane < 4) & (size > 0)


def check_device(cfg: MmaConfig, device: torch.device) -> None:
    """Before a step launches anything: ValueError where cfg asks for an L2 prefetch on a CUDA GPU before
    sm_90 (no bulk prefetch). Off the GPU (Triton's interpreter: no L2, no inline PTX) none is issued."""
    asked = [name for name in ("kv_prefetch", "kv_prefetch_own", "w_prefetch") if getattr(cfg, name)]
    if asked and device.type == "cuda" and torch.cuda.get_device_capability(device) < (9, 0):
        raise ValueError(f"MmaConfig.{' and '.join(asked)} need sm_90+ (cp.async.bulk.prefetch.L2): turn them off"
                         " on this GPU")  # fmt: skip


def kv_prefetched(cfg: MmaConfig, kv: tuple[torch.Tensor, torch.Tensor], kv_next: tuple | None) -> bool:
    """Whether the attention over caches kv (K, V) prefetches the next layer's, kv_next (cfg.kv_prefetch, a next
    layer given, CUDA caches; `check_device` first). ValueError where it cannot: kv_next not of kv's shapes and
    strides, a tile's slots not one contiguous run of whole 16-byte units (16-byte aligned), too few lanes."""
    if not (cfg.kv_prefetch and kv_next is not None and kv[0].is_cuda):
        return False
    _check_kv(cfg, kv, kv_next, "kv_prefetch")
    return True


def kv_own_prefetched(cfg: MmaConfig, kv: tuple[torch.Tensor, torch.Tensor]) -> bool:
    """Whether the attention over CUDA caches kv (K, V) prefetches its own span first (cfg.kv_prefetch_own;
    `check_device` first). ValueError where it cannot, as `kv_prefetched`."""
    if not (cfg.kv_prefetch_own and kv[0].is_cuda):
        return False
    _check_kv(cfg, kv, kv, "kv_prefetch_own")
    return True


def weights_prefetched(cfg: MmaConfig, w_next: tuple | None, n_prog: int) -> bool:
    """Whether the n_prog programs of an attention prefetch w_next (cfg.w_prefetch, N_WEIGHTS CUDA tensors
    given; `check_device` first). ValueError where they cannot: a tensor not one contiguous 16-byte-aligned
    run of whole 16-byte units, mixed dtypes, a program's share over MAX_BYTES."""
    if not (cfg.w_prefetch and w_next is not None and w_next[0].is_cuda):
        return False
    _check_weights(w_next, n_prog)
    return True


def _check_kv(cfg: MmaConfig, kv: tuple, kv_next: tuple, field: str) -> None:
    head_dim = kv[0].shape[-1]
    for t, like in zip((*kv, *kv_next), (*kv, *kv)):
        runs = t.stride(-1) == 1 and t.stride(-2) == head_dim and head_dim * t.element_size() % 16 == 0
        if not runs or t.data_ptr() % 16 or t.shape != like.shape or t.stride() != like.stride():
            raise ValueError(f"MmaConfig.{field} needs the prefetched caches shaped and laid out as this layer's"
                             f" {tuple(like.shape)}, slots as contiguous 16-byte-aligned runs of 16-byte units; got"
                             f" {tuple(t.shape)}, strides {t.stride()}")  # fmt: skip
    if (
        2 * cfg.attn_tiles > 32 * cfg.attn_warps
        or cfg.attn_block * head_dim * kv[0].element_size() > MAX_BYTES
    ):
        raise ValueError(f"MmaConfig.{field}: a program prefetches K and V of {cfg.attn_tiles} tiles of "
                         f"{cfg.attn_block} slots, a tile a thread, at most {MAX_BYTES} bytes each; "
                         f"{cfg.attn_warps} warps are too few or the tiles too large")  # fmt: skip


def _check_weights(w_next: tuple, n_prog: int) -> None:
    if len(w_next) != N_WEIGHTS:
        raise ValueError(f"MmaConfig.w_prefetch prefetches {N_WEIGHTS} weight tensors, got {len(w_next)}")
    for w in w_next:
        nbytes = w.numel() * w.element_size()
        whole = w.is_contiguous() and w.data_ptr() % 16 == 0 and nbytes % 16 == 0
        if not whole or w.dtype != w_next[0].dtype:
            raise ValueError(f"MmaConfig.w_prefetch needs {N_WEIGHTS} contiguous {w_next[0].dtype} tensors of whole "
                             f"16-byte units; got {tuple(w.shape)} {w.dtype}")  # fmt: skip
        if -(-nbytes // n_prog) > MAX_BYTES:
            raise ValueError(f"MmaConfig.w_prefetch: {nbytes} bytes over {n_prog} programs is over {MAX_BYTES} a "
                             "bulk prefetch; turn it off for so few programs")  # fmt: skip
