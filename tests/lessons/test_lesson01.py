"""helpers.lessons.lesson01 (lesson 01): the explainer's calculator and the measured rows."""

from __future__ import annotations

import dataclasses

import matplotlib.pyplot as plt
import pytest
import torch

from helpers.core.device import SCALES
from helpers.lessons import lesson01
from helpers.lessons.lesson01 import (
    budget_row,
    check_exercise_1,
    check_exercise_2,
    check_exercise_3,
    drawn_budget,
    explainer_table,
    lesson_sizes,
    predicted_peak_bytes,
    widget_latency_cases,
)
from helpers.measure.formulas import activation_bytes_per_example
from helpers.models.gpt import GPT, explainer_config
from helpers.techniques.update_memory import ConfigMemory

CPU = torch.device("cpu")


def test_calculator_reproduces_the_explainer() -> None:
    rows = explainer_table()
    assert [r.peak_gb for r in rows] == [23.5, 20.3, 18.5]
    assert [r.effective_batch for r in rows] == [32, 32, 32]
    assert rows[0].headroom_gb == pytest.approx(0.5)


def test_calculator_validates() -> None:
    with pytest.raises(ValueError, match="micro_batch must be a positive int, got 0"):
        budget_row(0, 4, 1.0)
    with pytest.raises(ValueError, match="steps"):
        budget_row(4, -1, 1.0)
    with pytest.raises(ValueError, match=r"activations_gb must be a number in \[0"):
        budget_row(4, 1, -1.0)
    with pytest.raises(ValueError, match=r"capacity_gb must be a number in \(0"):
        budget_row(4, 1, 1.0, capacity_gb=0)
    with pytest.raises(TypeError, match="steps must be a positive int, got bool"):
        budget_row(4, True, 1.0)


def test_drawn_budget_stands_to_the_tightest_row_as_24_to_23_5() -> None:
    assert drawn_budget(23.5) == pytest.approx(24.0)
    assert (drawn_budget(1000) - 1000) / drawn_budget(1000) == pytest.approx(0.5 / 24)
    with pytest.raises(ValueError, match=r"tightest_peak_bytes must be a number in \(0"):
        drawn_budget(0)
    with pytest.raises(TypeError, match="number"):
        drawn_budget(True)


def test_every_scale_has_its_own_sizes() -> None:
    for scale in SCALES:
        cfg, sizes = explainer_config(scale), lesson_sizes(scale)
        assert cfg.dropout == 0.0 and len(sizes.micro_batches) >= 5
        assert isinstance(predicted_peak_bytes(scale), int)
    assert explainer_config("medium") != explainer_config("small")
    with pytest.raises(ValueError, match="scale='huge'"):
        lesson_sizes("huge")


def test_exercise_checkers_answer_without_raising() -> None:
    assert check_exercise_1().count("no answer yet") == 2
    wrong = check_exercise_1(floor_bytes=1, per_example_bytes="a lot")
    assert "too low" in wrong and "give a number" in wrong
    cfg = dataclasses.replace(explainer_config("small"), d_model=128)
    n = sum(p.numel() for p in GPT(cfg).parameters())
    tensors = len(list(GPT(cfg).parameters()))
    per_example = activation_bytes_per_example(cfg)
    right = check_exercise_1(floor_bytes=16 * n + 4 * tensors, per_example_bytes=per_example)
    assert right.count("Correct") == 2
    assert check_exercise_2(1.0).startswith("Correct") and not check_exercise_2(2.0).startswith("Correct")
    assert "No answer" in check_exercise_2() and "Give a number" in check_exercise_2("one")
    assert check_exercise_3(16.675).startswith("Correct") and check_exercise_3(16.7).startswith("Correct")
    assert not check_exercise_3(20.3).startswith("Correct") and "No answer" in check_exercise_3()
    assert "Give a number" in check_exercise_3(True)


def test_widget_cases_cover_every_control(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    import matplotlib.pyplot as plt

    from helpers.core import plots

    figures = []
    monkeypatch.setattr(plots, "show", lambda fig: (figures.append(fig), plt.close(fig)))
    cases = widget_latency_cases("tiny", CPU)
    assert set(cases) == {"B=1", "B=8", "K=1", "K=8", "optimizer sgd", "optimizer adam"}
    for fn in cases.values():
        fn()
    out = capsys.readouterr().out
    assert "effective batch B x K = 4 x 8 = 32" in out and "effective batch B x K = 8 x 8 = 64" in out
    assert len(figures) == len(cases)  # one figure per move
    with pytest.raises(ValueError, match="scale='huge'"):
        widget_latency_cases("huge", CPU)


def test_budget_line_is_labelled_as_a_drawn_24_gb_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    shown = []
    monkeypatch.setattr(lesson01, "show", shown.append)
    rows = [ConfigMemory(8, 2, 300, 200, 80, 20, "cpu-tracker"),
            ConfigMemory(4, 4, 200, 100, 80, 20, "cpu-tracker")]
    lesson01.plot_measured_table(rows, budget=250.0)
    (fig,) = shown
    texts = [t.get_text() for t in fig.axes[0].texts]
    plt.close(fig)
    assert any(t.startswith("24 GB budget") and t.endswith("(drawn)") for t in texts), texts
