"""The live-storage tracker behind every memory figure (core, all lessons).

`MemoryTracker` is a `TorchDispatchMode` (an `OpObserver`, from `helpers.measure.dispatch`): it sees
every aten op, and so every tensor storage an op creates, and records when each storage is freed.
`build_timeline` (in `helpers.measure.timeline`) turns those lifetimes into live
bytes by category after every op. `helpers.memory`
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

Times and addresses. Each op's time window (`time.time_ns()` before and after it) and
each new storage's address are kept, so that `helpers.measure.allocator` can match the CPU
allocator's own record of the same run to these storages: what the allocator holds
that no storage explains was allocated inside a kernel.

Release points. `could_release(outputs, loss)` marks the op at which a loop with
`del predictions` right after the loss would drop the model's outputs (autograd may
still hold them, if the loss saved them for backward: then they go when that node has
run). `timeline(released=True)` lets those storages die there, which is the loop that
keeps no output, measured in the same run as the loop as written.

Kernel buffers. A `kernel_buffers(func, args, kwargs, out)` callback may say how many
bytes an op allocates inside itself and frees before it returns (which no dispatch
mode can see). The tracker counts them as "other" for that op only, and keeps them
apart in `Timeline.inside_kernels`. It may also return (inside, held): `held` bytes
are "other" from this op until `drop_held()` (what autograd keeps of the op that the
dispatch mode cannot see). `helpers.meta_profile` uses it on the meta device.
"""

from __future__ import annotations

import gc
import math
import time
import weakref
from collections.abc import Callable, Iterable

import torch
from torch import nn

from helpers.measure.dispatch import OpObserver, _data_ptr, _freeze_gc, _storage_key, _unfreeze_gc, tensors_in
from helpers.measure.held_outputs import output_tensors, saving_nodes
from helpers.measure.timeline import CATEGORIES, Timeline, _Record, build_timeline

__all__ = ["KernelBuffers", "MemoryTracker", "active_trackers", "release_point"]

# kernel_buffers(func, args, kwargs, out) -> bytes the op allocates inside itself and frees before
# returning, or (those bytes, bytes it leaves held until MemoryTracker.drop_held())
KernelBuffers = Callable[[object, tuple, dict, object], int | tuple[int, int]]


class MemoryTracker(OpObserver):
    """Track live tensor storages, by category, over a region of code.

    Use it as a context manager. Call `mark(label)` inside the region to remember the
    current point; afterwards `timeline()` and `current_bytes` give the result.

    Args:
        model: its parameters, buffers and gradients are counted and categorised.
        optimizer: its state is counted as "optimizer_state", its step as the optimizer phase.
        device: count only storages of this device type (default: the model's; None
            without a model counts every device).
        kernel_buffers: says what an op allocates inside itself (see the module's note).

    Raises:
        ValueError: if `model` is not an `nn.Module` or `optimizer` not an optimizer.
    """

    def __init__(
        self,
        *,
        model: nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        device: torch.device | str | None = None,
        kernel_buffers: KernelBuffers | None = None,
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
        self.windows: list[tuple[int, int]] = [(0, 0)]  # time.time_ns() before and after each op
        self.marks: list[tuple[int, str]] = []
        self.mark_ns: list[int] = []
        self.current_bytes = 0
        self.kernel_buffers = kernel_buffers
        self._held: list[_Record] = []
        self._in_optimizer = False
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._node_hooks: list[torch.utils.hooks.RemovableHandle] = []
        self._finalizers: list[weakref.finalize] = []

    # -- bookkeeping -----------------------------------------------------
    def _on_device(self, t: torch.Tensor) -> bool:
        flag = _DEVICE_FLAGS.get(self.device_type)
        return getattr(t, flag) if flag is not None else t.device.type == self.device_type

    def _watch(self, t: torch.Tensor, role: str | None, phase: str,
               found: tuple[int, torch.UntypedStorage] | None = None) -> None:
        if self.device_type is not None and not self._on_device(t) and not (
            role == "optimizer_state" and self.device_type == "meta" and t.is_cpu
        ):  # on meta, the optimizer's CPU state (Adam's step counters) stands for the real device's
            return
        found = found or _storage_key(t)
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
        n = st.nbytes()
        rec = _Record(nbytes=n, born=self.clock, role=role, phase=phase, ptr=_data_ptr(st), born_nbytes=n,
                      born_ns=time.time_ns())
        self.live[key] = rec
        self.current_bytes += rec.nbytes
        self._finalizers.append(weakref.finalize(st, self._freed, key, rec))

    def watch(self, t: torch.Tensor, role: str) -> None:
        """Count `t`'s storage from now on as `role` (one of `CATEGORIES`), on whatever device it is.

        For tensors made outside any op, which the dispatch mode cannot see (the random-number
        state `torch.utils.checkpoint` saves, for instance). Its lifetime is tracked as usual.
        """
        if role not in CATEGORIES:
            raise ValueError(f"role must be one of {CATEGORIES}, got {role!r}")
        device_type, self.device_type = self.device_type, None
        try:
            self._watch(t, role, self._phase())
        finally:
            self.device_type = device_type

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
        rec.died_ns = time.time_ns()
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

    # -- OpObserver ---------------------------------------------------------
    def observe(self, func, args, kwargs, out) -> None:  # noqa: ANN001
        """Count what the op allocated (a new storage) as live from this op on."""
        t0, t1 = self.window
        self.clock += 1
        phase = self._phase()
        self.ops.append(func.overloadpacket.__name__)
        self.phases.append(phase)
        self.windows.append((t0, t1))
        if self.kernel_buffers is not None:
            self._kernel_buffers(self.kernel_buffers(func, args, kwargs, out), phase, t0, t1)
        inputs = None
        for t in tensors_in(out):
            found = _storage_key(t)
            if found is None:
                continue
            if found[0] not in self.live:
                if inputs is None:
                    inputs = {k[0] for a in tensors_in((args, kwargs)) if (k := _storage_key(a)) is not None}
                if found[0] in inputs:
                    self._ignore(t)  # a view or in-place result of a pre-existing tensor
                    continue
            self._watch(t, None, phase, found)

    def _kernel_buffers(self, found: int | tuple[int, int], phase: str, t0: int, t1: int) -> None:
        inside, held = found if isinstance(found, tuple) else (found, 0)
        if inside > 0:  # allocated and freed inside this op: alive only while it runs
            self.finished.append(_Record(nbytes=inside, born=self.clock, died=self.clock, role="other",
                                         phase=phase, born_ns=t0, died_ns=t1, inside=True))
        if held > 0:
            rec = _Record(nbytes=held, born=self.clock, role="other", phase=phase, born_ns=t0)
            self._held.append(rec)
            self.finished.append(rec)
            self.current_bytes += held

    def drop_held(self) -> None:
        """End the bytes that `kernel_buffers` said ops hold (their lifetime ends here)."""
        for rec in self._held:
            rec.died, rec.died_ns = self.clock, time.time_ns()
            self.current_bytes -= rec.nbytes
        self._held.clear()

    def __enter__(self) -> MemoryTracker:
        # Objects that exist now are moved out of the collector's sight, so the
        # collections below only scan what the tracked region creates (fast).
        _freeze_gc()
        now = time.time_ns()
        self.windows[0] = (now, now)
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
        _ACTIVE.append(self)
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        _ACTIVE.remove(self)
        self._mark_state()
        for h in [*self._handles, *self._node_hooks]:
            h.remove()
        self._handles.clear()
        self._node_hooks.clear()
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
    def mark(self, label: str, *, collect: bool = True) -> int:
        """Remember the current point of the timeline under `label`; return live bytes.

        `collect=False` skips the garbage collection (for a mark made inside backward, where a
        collection would end cyclic garbage at another point than an unmarked run does).
        """
        if collect:
            gc.collect()
        self.marks.append((self.clock, label))
        self.mark_ns.append(time.time_ns())
        return self.current_bytes

    def could_release(self, outputs: object, loss: torch.Tensor | None = None) -> int:
        """Mark this point as where a loop with `del predictions` would drop `outputs`.

        Call it right after the loss is computed, with the model's outputs (a tensor, or a
        structure of tensors such as a tuple or a `ModelOutput`) and the loss. The loop as
        written keeps them until its variable is reassigned; `timeline(released=True)` lets
        them die here instead. If the loss's own graph saved one of them for backward
        (an MSE loss saves its input), autograd holds it until that node has run, so the
        release waits for that node. Returns the bytes marked.
        """
        tensors = list(output_tensors(outputs))
        keys = {k[0] for t in tensors if (k := _storage_key(t)) is not None}
        recs = [rec for key in keys if (rec := self.live.get(key)) is not None and rec.phase != "before"]
        now = time.time_ns()
        holders = saving_nodes(loss, tensors, keys) if isinstance(loss, torch.Tensor) else []
        for rec in recs:
            rec.release, rec.release_ns = (math.inf, math.inf) if holders else (self.clock, now)
        if holders and recs:
            pending = [len(holders)]

            def ran(*_: object) -> None:  # a saving node ran: autograd drops its saved tensors now
                pending[0] -= 1
                if pending[0] == 0:
                    for rec in recs:
                        rec.release, rec.release_ns = self.clock, time.time_ns()

            self._node_hooks.extend(node.register_hook(ran) for node in holders)
        return sum(rec.nbytes for rec in recs)

    def new_live_bytes(self, exclude: Iterable[torch.Tensor] = ()) -> int:
        """Bytes of storages created inside the region and still alive (at exit, if exited)."""
        skip = {k[0] for t in exclude if (k := _storage_key(t)) is not None}
        return sum(
            rec.nbytes
            for key, rec in self.live.items()
            if rec.phase != "before" and rec.role is None and key not in skip
        )

    @property
    def records(self) -> list[_Record]:
        """Every storage seen so far: those still alive, then those freed."""
        return [*self.live.values(), *self.finished]

    def timeline(self, *, released: bool = False) -> Timeline:
        """Live bytes by category after every op seen so far.

        With `released`, storages marked by `could_release` die at their release point:
        the same run, as a loop with `del predictions` after the loss would hold it.
        """
        return build_timeline(self.records, self.ops, self.phases, self.marks, released=released)


_DEVICE_FLAGS = {"cpu": "is_cpu", "cuda": "is_cuda", "meta": "is_meta"}  # cheaper than t.device.type
_ACTIVE: list[MemoryTracker] = []  # the trackers inside whose `with` block the code runs


def active_trackers() -> tuple[MemoryTracker, ...]:
    """The trackers inside whose `with` block the code runs now, innermost last (a snapshot)."""
    return tuple(_ACTIVE)


def release_point(outputs: object, loss: torch.Tensor | None = None) -> None:
    """Tell every active tracker: a loop with `del predictions` would drop `outputs` here.

    A measured training loop calls it right after computing the loss; it changes nothing
    in the loop, and does nothing when no tracker is active (see `MemoryTracker.could_release`).
    """
    for tracker in _ACTIVE:
        tracker.could_release(outputs, loss)
