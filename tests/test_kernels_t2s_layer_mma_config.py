"""The many-row stack's config table (`t2s_layer_mma_config`): the KV bucket changes only RESULT_FREE fields."""

from __future__ import annotations

import dataclasses

import pytest

from voicehub.runtime.kernels import t2s_layer_mma_config as mc

SHAPE = (64, 256, 4, 1025)  # dim, ffn_dim, n_head, vocab: not in the shipped table


@pytest.fixture
def table(monkeypatch):
    """A table entry for SHAPE (the shipped one untouched) whose SLOT_CHANGES the test sets."""
    entry = mc.MmaConfig(block_k=64, gemm_stages=2, row_groups=2, group_rows=32)
    monkeypatch.setitem(mc.CONFIGS, SHAPE, entry)
    return entry


def test_slot_changes_apply_to_the_first_bound_holding_the_bucket(table, monkeypatch):
    monkeypatch.setitem(mc.SLOT_CHANGES, SHAPE, ((384, {"gemm_stages": 3}), (512, {"row_groups": 1})))
    assert mc.config_for(*SHAPE, 256) == dataclasses.replace(table, gemm_stages=3)
    assert mc.config_for(*SHAPE, 384) == dataclasses.replace(table, gemm_stages=3)
    assert mc.config_for(*SHAPE, 512) == dataclasses.replace(table, row_groups=1)
    assert mc.config_for(*SHAPE, 768) == table
    assert mc.config_for(*SHAPE) == table  # no bucket given: the entry


def test_slot_changes_refuse_a_field_that_changes_values(table, monkeypatch):
    monkeypatch.setitem(mc.SLOT_CHANGES, SHAPE, ((512, {"gemm_stages": 3, "block_k": 32}),))
    with pytest.raises(ValueError, match=r"\['block_k'\].*outside RESULT_FREE"):
        mc.config_for(*SHAPE, 256)


def test_shipped_slot_changes_are_result_free_and_keyed_by_table_entries():
    for key, changes in mc.SLOT_CHANGES.items():
        assert key in mc.CONFIGS
        mc.check_slot_changes(changes)
        bounds = [most for most, _ in changes]
        assert bounds == sorted(bounds), "the first bound holding a bucket wins: keep them ascending"
