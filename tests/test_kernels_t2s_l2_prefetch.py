"""MmaConfig.kv_prefetch / w_prefetch: what each attention program of the many-row stack prefetches into L2 of
the next layer's K/V (`kv_targets`) and of the next GEMMs' weights (`weight_targets`), run in Triton's
interpreter (the prefetch instruction itself is inline PTX: `compile_sm90.py` compiles it, the GPU tests hold
the stack to the table's bits with it), and the config's and stage's refusals.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from voicehub.runtime.kernels.t2s_layer_mma_config import RESULT_FREE, MmaConfig

triton = pytest.importorskip(
    "triton", reason="triton is not installed (pip install triton): the prefetch is untested"
)
tl = pytest.importorskip("triton.language")
l2 = pytest.importorskip("voicehub.runtime.kernels.t2s_l2_prefetch_triton")
kv_targets, weight_targets = l2.kv_targets, l2.weight_targets

N_ROWS, N_HEAD, MAX_SLOTS, HEAD_DIM = 3, 2, 96, 4
BLOCK_S, TILES = 16, 2  # a program covers 32 slots: 3 splits of the 96-slot cache


@triton.jit
def _probe(kn_ptr, vn_ptr, len_ptr, first_ptr, bytes_ptr, on_ptr, n_slots, pf_slots, skb, skh, sks, svb, svh, svs,
           BLOCK_S: tl.constexpr, TILES: tl.constexpr, LANES: tl.constexpr):  # fmt: skip
    # per program and lane: the value stored at the prefetch's first element (its id), its bytes, on
    split, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    ptrs, nbytes, on = kv_targets(kn_ptr, vn_ptr, len_ptr, b, h, split, n_slots, pf_slots, skb, skh, sks, svb, svh,
                                  svs, BLOCK_S, TILES, LANES)  # fmt: skip
    lane = tl.arange(0, LANES)
    at = ((b * tl.num_programs(1) + h) * tl.num_programs(0) + split) * LANES + lane
    tl.store(first_ptr + at, tl.load(ptrs, mask=on, other=-1.0))
    tl.store(bytes_ptr + at, nbytes)
    tl.store(on_ptr + at, on.to(tl.int32))


@triton.jit
def _weights_probe(
    w1_ptr, w2_ptr, w3_ptr, w4_ptr, n1, n2, n3, n4, first_ptr, bytes_ptr, on_ptr, LANES: tl.constexpr
):
    # per program of a (split, head, row) grid as the attention's, and lane: the value at the prefetch's first
    # element (its index in its tensor), its bytes, on
    split, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    ptrs, nbytes, on = weight_targets(w1_ptr, w2_ptr, w3_ptr, w4_ptr, n1, n2, n3, n4, split, h, b, LANES)
    at = ((b * tl.num_programs(1) + h) * tl.num_programs(0) + split) * LANES + tl.arange(0, LANES)
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


@pytest.mark.parametrize(("n_slots", "pf_slots"), [(96, 96), (96, 16), (64, 40), (40, 96), (96, 0)])
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


@pytest.mark.parametrize("grid", [(1, 1, 1), (5, 1, 1), (1, 2, 3), (3, 4, 25)])
def test_the_programs_prefetch_every_weight_byte_once(grid):
    # four tensors (fp32 ids 0..n-1) of 4,096 / 1,000 / 12 / 4 elements over the programs of a (split, head, row)
    # grid: shares of 16-byte multiples, the programs past the end off; lanes 4+ always off
    lanes, n_prog = 8, grid[0] * grid[1] * grid[2]
    weights = [torch.arange(n, dtype=torch.float32) for n in (4096, 1000, 12, 4)]
    sizes = [w.numel() * 4 for w in weights]
    first = torch.full((n_prog, lanes), -2.0)
    nbytes, on = torch.zeros(n_prog, lanes, dtype=torch.int32), torch.zeros(n_prog, lanes, dtype=torch.int32)
    _weights_probe[grid](*weights, *sizes, first, nbytes, on, LANES=lanes)
    assert not on[:, 4:].any()
    for r, w in enumerate(weights):
        covered = []
        for p in range(n_prog):
            if on[p, r]:
                size = int(nbytes[p, r])
                assert size > 0 and size % 16 == 0
                start = int(first[p, r])
                covered += range(start, start + size // 4)
        assert covered == list(range(w.numel())), r
    assert (first[on == 0] == -1.0).all()


def test_kv_prefetch_counts_tiles_and_is_result_free():
    assert {"kv_prefetch", "kv_prefetch_own", "w_prefetch"} <= RESULT_FREE
    assert MmaConfig(kv_prefetch=3).kv_prefetch == 3  # any count, not only powers of two
    with pytest.raises(ValueError, match="kv_prefetch counts tiles"):
        MmaConfig(kv_prefetch=-1)


def test_no_prefetch_without_a_next_layer_or_off_the_gpu():
    w = torch.zeros(64, 32)
    assert not l2.weights_prefetched(MmaConfig(), (w,) * 4, 16)
    assert not l2.weights_prefetched(MmaConfig(w_prefetch=True), None, 16)
    assert not l2.weights_prefetched(MmaConfig(w_prefetch=True), (w,) * 4, 16)  # the interpreter: none
    k = torch.zeros(2, 16, 64, 32)
    cfg = MmaConfig(kv_prefetch=2, attn_block=128, attn_tiles=8, attn_warps=2)
    assert not l2.kv_prefetched(MmaConfig(), (k, k), (k, k))
    assert not l2.kv_prefetched(cfg, (k, k), None)
    assert not l2.kv_prefetched(cfg, (k, k), (k, k))  # Triton's interpreter: no L2, no inline PTX
    assert not l2.kv_own_prefetched(dataclasses.replace(cfg, kv_prefetch_own=True), (k, k))
    l2.check_device(cfg, torch.device("cpu"))  # nothing to refuse off the GPU


def test_a_prefetch_the_gpu_or_the_instruction_cannot_take_raises(monkeypatch):
    # a GPU before sm_90 (checked before any kernel launches), a next layer's cache of another shape or layout,
    # tiles over one bulk prefetch's 1 MiB - 16 bytes, too few lanes, a weight share over it, odd weight sizes
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))
    with pytest.raises(
        ValueError, match="kv_prefetch and MmaConfig.w_prefetch|kv_prefetch and w_prefetch need sm_90"
    ):
        l2.check_device(MmaConfig(kv_prefetch=1, w_prefetch=True), torch.device("cuda"))
    with pytest.raises(ValueError, match="kv_prefetch_own need sm_90"):
        l2.check_device(MmaConfig(kv_prefetch_own=True), torch.device("cuda"))
    l2.check_device(MmaConfig(), torch.device("cuda"))  # nothing asked: nothing refused
    k = torch.zeros(2, 16, 64, 32, dtype=torch.float16)
    cfg = MmaConfig(kv_prefetch=2, attn_block=128, attn_tiles=8, attn_warps=2)
    l2._check_kv(cfg, (k, k), (k.clone(), k.clone()), "kv_prefetch")
    wider = torch.zeros(2, 16, 128, 32, dtype=torch.float16)[
        :, :, :64
    ]  # k's shape, slots as runs, other strides
    others = (
        torch.zeros(3, 16, 64, 32, dtype=torch.float16),
        k.transpose(1, 2).contiguous().transpose(1, 2),
        wider,
    )
    for other in others:
        with pytest.raises(ValueError, match="shaped and laid out"):
            l2._check_kv(cfg, (k, k), (k, other), "kv_prefetch")
    with pytest.raises(ValueError, match="too few or the tiles too large"):
        l2._check_kv(MmaConfig(kv_prefetch=1, attn_block=1 << 15), (k, k), (k, k), "kv_prefetch")
    with pytest.raises(ValueError, match="too few or the tiles too large"):
        l2._check_kv(dataclasses.replace(cfg, attn_warps=1, attn_tiles=32), (k, k), (k, k), "kv_prefetch_own")
    w = torch.zeros(1024, 512, dtype=torch.float16)  # 1 MiB
    l2._check_weights((w,) * 4, 2)
    with pytest.raises(ValueError, match="over 1048560 a bulk prefetch"):
        l2._check_weights((w,) * 4, 1)
    with pytest.raises(ValueError, match="16-byte units"):
        l2._check_weights((w, w, w, torch.zeros(3, dtype=torch.float16)), 16)
