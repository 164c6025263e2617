"""Every lesson fits its scale: each lesson module's predicted peak at each scale, checked in one place.

Every lesson module (`helpers/lessons/lessonNN.py`, one per notebook) defines
`predicted_peak_bytes(scale)`: the predicted peak memory of the lesson's largest experiment, from
the formulas the lesson itself validates. A scale is picked from the GPU's memory class
(helpers.device.GPU_SCALE_CLASSES), so each lesson's peak at a scale must stay at or below 70% of
the smallest memory in that class: a T4 (15 GB) at `medium` and a 40 GB A100 at `full` then run
every lesson without running out. The CPU scales (`tiny`, `small`) stay under 1 GB, which any
laptop has. The lessons' own tests check each prediction against a measurement; this file holds
the fit-to-scale checks for all of them (they used to be repeated in each lesson's tests).
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path
from types import ModuleType

import pytest

from helpers.core.device import GB, GPU_SCALE_CLASSES, SCALES

HEADROOM = 0.7  # a lesson may use at most 70% of the smallest GPU in its scale's class
CLASS_FLOOR_GB = {scale: floor for floor, scale in GPU_SCALE_CLASSES if floor > 0}  # medium: 12, full: 40
CPU_LIMIT_BYTES = 1e9  # tiny and small run on any laptop
# The expected set: every lesson module, found by file name (tests/test_repo.py checks that these
# are exactly the notebooks' lesson modules). Imported inside the tests, not at collection.
LESSONS = sorted(p.stem for p in (Path(__file__).resolve().parent.parent / "helpers" / "lessons").glob(
    "lesson[0-9][0-9].py"))


def _lesson(name: str) -> ModuleType:
    return importlib.import_module(f"helpers.lessons.{name}")


@functools.cache
def _peaks(name: str) -> dict[str, int]:
    """{scale: predicted_peak_bytes(scale)} of one lesson, computed once per test process."""
    module = _lesson(name)
    assert callable(getattr(module, "predicted_peak_bytes", None)), f"{name}: no predicted_peak_bytes(scale)"
    return {scale: module.predicted_peak_bytes(scale) for scale in SCALES}


def test_there_are_lesson_modules() -> None:
    assert LESSONS, "no helpers/lessons/lessonNN.py found"


@pytest.mark.parametrize("lesson", LESSONS)
def test_predicted_peak_is_a_positive_int_at_every_scale(lesson: str) -> None:
    for scale, peak in _peaks(lesson).items():
        assert isinstance(peak, int) and not isinstance(peak, bool) and peak > 0, (scale, peak)


@pytest.mark.parametrize("scale", sorted(CLASS_FLOOR_GB))
@pytest.mark.parametrize("lesson", LESSONS)
def test_predicted_peak_fits_the_smallest_gpu_of_the_class(lesson: str, scale: str) -> None:
    budget = HEADROOM * CLASS_FLOOR_GB[scale] * GB
    peak = _peaks(lesson)[scale]
    assert peak <= budget, (
        f"{lesson} at scale {scale!r} predicts {peak / GB:.2f} GB, more than "
        f"{HEADROOM:.0%} of {CLASS_FLOOR_GB[scale]:g} GB ({budget / GB:.1f} GB): shrink its {scale} sizes"
    )


@pytest.mark.parametrize("lesson", LESSONS)
def test_cpu_scales_fit_a_laptop(lesson: str) -> None:
    for scale in ("tiny", "small"):
        assert _peaks(lesson)[scale] <= CPU_LIMIT_BYTES, (lesson, scale, _peaks(lesson)[scale])


@pytest.mark.parametrize("lesson", LESSONS)
def test_predicted_peak_grows_with_the_scale(lesson: str) -> None:
    peak = _peaks(lesson)
    assert peak["tiny"] < peak["small"] < peak["full"], peak
    assert peak["small"] <= peak["medium"] <= peak["full"], peak


@pytest.mark.parametrize("lesson", LESSONS)
def test_an_unknown_scale_is_refused_by_name(lesson: str) -> None:
    with pytest.raises(ValueError, match="scale"):  # lesson_sizes' refusal: tests/lessons/test_protocol.py
        _lesson(lesson).predicted_peak_bytes("huge")


def test_class_floors_are_the_documented_ones() -> None:
    assert CLASS_FLOOR_GB == {"medium": 12.0, "full": 40.0}
