"""The live-storage tracker behind every memory figure (core, all lessons).

`MemoryTracker` is a `TorchDispatchMode`: it sees every aten op, and so every tensor
storage an op creates, and records when each storage is freed. `build_timeline`
turns those lifetimes into live bytes by category after every op. `helpers.memory`
builds the lessons' measurements (`measure_step`, `saved_activation_bytes`, ...) on it.

NOTE [How the tracker sees memory]
---------------------------------
Storages, not tensors. A view, a slice or an in-place result shares its base's
storage, so the tracker keys every record by the storage (`untyped_storage()._cdata`)
and counts its bytes once, however many tensors point into it.

Born. After each op, `__torch_dispatch__` looks at the op's outputs. An output whose
storage is new gets a `_Record` with its size, the op index (`born`) and the phase the
op ran in. An output whose storage belongs to an input that existed before tracking
(a view of a prepared batch) is remembered with 0 bytes and never counted.

Freed. Each record holds only a weak reference: `weakref.finalize` on the storage
calls `_freed`, which stamps the current op index (`died`). The tracker never keeps a
tensor alive. `gc.collect()` at marks and at exit makes cyclic garbage die on time,
and `gc.freeze()` (nested trackers share one freeze) keeps those collections cheap by
hiding everything that existed before the region.

Phases. `_phase()` reads where an op runs: inside `optimizer.step()` (pre/post step
hooks), inside backward (autograd's current graph task id is set), where grad mode is
on only while checkpoint recomputes a region ("recompute"), or otherwise forward.

Categories. A record may carry a fixed role: the model's parameters and buffers are
claimed on entry; a parameter's `.grad` is claimed by a post-accumulate-grad hook
(and at exit); the optimizer's state tensors are claimed after each step. A record
with no role is an activation if it was born in forward or recompute, and "other"
(temporaries of backward and of the optimizer step) otherwise. So what checkpointing
rebuilds during backward counts as activations, as it should: it is the same memory.
"""

from __future__ import annotations

import gc
import math
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from helpers.device import TENSOR_TRACKER

__all__ = ["CATEGORIES", "MemoryTracker", "Timeline", "build_timeline", "tensors_in"]

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "other")


@dataclass
class Timeline:
    """Live bytes by category after every op of a tracked region."""

    ops: list[str]
    phases: list[str]
    series: dict[str, list[int]]
    marks: list[tuple[int, str]] = field(default_factory=list)
    method: str = TENSOR_TRACKER

    @property
    def total(self) -> list[int]:
        """Live bytes after each op, all categories together."""
        return [sum(vals) for vals in zip(*self.series.values(), strict=True)]

    @property
    def peak_index(self) -> int:
        """Index of the first op at which live memory was largest."""
        total = self.total
        return max(range(len(total)), key=total.__getitem__)

    def at(self, index: int) -> dict[str, int]:
        """Breakdown by category after op `index`."""
        return {name: values[index] for name, values in self.series.items()}


@dataclass
class _Record:
    nbytes: int
    born: int
    died: float = math.inf
    role: str | None = None  # fixed category, or None to decide by phase
    phase: str = "forward"


def tensors_in(tree: object) -> Iterator[torch.Tensor]:
    """Every tensor in a nested structure (tuples, lists, dicts) of op arguments or results."""
    for leaf in tree_flatten(tree)[0]:
        if isinstance(leaf, torch.Tensor):
            yield leaf


def _storage_key(t: torch.Tensor) -> tuple[int, torch.UntypedStorage] | None:
    try:
        st = t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # tensors without storage (subclasses)
        return None
    return st._cdata, st


class MemoryTracker(TorchDispatchMode):
    """Track live tensor storages, by category, over a region of code.

    Use it as a context manager. Pass `model` (and `optimizer`) so that their
    existing state is counted and categorised; `device` limits counting to one
    device type (default: the model's). Call `mark(label)` inside the region to
    remember the current point; afterwards `timeline()` and `current_bytes`
    give the result.
    """

    def __init__(
        self,
        *,
        model: nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if model is not None and not isinstance(model, nn.Module):
            raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(
                f"optimizer must be a torch.optim.Optimizer or None, got {type(optimizer).__name__}"
            )
        if device is None and model is not None:
            first = next(model.parameters(), None)
            device = first.device if first is not None else "cpu"
        # None counts storages on every device.
        self.device_type = torch.device(device).type if device is not None else None
        self.model = model
        self.optimizer = optimizer
        self.live: dict[int, _Record] = {}
        self.finished: list[_Record] = []
        self.clock = 0
        self.ops = ["start"]
        self.phases = ["start"]
        self.marks: list[tuple[int, str]] = []
        self.current_bytes = 0
        self._in_optimizer = False
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._finalizers: list[weakref.finalize] = []

    # -- bookkeeping -----------------------------------------------------
    def _watch(self, t: torch.Tensor, role: str | None, phase: str) -> None:
        if self.device_type is not None and t.device.type != self.device_type:
            return
        found = _storage_key(t)
        if found is None:
            return
        key, st = found
        rec = self.live.get(key)
        if rec is not None:
            if role is not None and rec.role is None:
                rec.role = role
            if rec.phase == "before" and rec.nbytes == 0:
                return  # a pre-existing storage seen again (a second view of a batch): not counted
            if st.nbytes() > rec.nbytes:  # resized in place
                self.current_bytes += st.nbytes() - rec.nbytes
                rec.nbytes = st.nbytes()
            return
        rec = _Record(nbytes=st.nbytes(), born=self.clock, role=role, phase=phase)
        self.live[key] = rec
        self.current_bytes += rec.nbytes
        self._finalizers.append(weakref.finalize(st, self._freed, key, rec))

    def _ignore(self, t: torch.Tensor) -> None:
        """Remember a storage that existed before tracking, without counting it."""
        found = _storage_key(t)
        if found is not None and found[0] not in self.live:
            key, st = found
            rec = _Record(nbytes=0, born=self.clock, role="other", phase="before")
            self.live[key] = rec
            self._finalizers.append(weakref.finalize(st, self._freed, key, rec))

    def _freed(self, key: int, rec: _Record) -> None:
        if self.live.get(key) is rec:
            del self.live[key]
        rec.died = self.clock
        self.current_bytes -= rec.nbytes
        self.finished.append(rec)

    def _phase(self) -> str:
        if self._in_optimizer:
            return "optimizer"
        if torch._C._current_graph_task_id() != -1:
            # Inside backward, grad mode is off except while checkpoint recomputes.
            return "recompute" if torch.is_grad_enabled() else "backward"
        return "forward"

    def _mark_state(self) -> None:
        """Claim the current optimizer state and gradients for their categories."""
        if self.model is not None:
            for p in self.model.parameters():
                if p.grad is not None:
                    self._watch(p.grad, "gradients", "backward")
        if self.optimizer is not None:
            for state in self.optimizer.state.values():
                for t in tensors_in(state):
                    self._watch(t, "optimizer_state", "optimizer")

    # -- TorchDispatchMode -------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {k[0] for t in tensors_in((args, kwargs)) if (k := _storage_key(t)) is not None}
        self.clock += 1
        phase = self._phase()
        self.ops.append(func.overloadpacket.__name__)
        self.phases.append(phase)
        for t in tensors_in(out):
            found = _storage_key(t)
            if found is None:
                continue
            if found[0] in inputs and found[0] not in self.live:
                self._ignore(t)  # a view or in-place result of a pre-existing tensor
            else:
                self._watch(t, None, phase)
        return out

    def __enter__(self) -> MemoryTracker:
        # Objects that exist now are moved out of the collector's sight, so the
        # collections below only scan what the tracked region creates (fast).
        _freeze_gc()
        if self.model is not None:
            for p in self.model.parameters():
                self._watch(p, "parameters", "before")
                p_hook = p.register_post_accumulate_grad_hook if p.requires_grad else None
                if p_hook is not None:
                    self._handles.append(p_hook(lambda q: self._watch(q.grad, "gradients", "")))
            for b in self.model.buffers():
                self._watch(b, "other", "before")
        if self.optimizer is not None:
            self._handles.append(self.optimizer.register_step_pre_hook(self._opt_pre))
            self._handles.append(self.optimizer.register_step_post_hook(self._opt_post))
        self._mark_state()
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self._mark_state()
        for h in self._handles:
            h.remove()
        self._handles.clear()
        # Record what is already garbage, then stop watching: the finalizers would
        # otherwise keep this tracker alive as long as the model's parameters.
        gc.collect()
        _unfreeze_gc()
        for f in self._finalizers:
            f.detach()
        self._finalizers.clear()

    def _opt_pre(self, *_: object) -> None:
        self._in_optimizer = True

    def _opt_post(self, *_: object) -> None:
        self._in_optimizer = False
        self._mark_state()

    # -- results -----------------------------------------------------------
    def mark(self, label: str) -> int:
        """Remember the current point of the timeline under `label`; return live bytes."""
        gc.collect()
        self.marks.append((self.clock, label))
        return self.current_bytes

    def new_live_bytes(self, exclude: Iterable[torch.Tensor] = ()) -> int:
        """Bytes of storages created inside the region and still alive (at exit, if exited)."""
        skip = {k[0] for t in exclude if (k := _storage_key(t)) is not None}
        return sum(
            rec.nbytes
            for key, rec in self.live.items()
            if rec.phase != "before" and rec.role is None and key not in skip
        )

    def timeline(self) -> Timeline:
        """Live bytes by category after every op seen so far."""
        return build_timeline([*self.live.values(), *self.finished], self.ops, self.phases, self.marks)


def _category(rec: _Record) -> str:
    if rec.role is not None:
        return rec.role
    return "activations" if rec.phase in ("forward", "recompute") else "other"


def build_timeline(
    records: Iterable[_Record], ops: list[str], phases: list[str], marks: list[tuple[int, str]]
) -> Timeline:
    """Live bytes by category after each of `ops`, from storage lifetimes (a pure function)."""
    n = len(ops)
    diffs = {name: [0] * (n + 1) for name in CATEGORIES}
    for rec in records:
        if rec.nbytes == 0:
            continue
        end = n if rec.died == math.inf else int(rec.died) + 1
        d = diffs[_category(rec)]
        d[rec.born] += rec.nbytes
        d[min(end, n)] -= rec.nbytes
    series = {}
    for name, d in diffs.items():
        running, values = 0, []
        for i in range(n):
            running += d[i]
            values.append(running)
        series[name] = values
    return Timeline(list(ops), list(phases), series, list(marks))


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
