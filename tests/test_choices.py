"""parse_choice: members, their values and same-valued members of other str enums pass; anything else
raises naming what was parsed and listing every valid value."""

from __future__ import annotations

from enum import StrEnum

import pytest

from voicehub.choices import parse_choice


class Colour(StrEnum):
    RED = "red"
    DARK_BLUE = "dark_blue"


class Paint(StrEnum):
    RED = "red"


def test_members_values_and_same_valued_members_parse():
    assert parse_choice(Colour, Colour.RED, "colour") is Colour.RED
    assert parse_choice(Colour, "dark_blue", "colour") is Colour.DARK_BLUE
    assert parse_choice(Colour, Paint.RED, "colour") is Colour.RED


@pytest.mark.parametrize("value", ["Red", " red", "blue", "", None, 1, True])
def test_anything_else_lists_the_valid_values(value):
    with pytest.raises(ValueError) as info:
        parse_choice(Colour, value, "colour")
    assert str(info.value) == f"unknown colour {value!r}; valid colours: red, dark_blue"


def test_plural_names_the_list():
    with pytest.raises(ValueError, match=r"^unknown compile 'yes'; valid values: red, dark_blue$"):
        parse_choice(Colour, "yes", "compile", "values")
