"""The attention and the out-projection as one kernel of tickets (`t2s_attn_out_ticket_triton`,
MmaConfig.out_tickets) against the two kernels, in Triton's interpreter on the CPU (as
test_kernels_t2s_layer_mma.py: tiny shapes, 18 rows in two row blocks, NaN past each row's length)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from t2s_layer_inputs import N_SLOTS, stack_inputs
from test_kernels_t2s_layer_mma import BLOCKS, LENGTHS, SPLITS
from test_kernels_t2s_layer_mma import mk as interpreted_stack

mk = interpreted_stack  # the many-row module, interpreted (that module's fixture)


# the merge path (two 16-slot tiles a program) in fp32, one program per (row, head) in fp16; split-K in the
# other GEMMs, the out-projection whole (its tiles do all of K)
@pytest.mark.parametrize(("dtype", "tiles"), [(torch.float32, 2), (torch.float16, 8)])
def test_ticketed_attention_and_out_proj_are_bitwise_the_two_kernels(mk, dtype, tiles):
    # the stack's logits bitwise those of the attention kernel then the out-projection kernel (prenorm),
    # twice on one scratch (the ready, passed and row-block counters back at 0), and a row alone
    # (other buckets too) bitwise the same row among 18
    x, w, k, v, lengths = stack_inputs(len(LENGTHS), dtype, LENGTHS)
    off = mk.MmaConfig(**BLOCKS, attn_tiles=tiles, prenorm=True, **{**SPLITS, "out_splits": 1})
    on = dataclasses.replace(off, out_tickets=True)
    want = mk.decode_stack_mma(x, w, k.clone(), v.clone(), lengths, N_SLOTS, config=off)
    assert not want.isnan().any()
    s = mk.Scratch.allocate(len(LENGTHS), w, k.shape[3], on)
    assert s.out_sync.numel() == 2 * 2  # a ready and a passed counter per row block
    for _ in range(2):
        got = torch.full_like(want, float("nan"))
        mk.step_rows(s, x, w, k.clone(), v.clone(), lengths, N_SLOTS, on, got)
        assert torch.equal(got, want)
        assert not s.out_sync.any() and not s.row_count.any()
    for row, n_slots in ((3, N_SLOTS), (3, 48), (17, N_SLOTS)):
        one = slice(row, row + 1)
        alone = mk.decode_stack_mma(x[one], w, k[:, one].clone(), v[:, one].clone(), lengths[one], n_slots,
                                    config=on)  # fmt: skip
        assert torch.equal(alone[0], want[row]), (row, n_slots)


def test_ticketed_out_proj_needs_what_its_tiles_do(mk):
    for bad in ({}, {"prenorm": True, "attn_out": True}, {"prenorm": True, "out_splits": 2}):
        with pytest.raises(ValueError, match="out_tickets needs prenorm, attn_out off and out_splits 1"):
            mk.MmaConfig(**BLOCKS, out_tickets=True, **bad)
    # its register cap: only with out_tickets, and one ptxas can take
    for bad in ({"out_tickets_regs": 128}, {"prenorm": True, "out_tickets": True, "out_tickets_regs": 16}):
        with pytest.raises(ValueError, match="out_tickets_regs needs out_tickets and 32..255 registers"):
            mk.MmaConfig(**BLOCKS, **bad)
    assert (
        mk.MmaConfig(**BLOCKS, prenorm=True, out_tickets=True, out_tickets_regs=168).out_tickets_regs == 168
    )
    assert (
        mk.Scratch.allocate(
            3, stack_inputs(3, torch.float32, LENGTHS[:3])[1], 80, mk.MmaConfig()
        ).out_sync.numel()
        == 1
    )
