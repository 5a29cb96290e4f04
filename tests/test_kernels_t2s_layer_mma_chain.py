"""The many-row stack's GEMM chain as one kernel a layer (`t2s_layer_mma_chain_triton`, MmaConfig.gemm_chain):
bitwise the three kernels it replaces, its counters left at zero, the configs it refuses. CPU tests run in
Triton's interpreter (programs one by one in order, a tile each); the persistent, cooperative launch is
tested on the GPU (`test_kernels_t2s_layer_mma_gpu.py`, the fields of RESULT_FREE)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_kernels_t2s_layer import N_SLOTS, stack_inputs
from test_kernels_t2s_layer_mma import BLOCKS, LENGTHS, SPLITS, mk  # noqa: F401 (mk: the module fixture)


def _table_kind(mk, split: bool):  # noqa: F811
    # the v3 table's kind of config (prenorm, the out-projection in the attention kernel), tiny blocks
    return mk.MmaConfig(**BLOCKS, attn_tiles=2, prenorm=True, attn_out=True, **(SPLITS if split else {}))


# split-K in every GEMM (ffn2's K span two ffn1 tiles) or whole K; fp32 and fp16
@pytest.mark.parametrize(
    ("dtype", "split"), [(torch.float32, True), (torch.float16, True), (torch.float16, False)]
)
def test_chain_is_bitwise_the_three_kernels_and_leaves_its_counters_at_zero(mk, dtype, split):  # noqa: F811
    # logits, k and v bitwise the unchained stack's (18 rows: two row blocks; cache slots past a row's length
    # NaN, so a stale read shows); twice on one scratch: every counter back at 0
    x, w, k, v, lengths = stack_inputs(len(LENGTHS), dtype, LENGTHS)
    off = _table_kind(mk, split)
    on = dataclasses.replace(off, gemm_chain=True)
    k_want, v_want = k.clone(), v.clone()
    want = mk.decode_stack_mma(x, w, k_want, v_want, lengths, N_SLOTS, config=off)
    scratch = mk.Scratch.allocate(len(LENGTHS), w, k.shape[3], on)
    assert len(scratch.chain) == 7 and not scratch.ticket
    for _ in range(2):
        kc, vc = k.clone(), v.clone()
        got = torch.full_like(want, float("nan"))
        mk.step_rows(scratch, x, w, kc, vc, lengths, N_SLOTS, on, got)
        assert torch.equal(got, want)
        for cache, cache_want in ((kc, k_want), (vc, v_want)):
            torch.testing.assert_close(cache, cache_want, rtol=0, atol=0, equal_nan=True)
        counters = (scratch.chain[1], scratch.chain[3], scratch.chain[5], scratch.chain[6], scratch.row_count)
        assert not any(c.any() for c in counters)
    assert not want.isnan().any()


def test_chain_refuses_configs_it_cannot_run(mk):  # noqa: F811
    table = _table_kind(mk, True)
    for change in ({"prenorm": False, "attn_out": False}, {"attn_out": False}, {"row_groups": 2},
                   {"ffn_tickets": True}, {"ffn_slices": 4}, {"gemm_chain_per_sm": 0}, {"gemm_chain_maxnreg": 8}):  # fmt: skip
        with pytest.raises(ValueError, match="gemm_chain"):
            dataclasses.replace(table, gemm_chain=True, **change)
    assert (
        dataclasses.replace(table, gemm_chain=True, gemm_chain_per_sm=3).gemm_chain_per_sm == 3
    )  # any count an SM
