"""The many-row stack's config table (`t2s_layer_mma_config`): the batch and the KV bucket change only
RESULT_FREE fields (BUCKET_CHANGES)."""

from __future__ import annotations

import dataclasses

import pytest

from voicehub.runtime.kernels import t2s_layer_mma_config as mc
from voicehub.runtime.kernels.t2s_layer_mma_config import BucketChange

SHAPE = (64, 256, 4, 1025)  # dim, ffn_dim, n_head, vocab: not in the shipped table


@pytest.fixture
def table(monkeypatch):
    """A table entry for SHAPE (the shipped one untouched) whose BUCKET_CHANGES the test sets."""
    entry = mc.MmaConfig(block_k=64, gemm_stages=2, row_groups=2, group_rows=32)
    monkeypatch.setitem(mc.CONFIGS, SHAPE, entry)
    return entry


def test_bucket_changes_apply_the_first_that_holds_the_step(table, monkeypatch):
    changes = (
        BucketChange(384, {"gemm_stages": 3}, min_rows=33, max_rows=64),
        BucketChange(512, {"row_groups": 1}),
    )
    monkeypatch.setitem(mc.BUCKET_CHANGES, SHAPE, changes)
    stages3, one_group = dataclasses.replace(table, gemm_stages=3), dataclasses.replace(table, row_groups=1)
    assert mc.config_for(*SHAPE, 64, 256) == stages3
    assert mc.config_for(*SHAPE, 33, 384) == stages3
    assert mc.config_for(*SHAPE, 32, 384) == one_group  # fewer rows than the first holds: the next
    assert mc.config_for(*SHAPE, 65, 384) == one_group
    assert mc.config_for(*SHAPE, 64, 512) == one_group
    assert mc.config_for(*SHAPE, 1, 512) == one_group  # no upper bound on rows
    assert mc.config_for(*SHAPE, 128, 768) == table
    assert mc.config_for(*SHAPE) == table  # no step given: the entry
    with pytest.raises(ValueError, match="n_rows and n_slots together"):
        mc.config_for(*SHAPE, 64)


def test_bucket_changes_apply_to_the_default_config_of_a_shape_without_an_entry(monkeypatch):
    monkeypatch.setitem(mc.BUCKET_CHANGES, SHAPE, (BucketChange(512, {"row_groups": 2}),))
    default = mc.config_for(*SHAPE)
    assert SHAPE not in mc.CONFIGS and default.row_groups == 1
    assert mc.config_for(*SHAPE, 16, 512) == dataclasses.replace(default, row_groups=2)


@pytest.mark.parametrize(
    ("args", "message"),
    [((512, {"gemm_stages": 3, "block_k": 32}), r"\['block_k'\], fields outside RESULT_FREE"),
     ((512, {}), "changes no field"), ((0, {"gemm_stages": 3}), "max_slots >= 1"),
     ((512, {"gemm_stages": 3}, 0), "1 <= min_rows"), ((512, {"gemm_stages": 3}, 64, 33), "min_rows <= max_rows"),
     ((512, {"gemm_stages": 3}, 1, 0), "min_rows <= max_rows")],
)  # fmt: skip
def test_bucket_change_refuses_value_changing_fields_and_empty_bounds(args, message):
    with pytest.raises(ValueError, match=message):
        BucketChange(*args)


def test_shipped_bucket_changes_apply_to_their_entries_and_change_something():
    for key, changes in mc.BUCKET_CHANGES.items():
        assert key in mc.CONFIGS
        for bucket in changes:
            assert mc.config_for(*key, bucket.min_rows, bucket.max_slots) != mc.CONFIGS[key]
