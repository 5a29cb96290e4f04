"""Choices are `str` enums; this reads one from user input and, for anything else, raises an error
that lists the valid values. Aliases (upstream labels, legacy names) are translated by the callers
that accept them, at their compatibility edge."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, TypeVar

E = TypeVar("E", bound=StrEnum)


def choice_error(enum_cls: type[StrEnum], value: Any, what: str, plural: str | None = None) -> ValueError:
    """ValueError "unknown {what} {value!r}; valid {plural}: a, b, c" (plural defaults to `what` + "s")."""
    valid = ", ".join(member.value for member in enum_cls)
    return ValueError(f"unknown {what} {value!r}; valid {plural or what + 's'}: {valid}")


def parse_choice(enum_cls: type[E], value: Any, what: str, plural: str | None = None) -> E:
    """The member of `enum_cls` that `value` names (a member, its value, or a member of another str enum
    with the same value); else the `choice_error` above, naming `what`."""
    if isinstance(value, enum_cls):
        return value
    try:
        return enum_cls(value.value if isinstance(value, StrEnum) else value)
    except ValueError:
        raise choice_error(enum_cls, value, what, plural) from None
