import pytest

from voicehub.models.gpt_sovits.presets import PRESETS, apply_preset, list_presets


def test_presets_have_the_documented_values():
    assert list_presets() == ["fast", "balanced", "quality"]
    fast = apply_preset("fast")
    assert (fast.speed, fast.sample_steps, fast.top_k, fast.top_p, fast.temperature) == (1.3, 4, 3, 1.0, 0.6)
    balanced = apply_preset("balanced")
    assert (balanced.speed, balanced.sample_steps, balanced.top_k) == (1.1, 4, 5)
    quality = apply_preset("quality")
    assert (quality.speed, quality.sample_steps, quality.top_k, quality.top_p, quality.temperature) == (
        1.0,
        16,
        8,
        0.8,
        0.8,
    )


def test_overrides_replace_only_named_fields_and_leave_the_table_alone():
    tuned = apply_preset("fast", overrides={"sample_steps": 8})
    assert tuned.sample_steps == 8 and tuned.top_k == 3
    assert apply_preset("fast").sample_steps == 4
    assert PRESETS  # the table itself is immutable dataclasses


def test_unknown_names_raise_and_list_choices():
    with pytest.raises(ValueError, match="fast, balanced, quality"):
        apply_preset("turbo")
    with pytest.raises(ValueError, match="unknown preset override"):
        apply_preset("fast", overrides={"steps": 8})
