"""Tests of helpers.lessons.lesson04: sizes, the predicted peak, the widgets and the exercise checkers."""

from __future__ import annotations

import pytest
import torch

from helpers.lessons import lesson04


def test_bn_error_by_steps_and_widgets(capsys) -> None:
    errors = lesson04.bn_error_by_steps(4, 4, "batch")
    assert set(errors) == {1, 2, 4, 8} and errors[1] < 1e-5 and errors[4] > 0.01
    assert max(lesson04.bn_error_by_steps(2, 3, "group").values()) < 1e-4
    lesson04.show_bn_error(2, 4, "batch")
    assert "effective batch B x K = 8" in capsys.readouterr().out
    lesson04.show_schedule(4)
    assert "effective batch B x K = 32" in capsys.readouterr().out


def test_widget_latency_cases_run(capsys) -> None:
    cases = lesson04.widget_latency_cases("tiny", torch.device("cpu"))
    assert {"B=1", "norm group", "schedule K=16"} <= set(cases)
    for fn in cases.values():
        fn()
    assert "effective batch" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("check", "right", "wrong"),
    [
        (lesson04.check_exercise_1, ("running_mean",), ("running_var",)),
        (lesson04.check_exercise_2, (4,), (8,)),
        (lesson04.check_exercise_3, (True,), (False,)),
        (lesson04.check_exercise_4, (True, 2.0**23), (False, 2.0**24)),
    ],
)
def test_exercise_checkers(check, right, wrong, capsys) -> None:
    assert check(*right).startswith("Correct")
    assert check(*wrong).startswith("Not yet")
    assert check(*[None] * len(right)).startswith("Not yet")  # never raises on odd input


def test_bn_error_by_steps_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(123)
    want = torch.rand(3)
    torch.manual_seed(123)
    lesson04.bn_error_by_steps(2, 2, "batch", width=4, depth=2, size=8)
    assert torch.equal(torch.rand(3), want)


@pytest.mark.parametrize(("call", "match"), [
    (lambda: lesson04.bn_error_by_steps(0, 4), "micro_batch must be"),
    (lambda: lesson04.lesson_sizes("huge"), "scale='huge'"),
])
def test_bad_arguments_raise_value_error(call, match: str) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match=match):
        call()
