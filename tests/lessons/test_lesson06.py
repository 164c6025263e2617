"""helpers.lessons.lesson06 (lesson 06): the model, the capped run, protocol, widget, diagram, checkers."""

from __future__ import annotations

import pytest
import torch
from support.profiles import CKPT, PLAIN

from helpers.lessons import lesson06
from helpers.measure.memory import run_capped
from helpers.techniques.phases import UpdateMeasurer

CPU = torch.device("cpu")


def test_run_capped_needs_cuda() -> None:
    with pytest.raises(ValueError, match="CUDA"):
        run_capped(lambda: None, 1e9, CPU)


# -- the lesson model, protocol, widget, diagram, checkers -------------------------------------
def test_lesson_config_and_model_leave_the_rng_alone() -> None:
    with pytest.raises(ValueError, match="scale='huge'"):
        lesson06.lesson_config("huge")
    state = torch.random.get_rng_state()
    a = lesson06.lesson_model("tiny", CPU)
    assert torch.equal(state, torch.random.get_rng_state())
    b = lesson06.lesson_model("tiny", CPU)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_predicted_peak_is_above_the_measured_tiny_run() -> None:
    model = lesson06.lesson_model("tiny", CPU)
    measured = UpdateMeasurer(model)(*lesson06.LARGEST_RUN)
    assert measured.peak_bytes <= lesson06.predicted_peak_bytes("tiny")


def test_widget_cases_run_at_tiny(capsys: pytest.CaptureFixture[str]) -> None:
    cases = lesson06.widget_latency_cases("tiny", CPU)
    assert {"B=1", "B=16", "K=1", "K=8", "checkpoint on", "budget below floor"} <= set(cases)
    cases["budget below floor"]()
    out = capsys.readouterr().out
    assert "effective batch B x K = 4 x 8 = 32" in out and "Nothing fits" in out
    cases["checkpoint on"]()
    assert "planner for an effective batch of 32" in capsys.readouterr().out


def test_decision_diagram(tmp_path) -> None:  # noqa: ANN001
    import matplotlib.pyplot as plt

    path = tmp_path / "diagram.png"
    fig = lesson06.draw_decision_diagram(str(path))
    plt.close(fig)
    assert path.stat().st_size > 10_000


def test_exercise_checkers(capsys: pytest.CaptureFixture[str]) -> None:
    assert lesson06.check_exercise_1(4, 8, True).startswith("Correct")
    assert lesson06.check_exercise_1(4, 8, False).startswith("Close")
    assert lesson06.check_exercise_1(2, 16, False).startswith("Not yet")
    assert lesson06.check_exercise_2(10.875).startswith("Correct")
    assert lesson06.check_exercise_2(14.5).startswith("Not yet")
    assert lesson06.check_exercise_2("ten").startswith("Give a number")  # type: ignore[arg-type]
    answer = min(PLAIN.predict_peak(1, accumulation_steps=32), CKPT.predict_peak(1, accumulation_steps=32))
    assert lesson06.check_exercise_3(answer, PLAIN, CKPT).startswith("Correct")
    assert lesson06.check_exercise_3(2 * answer, PLAIN, CKPT).startswith("Not yet")
    assert "Correct" in capsys.readouterr().out
