"""helpers.lessons: the per-lesson protocol, the shared exercise verdict and the lesson discovery."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from helpers.core.device import SCALES
from helpers.lessons import LessonModule, exercise_checkers, lesson_modules, verdict

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def test_lesson_modules_are_the_notebooks_lessons_in_order() -> None:
    names = [m.__name__.rsplit(".", 1)[1] for m in lesson_modules()]
    numbers = sorted({p.name[:2] for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")} - {"00"})
    assert names == [f"lesson{n}" for n in numbers]


@pytest.mark.parametrize("module", lesson_modules(), ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_every_lesson_module_follows_the_protocol(module: object) -> None:
    assert isinstance(module, LessonModule)
    for scale in SCALES:
        sizes = module.lesson_sizes(scale)
        assert dataclasses.is_dataclass(sizes) and type(sizes).__dataclass_params__.frozen
        assert type(sizes).__module__ == module.__name__  # the lesson's own dataclass
    with pytest.raises(ValueError, match="huge"):
        module.lesson_sizes("huge")
    checkers = exercise_checkers(module)
    assert checkers and list(checkers) == list(range(1, len(checkers) + 1))
    assert not re.search(r"^def _say\b", Path(module.__file__).read_text(), re.M)


def test_verdict_prints_and_returns_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert verdict(True, "it is 4.", "count again.") == "Correct: it is 4."
    assert verdict(False, "it is 4.", "count again.") == "Not yet. Hint: count again."
    assert capsys.readouterr().out == "Correct: it is 4.\nNot yet. Hint: count again.\n"


def test_lesson08_exercise_checkers() -> None:
    from helpers.lessons import lesson08

    assert lesson08.check_exercise_1(" c14 ").startswith("Correct")
    assert lesson08.check_exercise_1("C13").startswith("Not yet")
    assert lesson08.check_exercise_2(256).startswith("Correct")
    assert lesson08.check_exercise_2(32).startswith("Not yet")
