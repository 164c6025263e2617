"""helpers.tracker: the pure timeline builder, and nested trackers sharing one gc freeze."""

from __future__ import annotations

import gc
import math

import torch

from helpers.tracker import MemoryTracker, _Record, build_timeline


def test_build_timeline_from_known_lifetimes() -> None:
    ops = ["start", "a", "b", "c", "d"]
    records = [
        _Record(nbytes=100, born=1, died=3, phase="forward"),  # activation alive after ops 1..3
        _Record(nbytes=10, born=2, died=math.inf, role="gradients"),  # still alive at the end
        _Record(nbytes=7, born=2, died=2, phase="backward"),  # a backward temporary, freed at once
        _Record(nbytes=0, born=0, role="other", phase="before"),  # a pre-existing storage: not counted
        _Record(nbytes=5, born=3, died=4, phase="recompute"),  # checkpoint's recompute: an activation
    ]
    tl = build_timeline(records, ops, ["start", "forward", "backward", "backward", "optimizer"], [(2, "m")])
    assert tl.series["activations"] == [0, 100, 100, 105, 5]
    assert tl.series["gradients"] == [0, 0, 10, 10, 10]
    assert tl.series["other"] == [0, 0, 7, 0, 0]
    assert tl.series["parameters"] == tl.series["optimizer_state"] == [0] * 5
    assert tl.total == [0, 100, 117, 115, 15]
    assert tl.peak_index == 2 and tl.at(2)["other"] == 7 and tl.marks == [(2, "m")]


def test_tracker_counts_a_view_once_and_sees_it_freed() -> None:
    with MemoryTracker() as tracker:
        x = torch.empty(256)  # 1 KiB
        views = [x[10:], x.view(16, 16), x[::2]]
        live = tracker.mark("views")
        del x, views
        freed = tracker.mark("freed")
    assert live == 1024 and freed == 0


def test_nested_trackers_keep_the_outer_freeze() -> None:
    frozen_before = gc.get_freeze_count()
    with MemoryTracker():
        outer = gc.get_freeze_count()
        with MemoryTracker():
            pass
        assert gc.get_freeze_count() == outer > 0  # the inner exit did not unfreeze the outer region
    assert gc.get_freeze_count() <= frozen_before
