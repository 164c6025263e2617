"""Honest memory measurement for one training step, on CPU and on CUDA.

The core is `MemoryTracker`, a `TorchDispatchMode` that sees every aten op, and
so every tensor storage that an op creates. It holds only weak references, and
a finalizer records when each storage is freed. Each storage gets a lifetime
(born at op i, freed at op j) and a category:

- parameters:      storages of `model.parameters()`
- gradients:       storages that became a parameter's `.grad`
- optimizer_state: storages held in `optimizer.state` (Adam's exp_avg, ...)
- activations:     storages created in the forward pass (and by checkpoint
                   recomputation during backward) that are not one of the above
- other:           buffers (BatchNorm statistics, masks) and temporaries
                   created in backward or in the optimizer step

Summing lifetimes gives live bytes after every op: a timeline, its peak, and
the breakdown at the peak. Storages that existed before tracking began count
only if they are model state; a batch built before the step is not counted.

On CPU this tracker is the measurement (`method="cpu-tracker"`). On CUDA,
`measure_step` takes the peak from the caching allocator
(`torch.cuda.max_memory_allocated`, `method="cuda-allocator"`); the tracker
supplies the categories, and whatever the allocator holds beyond the tracked
tensors (block rounding, workspaces) is reported as `other`.
"""

from __future__ import annotations

import gc
import math
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "other")


@dataclass
class StepMemory:
    """Memory of one step: the peak, what it was made of, and how it was measured."""

    peak_bytes: int
    breakdown: dict[str, int]
    device: str
    method: str

    @property
    def floor_bytes(self) -> int:
        """Parameters + gradients + optimizer state: what neither technique removes."""
        b = self.breakdown
        return b["parameters"] + b["gradients"] + b["optimizer_state"]


@dataclass
class Timeline:
    """Live bytes by category after every op of a tracked region."""

    ops: list[str]
    phases: list[str]
    series: dict[str, list[int]]
    marks: list[tuple[int, str]] = field(default_factory=list)
    method: str = "tensor-tracker"

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


def _tensors(tree: object) -> Iterator[torch.Tensor]:
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
                for t in _tensors(state):
                    self._watch(t, "optimizer_state", "optimizer")

    # -- TorchDispatchMode -------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {k[0] for t in _tensors((args, kwargs)) if (k := _storage_key(t)) is not None}
        self.clock += 1
        phase = self._phase()
        self.ops.append(func.overloadpacket.__name__)
        self.phases.append(phase)
        for t in _tensors(out):
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
        gc.freeze()
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
        gc.unfreeze()
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
        n = self.clock + 1
        diffs = {name: [0] * (n + 1) for name in CATEGORIES}
        for rec in [*self.live.values(), *self.finished]:
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
        return Timeline(list(self.ops), list(self.phases), series, list(self.marks))


def _category(rec: _Record) -> str:
    if rec.role is not None:
        return rec.role
    return "activations" if rec.phase in ("forward", "recompute") else "other"


def _check_callable(fn: object, name: str) -> None:
    if not callable(fn):
        raise ValueError(
            f"{name} must be a zero-argument callable (e.g. a function or lambda), "
            f"got {type(fn).__name__}"
        )


def record_timeline(
    step: Callable[[], object],
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
) -> Timeline:
    """Run `step()` once and return live memory by category after every op.

    This is the tensor-level tracker on every device (`method="tensor-tracker"`).
    """
    _check_callable(step, "step")
    with MemoryTracker(model=model, optimizer=optimizer) as tracker:
        step()
    return tracker.timeline()


def measure_step(
    step: Callable[[], object],
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
) -> StepMemory:
    """Run the zero-argument `step()` once and report its peak memory and breakdown.

    `peak_bytes` is the largest live tensor memory on the model's device during
    the step, counting the parameters, gradients and optimizer state alive at
    that moment. `breakdown` splits it into `CATEGORIES` and sums to
    `peak_bytes`. Pass the optimizer that `step` uses, so that its state is
    recognised. Tensors made before the call (a prepared batch) are not counted.
    """
    _check_callable(step, "step")
    tracker = MemoryTracker(model=model, optimizer=optimizer)
    device = torch.device(tracker.device_type)
    if device.type == "cuda":
        torch.cuda.synchronize()
        gc.collect()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    with tracker:
        known_before = tracker.current_bytes
        step()
    timeline = tracker.timeline()
    breakdown = timeline.at(timeline.peak_index)
    peak = sum(breakdown.values())
    if device.type != "cuda":
        return StepMemory(peak, breakdown, str(device), "cpu-tracker")
    torch.cuda.synchronize()
    foreign = max(0, before - known_before)  # tensors the notebook holds elsewhere
    allocator_peak = torch.cuda.max_memory_allocated() - foreign
    breakdown["other"] += max(0, allocator_peak - peak)
    return StepMemory(sum(breakdown.values()), breakdown, str(device), "cuda-allocator")


def new_live_bytes(fn: Callable[[], object]) -> int:
    """Bytes of storage created by `fn()` and still alive afterwards, excluding its result."""
    _check_callable(fn, "fn")
    with MemoryTracker() as tracker:
        result = fn()
    return tracker.new_live_bytes(exclude=_tensors(result))


def saved_activation_bytes(forward: Callable[[], torch.Tensor]) -> int:
    """Bytes that autograd keeps for backward after `forward()`.

    Calls the zero-argument `forward` (which must return a tensor that requires
    grad) and returns the bytes of tensor storage alive after the call that
    were not alive before, not counting the returned tensor itself. Works under
    full and selective checkpointing, because it watches live storages rather
    than saved-tensor hooks.
    """
    _check_callable(forward, "forward")
    with MemoryTracker() as tracker:
        out = forward()
    if not isinstance(out, torch.Tensor) or not out.requires_grad:
        got = type(out).__name__ if not isinstance(out, torch.Tensor) else "a tensor without grad"
        raise ValueError(
            "forward must return a tensor that requires grad (a training-mode forward, "
            f"not under torch.no_grad()), got {got}"
        )
    return tracker.new_live_bytes(exclude=[out])
