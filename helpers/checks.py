"""Argument checks for every helper module: one home, one wording (core, all lessons).

Each check returns the value it accepted, so it reads inline::

    micro_batch = positive_int("micro_batch", micro_batch)
    policy = choice("policy", policy, POLICIES)

A value of the wrong type raises `ArgTypeError`, which is a `TypeError` and also a
`ValueError`, so code that treats every bad argument as a `ValueError` keeps working.
A value of the right type but out of range raises `ValueError`. Every message names
the argument, shows the value given, and says what is allowed.

`bool` is never accepted where an int is asked for (``True`` is an int to Python,
but ``micro_batch=True`` is always a mistake).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

__all__ = [
    "ArgTypeError",
    "callable_arg",
    "choice",
    "int_at_least",
    "int_in_range",
    "non_negative_int",
    "number_in_range",
    "positive_int",
    "positive_number",
    "tensor_arg",
]

T = TypeVar("T")


class ArgTypeError(TypeError, ValueError):
    """An argument of the wrong type (a TypeError, and a ValueError for older callers)."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def int_at_least(name: str, value: object, low: int) -> int:
    """Return `value` if it is an int >= `low`; else raise with a message naming `name`."""
    if not _is_int(value):
        raise ArgTypeError(f"{name} must be an int >= {low}, got {type(value).__name__} {value!r}")
    if value < low:  # type: ignore[operator]
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return value  # type: ignore[return-value]


def positive_int(name: str, value: object) -> int:
    """Return `value` if it is an int >= 1 (bools are refused)."""
    if not _is_int(value):
        raise ArgTypeError(f"{name} must be a positive int, got {type(value).__name__} {value!r}")
    if value < 1:  # type: ignore[operator]
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value  # type: ignore[return-value]


def non_negative_int(name: str, value: object) -> int:
    """Return `value` if it is an int >= 0 (bools are refused)."""
    if not _is_int(value):
        raise ArgTypeError(f"{name} must be a non-negative int, got {type(value).__name__} {value!r}")
    if value < 0:  # type: ignore[operator]
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return value  # type: ignore[return-value]


def int_in_range(name: str, value: object, low: int, high: int) -> int:
    """Return `value` if it is an int with low <= value <= high."""
    if not _is_int(value):
        raise ArgTypeError(f"{name} must be an int in [{low}, {high}], got {type(value).__name__} {value!r}")
    if not low <= value <= high:  # type: ignore[operator]
        raise ValueError(f"{name} must be an int in [{low}, {high}], got {value!r}")
    return value  # type: ignore[return-value]


def number_in_range(
    name: str, value: object, low: float, high: float, *, low_open: bool = False, high_open: bool = False
) -> float:
    """Return `value` as a float if it is a real number in the interval (ends open or closed)."""
    left, right = "(" if low_open else "[", ")" if high_open else "]"
    allowed = f"a number in {left}{low}, {high}{right}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ArgTypeError(f"{name} must be {allowed}, got {type(value).__name__} {value!r}")
    ok_low = value > low if low_open else value >= low
    ok_high = value < high if high_open else value <= high
    if not (ok_low and ok_high):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return float(value)


def positive_number(name: str, value: object) -> float:
    """Return `value` as a float if it is a real number > 0 (and finite)."""
    return number_in_range(name, value, 0.0, float("inf"), low_open=True, high_open=True)


def choice(name: str, value: object, choices: Sequence[T]) -> T:
    """Return `value` if it is one of `choices`; else raise listing them."""
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not allowed; choose one of {tuple(choices)}")
    return value  # type: ignore[return-value]


def callable_arg(name: str, value: object, what: str = "a callable") -> Callable[..., object]:
    """Return `value` if it is callable; `what` describes the expected call, for the message."""
    if not callable(value):
        raise ArgTypeError(f"{name} must be {what}, got {type(value).__name__}")
    return value


def tensor_arg(name: str, value: object) -> torch.Tensor:
    """Return `value` if it is a torch.Tensor."""
    if not isinstance(value, torch.Tensor):
        raise ArgTypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value
