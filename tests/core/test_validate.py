"""helpers.core.validate: wrong types raise TypeError, bad values ValueError, with clear messages."""

from __future__ import annotations

import math

import pytest
import torch

from helpers.core import validate


@pytest.mark.parametrize("fn", [validate.positive_int, validate.non_negative_int])
@pytest.mark.parametrize("bad", [True, 2.0, "3", None])
def test_int_checks_refuse_other_types(fn, bad) -> None:  # noqa: ANN001
    with pytest.raises(TypeError, match=f"x must be .*int, got {type(bad).__name__}"):
        fn("x", bad)
    with pytest.raises(ValueError):  # still a ValueError for callers that catch bad arguments as one
        fn("x", bad)


def test_positive_int() -> None:
    assert validate.positive_int("n", 3) == 3
    with pytest.raises(ValueError, match="n must be a positive int, got 0") as info:
        validate.positive_int("n", 0)
    assert not isinstance(info.value, TypeError)


def test_non_negative_and_ranges() -> None:
    assert validate.non_negative_int("seed", 0) == 0
    with pytest.raises(ValueError, match="seed must be a non-negative int, got -1"):
        validate.non_negative_int("seed", -1)
    assert validate.int_at_least("k", 2, 2) == 2
    with pytest.raises(ValueError, match="k must be an int >= 2, got 1"):
        validate.int_at_least("k", 1, 2)
    assert validate.int_in_range("k", 4, 1, 4) == 4
    with pytest.raises(ValueError, match=r"k must be an int in \[1, 4\], got 5"):
        validate.int_in_range("k", 5, 1, 4)
    with pytest.raises(TypeError):
        validate.int_in_range("k", False, 0, 4)


def test_numbers() -> None:
    assert validate.number_in_range("p", 0.5, 0, 1, high_open=True) == 0.5
    assert validate.number_in_range("p", 0, 0, 1) == 0.0
    with pytest.raises(ValueError, match=r"p must be a number in \[0, 1\), got 1"):
        validate.number_in_range("p", 1, 0, 1, high_open=True)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        validate.number_in_range("p", 0, 0, 1, low_open=True)
    with pytest.raises(TypeError):
        validate.number_in_range("p", True, 0, 1)
    assert validate.positive_number("lr", 1e-3) == 1e-3
    for bad in (0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="lr must be a number in"):
            validate.positive_number("lr", bad)


def test_choice_callable_tensor() -> None:
    assert validate.choice("opt", "adam", ("sgd", "adam")) == "adam"
    with pytest.raises(ValueError, match=r"opt='lion' is not allowed; choose one of \('sgd', 'adam'\)"):
        validate.choice("opt", "lion", ("sgd", "adam"))
    assert validate.callable_arg("fn", len) is len
    with pytest.raises(TypeError, match="fn must be a zero-argument callable, got int"):
        validate.callable_arg("fn", 3, "a zero-argument callable")
    t = torch.zeros(2)
    assert validate.tensor_arg("x", t) is t
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        validate.tensor_arg("x", [1.0])


def test_non_negative_number_bool_instance() -> None:
    assert validate.non_negative_number("gb", 0) == 0.0
    with pytest.raises(ValueError, match=r"gb must be a number in \[0.0, inf\), got -1"):
        validate.non_negative_number("gb", -1)
    with pytest.raises(TypeError, match="gb must be a number"):
        validate.non_negative_number("gb", True)
    assert validate.bool_arg("flag", False) is False
    with pytest.raises(TypeError, match="flag must be a bool, got int 1"):
        validate.bool_arg("flag", 1)
    module = torch.nn.Linear(1, 1)
    assert validate.instance_arg("model", module, torch.nn.Module, "torch.nn.Module") is module
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got str"):
        validate.instance_arg("model", "m", torch.nn.Module, "torch.nn.Module")
    with pytest.raises(ValueError, match="must be a torch.nn.modules.module.Module"):
        validate.instance_arg("model", 3, torch.nn.Module)


@pytest.mark.parametrize("answer, expected", [(3, 3.0), (2.5, 2.5), (True, None), ("3", None),
                                              (None, None), (math.inf, None), (math.nan, None)])
def test_answer_number_never_raises(answer: object, expected: float | None) -> None:
    assert validate.answer_number(answer) == expected
