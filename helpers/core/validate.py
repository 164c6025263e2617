"""Argument validation for every helper module: one home, one wording (core, all lessons).

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

import math
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

__all__ = [
    "ArgTypeError",
    "answer_number",
    "bool_arg",
    "callable_arg",
    "choice",
    "int_at_least",
    "instance_arg",
    "int_in_range",
    "non_negative_int",
    "non_negative_number",
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


def _checked_int(name: str, value: object, ok: Callable[[int], bool], allowed: str) -> int:
    """Return `value` if it is an int (not a bool) with ok(value); `allowed` words the rule."""
    if not _is_int(value):
        raise ArgTypeError(f"{name} must be {allowed}, got {type(value).__name__} {value!r}")
    if not ok(value):  # type: ignore[arg-type]
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return value  # type: ignore[return-value]


def int_at_least(name: str, value: object, low: int) -> int:
    """Return `value` if it is an int >= `low`; else raise with a message naming `name`."""
    return _checked_int(name, value, lambda v: v >= low, f"an int >= {low}")


def positive_int(name: str, value: object) -> int:
    """Return `value` if it is an int >= 1 (bools are refused)."""
    return _checked_int(name, value, lambda v: v >= 1, "a positive int")


def non_negative_int(name: str, value: object) -> int:
    """Return `value` if it is an int >= 0 (bools are refused)."""
    return _checked_int(name, value, lambda v: v >= 0, "a non-negative int")


def int_in_range(name: str, value: object, low: int, high: int) -> int:
    """Return `value` if it is an int with low <= value <= high."""
    return _checked_int(name, value, lambda v: low <= v <= high, f"an int in [{low}, {high}]")


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


def non_negative_number(name: str, value: object) -> float:
    """Return `value` as a float if it is a real number >= 0 (and finite)."""
    return number_in_range(name, value, 0.0, float("inf"), high_open=True)


def bool_arg(name: str, value: object) -> bool:
    """Return `value` if it is a bool (1 and 0 are refused: a flag is True or False)."""
    if not isinstance(value, bool):
        raise ArgTypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def instance_arg(name: str, value: object, cls: type[T], what: str | None = None) -> T:
    """Return `value` if it is an instance of `cls`; `what` names the type in the message."""
    if not isinstance(value, cls):
        what = what or f"{cls.__module__}.{cls.__qualname__}"
        raise ArgTypeError(f"{name} must be a {what}, got {type(value).__name__}")
    return value


def answer_number(answer: object) -> float | None:
    """A learner's answer as a float if it is a finite real number, else None (never raises).

    For exercise checkers, which answer a wrong type with a hint instead of an error.
    """
    if isinstance(answer, bool) or not isinstance(answer, int | float) or not math.isfinite(answer):
        return None
    return float(answer)


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
