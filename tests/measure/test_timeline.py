"""helpers.measure.timeline: live bytes by category after every op, from storage lifetimes set by hand."""

from __future__ import annotations

import math

import torch

from helpers.measure.memory import tracked_run
from helpers.measure.timeline import Timeline, _Record, build_timeline
from helpers.measure.tracker import MemoryTracker


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


def test_records_default_to_forward_activations() -> None:
    tl = build_timeline([_Record(nbytes=1, born=1)], ["start", "op"], ["start", "forward"], [])
    assert tl.series["activations"] == [0, 1] and tl.marks == []  # a one-byte storage (a bool) counts


def test_released_records_die_at_their_release_point_and_kernel_buffers_are_kept_apart() -> None:
    """Hand count: a 100-byte output held to the end but released after op 2; a kernel's own 30-byte
    buffer inside op 3 (counted in "other", and again in `inside_kernels`)."""
    records = [
        _Record(nbytes=100, born=1, release=2),  # the predictions: a `del` after op 2 would free them
        _Record(nbytes=30, born=3, died=3, phase="backward", inside=True),  # a kernel's scratch buffer
        _Record(nbytes=4, born=0, role="parameters"),
    ]
    ops, phases = ["start", "a", "b", "c", "d"], ["start", "forward", "forward", "backward", "backward"]
    held, released = (build_timeline(records, ops, phases, [], released=r) for r in (False, True))
    assert held.total == [4, 104, 104, 134, 104]
    assert released.total == [4, 104, 104, 34, 4]
    assert held.inside_kernels == released.inside_kernels == [0, 0, 0, 30, 0]
    assert held.series["other"] == [0, 0, 0, 30, 0] and held.inside_at(3) == 30
    assert held.peak_index == 3 and held.at(3)["activations"] == 100
    no_record = build_timeline([], ops, phases, [])
    assert no_record.total == [0] * 5 and no_record.peak_index == 0  # the first of equal totals


def test_released_points_apply_only_when_asked() -> None:
    """By default a record ends when it died (build_timeline holds it); released=True, at its release."""
    rec = _Record(nbytes=100, born=1, died=3, release=1)
    assert (rec.end(), rec.end(released=True)) == (3, 1)
    ops, phases = ["start", "a", "b", "c", "d"], ["start", "forward", "forward", "backward", "backward"]
    assert build_timeline([rec], ops, phases, []).total == [0, 100, 100, 100, 0]
    assert build_timeline([rec], ops, phases, [], released=True).total == [0, 100, 0, 0, 0]


def test_a_timeline_without_kernel_figures_reports_none_inside_kernels() -> None:
    """A Timeline made by hand (no inside_kernels given) has 0 bytes inside kernels after every op."""
    tl = Timeline(["start", "mm"], ["start", "forward"], {"activations": [0, 64], "other": [0, 8]})
    assert sum(tl.inside_kernels) == 0 and [tl.inside_at(i) for i in range(2)] == [0, 0]
    assert tl.total == [0, 72] and tl.marks == []


def test_released_cpu_timeline_frees_unmarked_storages_when_the_allocator_does() -> None:
    """On CPU (the allocator's record), released=True ends a marked 4000-byte output at its release point
    and a 2000-byte temporary, never marked, when it is freed: peak 4000 bytes, 0 at the end."""
    kept: list[torch.Tensor] = []
    tracker = MemoryTracker(device="cpu")

    def run() -> None:
        out = torch.ones(1000)
        tracker.could_release(out)
        torch.ones(500)  # freed at once
        kept.append(out)  # held past the region

    released = tracked_run(run, tracker)(released=True)
    assert released.method == "cpu-tracker"
    assert max(released.total) == 4000 and 2000 in released.total and released.total[-1] == 0, released.total
