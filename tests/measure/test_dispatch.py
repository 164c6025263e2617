"""helpers.measure.dispatch: the op-watching base every instrument builds on, and the gc freeze nested
trackers share."""

from __future__ import annotations

import gc

import torch

from helpers.measure.dispatch import OpFacts, _GcFreeze, op_facts, tensors_in
from helpers.measure.tracker import MemoryTracker


def test_nested_trackers_keep_the_outer_freeze() -> None:
    frozen_before = gc.get_freeze_count()
    assert _GcFreeze.depth == 0
    with MemoryTracker():
        outer = gc.get_freeze_count()
        with MemoryTracker():
            assert _GcFreeze.depth == 2
        assert _GcFreeze.depth == 1
        assert gc.get_freeze_count() == outer > 0  # the inner exit did not unfreeze the outer region
    assert _GcFreeze.depth == 0
    assert gc.get_freeze_count() <= frozen_before


def test_op_observer_sees_each_op_after_it_ran() -> None:
    from helpers.measure.dispatch import OpObserver

    class Seen(OpObserver):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[tuple[str, tuple[int, ...]]] = []

        def observe(self, func, args, kwargs, out) -> None:  # noqa: ANN001
            assert self.window[0] <= self.window[1]
            self.seen.append((func.overloadpacket.__name__, tuple(out.shape)))

    x = torch.ones(2, 3)
    with Seen() as seen:
        y = (x @ x.T).relu()  # the transpose is one op (its name varies by torch version), then mm, relu
    assert [op for op, _ in seen.seen][-2:] == ["mm", "relu"] and seen.seen[-1][1] == (2, 2)
    assert torch.equal(y, torch.full((2, 2), 3.0))  # results pass through unchanged


def test_tensors_in_walks_nested_arguments_in_order() -> None:
    a, b, c, d = (torch.full((1,), float(i)) for i in range(4))
    tree = (a, [1, "x", (b, None)], {"k": c, "n": 2.0, "deep": {"d": [d]}})
    assert [t.item() for t in tensors_in(tree)] == [0.0, 1.0, 2.0, 3.0]
    assert tensors_in(a)[0] is a and tensors_in((1, "no tensors", [None])) == []


def test_op_facts_read_the_schema() -> None:
    """What aten's own schemas say: add_ writes its first argument, view and t return views, mm neither."""
    aten = torch.ops.aten
    assert op_facts(aten.add_.Tensor) == OpFacts("add_", True, False, ((0, "self"), (1, "other")))
    assert op_facts(aten.mm.default) == OpFacts("mm", False, False, ((0, "self"), (1, "mat2")))
    assert op_facts(aten.view.default).view and op_facts(aten.t.default).view
    assert not op_facts(aten.view.default).mutates
    assert op_facts(object()) == OpFacts("", True, True, ())  # no schema: assume the worst
