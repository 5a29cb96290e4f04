"""MmaConfig.kv_prefetch: what each attention program of the many-row stack prefetches of the next layer's
K/V into L2 (`_prefetch_targets`, run in Triton's interpreter: the prefetch instruction itself is inline
PTX, compiled by `compile_sm90.py` and timed and checked bitwise on a GPU by the GPU tests), and the config's
and stage's refusals.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from voicehub.runtime.kernels.t2s_layer_mma_config import RESULT_FREE, MmaConfig

triton = pytest.importorskip(
    "triton", reason="triton is not installed (pip install triton): the prefetch is untested"
)
tl = pytest.importorskip("triton.language")
attention = pytest.importorskip("voicehub.runtime.kernels.t2s_layer_mma_attention_triton")
_prefetch_targets = attention._prefetch_targets

N_ROWS, N_HEAD, MAX_SLOTS, HEAD_DIM = 3, 2, 96, 4
BLOCK_S, TILES = 16, 2  # a program covers 32 slots: 3 splits of the 96-slot cache


@triton.jit
def _probe(kn_ptr, vn_ptr, len_ptr, first_ptr, bytes_ptr, on_ptr, n_slots, pf_slots, skb, skh, sks, svb, svh, svs,
           BLOCK_S: tl.constexpr, TILES: tl.constexpr, LANES: tl.constexpr):  # fmt: skip
    # per program and lane: the value stored at the prefetch's first element (its id), its bytes, on
    split, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    ptrs, nbytes, on = _prefetch_targets(kn_ptr, vn_ptr, len_ptr, b, h, split, n_slots, pf_slots, skb, skh, sks,
                                         svb, svh, svs, BLOCK_S, TILES, LANES)  # fmt: skip
    lane = tl.arange(0, LANES)
    at = ((b * tl.num_programs(1) + h) * tl.num_programs(0) + split) * LANES + lane
    tl.store(first_ptr + at, tl.load(ptrs, mask=on, other=-1.0))
    tl.store(bytes_ptr + at, nbytes)
    tl.store(on_ptr + at, on.to(tl.int32))


def ids(kind: int) -> torch.Tensor:
    """A next-layer cache [B, H, S, D] whose slot's first element names it: kind (0 K, 1 V), row, head, slot."""
    grid = torch.arange(N_ROWS), torch.arange(N_HEAD), torch.arange(MAX_SLOTS)
    b, h, s = torch.meshgrid(*grid, indexing="ij")
    cache = torch.zeros(N_ROWS, N_HEAD, MAX_SLOTS, HEAD_DIM)
    cache[..., 0] = ((kind * N_ROWS + b) * N_HEAD + h) * MAX_SLOTS + s
    return cache


@pytest.mark.parametrize(("n_slots", "pf_slots"), [(96, 96), (96, 16), (64, 40), (96, 0)])
def test_each_program_prefetches_its_span_of_the_next_layer_below_the_length(n_slots, pf_slots):
    # lengths: empty, inside the first tile, past the second split's start; every (row, head) must prefetch K and
    # V of exactly the slots [0, min(length + 1, n_slots, pf_slots)), each slot once, in whole-tile runs
    lanes = 8  # 2 tiles x (K, V) = 4 lanes on, 4 off
    lengths = torch.tensor([0, 9, 47])
    kn, vn = ids(0), ids(1)
    n_splits = MAX_SLOTS // (BLOCK_S * TILES)
    shape = (N_ROWS, N_HEAD, n_splits, lanes)
    first, nbytes = torch.full(shape, -2.0), torch.zeros(shape, dtype=torch.int32)
    on = torch.zeros(shape, dtype=torch.int32)
    _probe[(n_splits, N_HEAD, N_ROWS)](kn, vn, lengths, first, nbytes, on, n_slots, pf_slots, *kn.stride()[:3],
                                       *vn.stride()[:3], BLOCK_S=BLOCK_S, TILES=TILES, LANES=lanes)  # fmt: skip
    for b, h in itertools.product(range(N_ROWS), range(N_HEAD)):
        want = min(int(lengths[b]) + 1, n_slots, pf_slots)
        for kind in (0, 1):
            covered = []
            for split, lane in itertools.product(range(n_splits), range(kind, lanes, 2)):
                if not on[b, h, split, lane]:
                    continue
                slot = int(first[b, h, split, lane]) - ((kind * N_ROWS + b) * N_HEAD + h) * MAX_SLOTS
                size = int(nbytes[b, h, split, lane])
                assert size > 0 and size % 16 == 0 and size % (HEAD_DIM * 4) == 0
                assert slot % BLOCK_S == 0 and split * BLOCK_S * TILES <= slot < (split + 1) * BLOCK_S * TILES
                covered += range(slot, slot + size // (HEAD_DIM * 4))
            assert covered == list(range(want)), (b, h, kind)
    assert (first[on == 0] == -1.0).all()  # an off lane reads nothing


def test_kv_prefetch_counts_tiles_and_is_result_free():
    assert "kv_prefetch" in RESULT_FREE
    assert MmaConfig(kv_prefetch=3).kv_prefetch == 3  # any count, not only powers of two
    with pytest.raises(ValueError, match="kv_prefetch counts tiles"):
        MmaConfig(kv_prefetch=-1)


def test_no_prefetch_without_a_next_layer_or_off_the_gpu():
    k = torch.zeros(2, 16, 64, 32)
    cfg = MmaConfig(kv_prefetch=2, attn_block=128, attn_tiles=8, attn_warps=2)
    assert not attention.prefetches(MmaConfig(), k, (k, k))
    assert not attention.prefetches(cfg, k, None)
    assert not attention.prefetches(cfg, k, (k, k))  # Triton's interpreter: no L2, no inline PTX
