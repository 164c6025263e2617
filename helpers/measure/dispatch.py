"""The dispatch level that every op-watching instrument builds on: one mode base, one tensor walk.

- `OpObserver`: the project's one `TorchDispatchMode` base; it runs each aten op unchanged and
  shows it to `observe` (`helpers.measure.tracker.MemoryTracker`, `helpers.techniques.costs.count_ops` and
  `helpers.techniques.saved_tensors` subclass it).
- `OpRunner`: what an observer may be given to run its ops instead of calling them (the meta
  profile's fast paths, `helpers.meta.memo.MetaRunner`): this base knows the protocol, not them.
- `tensors_in(tree)`: every tensor in a nested structure of op arguments or results.
- `_storage_key(t)`, `_data_ptr(st)`: the key and the address of a tensor's storage.
- `_freeze_gc()` / `_unfreeze_gc()`: one `gc.freeze()` shared by nested observed regions, so
  the collections inside them scan only what the region creates.

"""

from __future__ import annotations

import functools
import gc
import time
from collections.abc import Callable
from typing import NamedTuple, Protocol

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["OpFacts", "OpObserver", "OpRunner", "op_facts", "tensors_in"]


class OpFacts(NamedTuple):
    """What an op's schema says, as the meta profile's fast paths read it."""

    name: str  # the overload packet's name, e.g. "add" for aten.add.Tensor ("" if not an aten op)
    mutates: bool  # it writes to an argument (or it has no schema)
    view: bool  # it returns a view of an argument (or it has no schema)
    tensor_args: tuple[tuple[int, str], ...]  # (position, name) of each argument typed Tensor


@functools.cache
def op_facts(func: object) -> OpFacts:
    """The schema facts of aten op overload `func`, read once per op."""
    name = getattr(getattr(func, "overloadpacket", None), "__name__", "")
    schema = getattr(func, "_schema", None)
    if schema is None:
        return OpFacts(name, True, True, ())
    view = any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
    tensor_args = tuple((i, a.name) for i, a in enumerate(schema.arguments) if str(a.type) == "Tensor")
    return OpFacts(name, schema.is_mutable, view, tensor_args)


def tensors_in(tree: object) -> list[torch.Tensor]:
    """Every tensor in a nested structure (tuples, lists, dicts) of op arguments or results."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    found, todo = [], [tree]
    while todo:
        item = todo.pop()
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, tuple | list):
            todo.extend(reversed(item))
        elif isinstance(item, dict):
            todo.extend(reversed(item.values()))
    return found


def _storage_key(t: torch.Tensor) -> tuple[int, torch.UntypedStorage] | None:
    try:
        st = t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # tensors without storage (subclasses)
        return None
    return st._cdata, st


class OpRunner(Protocol):
    """Runs an aten op for an `OpObserver`: `run` returns what `func(*args, **kwargs)` would."""

    def run(self, func: Callable[..., object], args: tuple, kwargs: dict) -> object:
        """The op's result (the same tensors' metadata as calling it; on meta, possibly remembered)."""
        ...


class OpObserver(TorchDispatchMode):
    """The one `TorchDispatchMode` base of the project: run each aten op, then show it to `observe`.

    Use a subclass as a context manager; every aten op run inside it (forward, backward,
    optimizer step) is run unchanged and then passed to `observe(func, args, kwargs, out)`.
    With `self.runner` set (an `OpRunner`), the runner runs each op instead: the meta profile
    sets `helpers.meta.memo.MetaRunner`, whose fast paths answer pointwise and repeated meta
    calls in microseconds instead of the op's meta kernel (about 200).
    `self.window` holds the op's (start, end) in `time.time_ns()`.
    """

    window: tuple[int, int] = (0, 0)
    runner: OpRunner | None = None  # set it to run the ops another way (the meta profile's fast paths)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        t0 = time.time_ns()
        out = func(*args, **kwargs) if self.runner is None else self.runner.run(func, args, kwargs)
        self.window = (t0, time.time_ns())
        self.observe(func, args, kwargs, out)
        return out

    def observe(self, func: object, args: tuple, kwargs: dict, out: object) -> None:
        """Look at one op that just ran (`func` is its `torch._ops.OpOverload`); override this."""


def _data_ptr(st: torch.UntypedStorage) -> int:
    try:
        return st.data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


class _GcFreeze:
    """`gc.freeze()` shared by nested trackers: the outermost exit alone unfreezes."""

    depth = 0


def _freeze_gc() -> None:
    if _GcFreeze.depth == 0:
        gc.freeze()
    _GcFreeze.depth += 1


def _unfreeze_gc() -> None:
    _GcFreeze.depth -= 1
    if _GcFreeze.depth == 0:
        gc.unfreeze()
