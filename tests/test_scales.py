"""GPU scales fit their class: every lesson's predicted peak stays under 70% of the class minimum.

Every lesson helper module that backs a notebook defines `predicted_peak_bytes(scale)`: the
predicted peak memory of the lesson's largest experiment, from the formulas the lesson itself
validates. A scale is picked from the GPU's memory class (helpers.device.GPU_SCALE_CLASSES), so
each lesson's peak at a scale must stay at or below 70% of the smallest memory in that class:
a T4 (15 GB) at `medium` and a 40 GB A100 at `full` then run every lesson without running out.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import pytest

from helpers.device import GB, GPU_SCALE_CLASSES, SCALES

# How many helpers modules must implement the protocol. The coordinator raises this as lesson
# modules gain `predicted_peak_bytes` (8 define it today: raise to 8 once they are committed): fewer fails.
MIN_PROTOCOL_MODULES = 5
HEADROOM = 0.7  # a lesson may use at most 70% of the smallest GPU in its scale's class
CLASS_FLOOR_GB = {scale: floor for floor, scale in GPU_SCALE_CLASSES if floor > 0}  # medium: 12, full: 40


def _protocol_modules() -> list[ModuleType]:
    import helpers.lessons

    names = sorted(f"{pkg.__name__}.{m.name}" for pkg in (helpers, helpers.lessons)
                   for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_") and not m.ispkg)
    modules = [importlib.import_module(name) for name in names]
    return [m for m in modules if callable(getattr(m, "predicted_peak_bytes", None))]


MODULES = _protocol_modules()


def test_enough_lessons_predict_their_peak() -> None:
    names = [m.__name__ for m in MODULES]
    assert len(MODULES) >= MIN_PROTOCOL_MODULES, (
        f"only {len(MODULES)} helpers modules define predicted_peak_bytes(scale) ({names}); "
        f"expected at least {MIN_PROTOCOL_MODULES}"
    )


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.removeprefix("helpers."))
def test_predicted_peak_is_a_positive_int_at_every_scale(module: ModuleType) -> None:
    for scale in SCALES:
        peak = module.predicted_peak_bytes(scale)
        assert isinstance(peak, int) and not isinstance(peak, bool) and peak > 0, (scale, peak)


@pytest.mark.parametrize("scale", sorted(CLASS_FLOOR_GB))
@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.removeprefix("helpers."))
def test_predicted_peak_fits_the_smallest_gpu_of_the_class(module: ModuleType, scale: str) -> None:
    budget = HEADROOM * CLASS_FLOOR_GB[scale] * GB
    peak = module.predicted_peak_bytes(scale)
    assert peak <= budget, (
        f"{module.__name__} at scale {scale!r} predicts {peak / GB:.2f} GB, more than "
        f"{HEADROOM:.0%} of {CLASS_FLOOR_GB[scale]:g} GB ({budget / GB:.1f} GB): shrink its {scale} sizes"
    )


def test_class_floors_are_the_documented_ones() -> None:
    assert CLASS_FLOOR_GB == {"medium": 12.0, "full": 40.0}
