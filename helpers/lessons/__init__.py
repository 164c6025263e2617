"""One module per lesson notebook, its number in its name: sizes, figures, widgets, exercise checkers.

Notebook `NN_*.ipynb` imports exactly one lesson module, `helpers.lessons.lessonNN`, plus
instruments and core from `helpers`. A lesson module never imports another lesson module: what
two lessons share is an instrument and lives in `helpers/`.

Every lesson module follows one small protocol (`LessonModule`), which the scale and widget
tests and `scripts/bench.py` use through `lesson_modules()`:

- `lesson_sizes(scale) -> <that lesson's frozen dataclass>`: every size the lesson uses at
  `scale` ("tiny", "small", "medium", "full"); a bad scale raises `ValueError`.
- `predicted_peak_bytes(scale) -> int`: the peak memory of the lesson's largest experiment at
  `scale`, from formulas or the meta device (nothing is allocated).
- `widget_latency_cases(scale, device) -> dict[str, Callable[[], object]]`: one zero-argument
  callable per widget control move, each doing that move's full work.
- `check_exercise_1`, `check_exercise_2`, ...: the exercise checkers. Each returns one line,
  "Correct: ..." or a hint, and never raises on a wrong answer; `verdict` writes that line,
  `not_answered` the one for an answer not given yet.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

__all__ = ["LessonModule", "exercise_checkers", "lesson_modules", "not_answered", "verdict"]

_LESSON_NAME = re.compile(r"lesson(\d\d)")
_CHECKER_NAME = re.compile(r"check_exercise_(\d+)")


@runtime_checkable
class LessonModule(Protocol):
    """What every `helpers.lessons.lessonNN` module provides (module-level functions).

    `isinstance(module, LessonModule)` checks that the three functions exist; the exercise
    checkers, whose number and arguments differ per lesson, are found by `exercise_checkers`.
    The docstrings here are the Args and Returns of every lesson's protocol functions, written
    once; a lesson's own docstring says only what is particular to it. A checker
    `check_exercise_N(answer, ...)` takes the learner's answer(s), as the exercise cell asks
    for them, and returns its one line (see `verdict`).
    """

    def lesson_sizes(self, scale: str) -> object:
        """The lesson's sizes at `scale`.

        Args:
            scale: "tiny", "small", "medium" or "full".

        Returns:
            The lesson's own frozen dataclass of sizes.

        Raises:
            ValueError: for another scale.
        """
        ...

    def predicted_peak_bytes(self, scale: str) -> int:
        """Predicted peak bytes of the lesson's largest experiment at `scale` (nothing is allocated).

        Args:
            scale: "tiny", "small", "medium" or "full".

        Returns:
            The bytes, from formulas or the meta device.
        """
        ...

    def widget_latency_cases(self, scale: str, device: torch.device) -> dict[str, Callable[[], object]]:
        """One zero-argument callable per widget control move, each doing that move's full work.

        Args:
            scale: the lesson's scale.
            device: where the widgets' models run.

        Returns:
            {move: callable}.
        """
        ...


def verdict(ok: bool, correct: str, hint: str) -> str:
    """The line an exercise checker prints and returns.

    Args:
        ok: whether the learner's answer is right.
        correct: what a right answer shows, printed after "Correct: ".
        hint: what to look at next, printed after "Not yet. Hint: ".

    Returns:
        "Correct: {correct}" if `ok`, else "Not yet. Hint: {hint}" (also printed).
    """
    text = f"Correct: {correct}" if ok else f"Not yet. Hint: {hint}"
    print(text)
    return text


def not_answered(what: str) -> str:
    """The line a checker returns while the exercise cell still holds no answer.

    Args:
        what: what to pass, e.g. "pass a number".

    Returns:
        "Not answered yet: {what}".
    """
    return f"Not answered yet: {what}"


def lesson_modules() -> list[ModuleType]:
    """Every `helpers/lessons/lessonNN.py`, imported, sorted by NN.

    Returns:
        The lesson modules, lesson 01 first.
    """
    found = []
    for info in pkgutil.iter_modules(__path__):
        m = _LESSON_NAME.fullmatch(info.name)
        if m:
            found.append((int(m.group(1)), importlib.import_module(f"{__name__}.{info.name}")))
    return [module for _, module in sorted(found, key=lambda pair: pair[0])]


def exercise_checkers(module: ModuleType) -> dict[int, Callable[..., str]]:
    """A lesson module's `check_exercise_N` functions, by N (ascending).

    Args:
        module: a lesson module.

    Returns:
        {N: check_exercise_N} for every such function the module defines.
    """
    found = {int(m.group(1)): getattr(module, name)
             for name in dir(module) if (m := _CHECKER_NAME.fullmatch(name))}
    return dict(sorted(found.items()))
