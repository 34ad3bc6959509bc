"""Parameter checks shared by every layer: one definition of "an integer" (not a bool), "a
number" (finite or not), and checks that raise a `ValueError` naming the parameter and the
value. Torch-free: the CLI's torch-free paths use it too."""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any, TypeGuard

import numpy as np

__all__ = ["is_int", "is_number", "is_finite_number", "check_int", "check_number", "check_bool", "check_choice"]


def is_int(x: Any) -> TypeGuard[int]:
    """An integer (Python or NumPy), not a bool."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def is_number(x: Any) -> TypeGuard[float]:
    """A real number (Python or NumPy, maybe NaN or infinite), not a bool."""
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def is_finite_number(x: Any) -> TypeGuard[float]:
    """A finite real number, not a bool (an int too large for a float is not finite)."""
    if not is_number(x):
        return False
    try:
        return math.isfinite(float(x))
    except OverflowError:
        return False


def check_int(name: str, value: Any, minimum: int = 1, maximum: int | None = None) -> int:
    """`value` as an `int` when it is an integer in `[minimum, maximum]`.

    Raises
    ------
    ValueError
        Naming `name` and the value.

    Examples
    --------
    >>> check_int("timesteps", 3)
    3
    >>> check_int("timesteps", True)
    Traceback (most recent call last):
    ...
    ValueError: timesteps must be a positive integer, got True
    """
    if not is_int(value) or value < minimum or (maximum is not None and value > maximum):
        what = "a positive integer" if minimum == 1 and maximum is None else f"an integer >= {minimum}"
        if maximum is not None:
            what = f"an integer in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return int(value)


def check_number(
    name: str, value: Any, *, low: float | None = None, high: float | None = None, open_low: bool = True
) -> float:
    """`value` as a `float` when it is a finite number above `low` (or at it, with
    `open_low=False`) and at most `high`.

    Raises
    ------
    ValueError
        Naming `name` and the value.
    """
    ok = is_finite_number(value)
    if ok and low is not None:
        ok = value > low if open_low else value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        lo = "" if low is None else f"{'(' if open_low else '['}{low}, "
        rng = f" in {lo}{high if high is not None else 'inf'}{']' if high is not None else ')'}" if lo else ""
        raise ValueError(f"{name} must be a finite number{rng}, got {value!r}")
    return float(value)


def check_bool(name: str, value: Any) -> bool:
    """`value` when it is `True` or `False`, else a `ValueError` naming `name`."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_choice(name: str, value: Any, choices: Collection[Any]) -> Any:
    """`value` when it is one of `choices`, else a `ValueError` listing them."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value
