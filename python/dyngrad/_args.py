"""Argument type checks for the Python-side constructors (TypeError naming the argument): nanobind converts
some wrong types silently (a str where an int is expected), so the wrappers check first."""
from __future__ import annotations

import numbers


def check_ints(who: str, **values) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{who}: {name} must be an int, got {type(value).__name__} {value!r}")


def check_numbers(who: str, **values) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{who}: {name} must be a number, got {type(value).__name__} {value!r}")


def check_bools(who: str, **values) -> None:
    for name, value in values.items():
        if not isinstance(value, bool):
            raise TypeError(f"{who}: {name} must be a bool, got {type(value).__name__} {value!r}")
