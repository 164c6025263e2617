"""Honest memory measurement for one training step, on CPU and on CUDA.

The core is `MemoryTracker` (in `helpers.tracker`, which explains how it works), a
`TorchDispatchMode` that sees every aten op, and
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

The total comes from the allocator on every device, the categories from the
tracker. On CPU, `measure_step` takes the CPU allocator's own record of the same run
(`helpers.allocator`: every allocation and free, the buffers a kernel allocates inside
itself included) and splits each live block into the tracker's categories; what no
tracked storage explains stays in `other`, and `StepMemory.inside_kernels_bytes` says
how much of it kernels allocated inside themselves (`method="cpu-tracker"`: the
tracker's categories over the allocator's total). On CUDA it takes the peak from the
caching allocator (`torch.cuda.max_memory_allocated`, `method="cuda-allocator"`); the
tracker supplies the categories, and whatever the allocator holds beyond the tracked
tensors (kernel buffers, workspaces, block rounding) is reported as `other`.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn

from helpers.allocator import AllocatorRecord, allocator_timeline
from helpers.device import CPU_TRACKER, CUDA_ALLOCATOR
from helpers.tracker import CATEGORIES, MemoryTracker, Timeline, tensors_in

__all__ = [
    "CATEGORIES", "FLOOR", "MemoryTracker", "StepMemory", "Timeline", "floor_of", "measure_step",
    "new_live_bytes", "record_timeline", "run_or_oom", "saved_activation_bytes", "tracked_run",
]


FLOOR = ("parameters", "gradients", "optimizer_state")  # the model state neither technique removes


def floor_of(breakdown: dict[str, int]) -> int:
    """Parameters + gradients + optimizer state of a breakdown by category (`CATEGORIES`)."""
    return sum(breakdown[name] for name in FLOOR)


@dataclass
class StepMemory:
    """Memory of one step: the peak, what it was made of, and how it was measured.

    `inside_kernels_bytes` is the part of `breakdown["other"]` at the peak that kernels
    allocated inside themselves (on CPU, from the allocator's record; on CUDA, all that
    the caching allocator held beyond the tracked tensors, rounding included).
    """

    peak_bytes: int
    breakdown: dict[str, int]
    device: str
    method: str
    inside_kernels_bytes: int = 0

    @property
    def floor_bytes(self) -> int:
        """Parameters + gradients + optimizer state: what neither technique removes."""
        return floor_of(self.breakdown)


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

    This is the tensor-level tracker on every device (`method=TENSOR_TRACKER`).
    """
    _check_callable(step, "step")
    with MemoryTracker(model=model, optimizer=optimizer) as tracker:
        step()
    return tracker.timeline()


def tracked_run(
    run: Callable[[], object], tracker: MemoryTracker
) -> Callable[..., Timeline]:
    """Run `run()` under `tracker`, with the CPU allocator's record when the device is the CPU.

    Returns `timeline(released=False)`: on CPU the allocator-based timeline
    (`helpers.allocator.allocator_timeline`), elsewhere the tracker's own.
    """
    with AllocatorRecord(enabled=tracker.device_type == "cpu") as record, tracker:
        run()
    if record.recorded:
        return lambda released=False: allocator_timeline(tracker, record.events, released=released)
    return lambda released=False: tracker.timeline(released=released)


def measure_step(
    step: Callable[[], object],
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
) -> StepMemory:
    """Run the zero-argument `step()` once and report its peak memory and breakdown.

    Args:
        step: runs one training step (forward, backward, maybe the optimizer step).
        model: the model it trains; its parameters, gradients and buffers are recognised.
        optimizer: the optimizer `step` uses, so that its state is recognised.

    Returns:
        A `StepMemory`. `peak_bytes` is the largest memory the allocator held on the
        model's device during the step, counting the parameters, gradients and optimizer
        state alive at that moment; on CPU it comes from the CPU allocator's record of
        this run, on CUDA from the caching allocator. `breakdown` splits it into
        `CATEGORIES` by the tracker and sums to `peak_bytes`; what no tracked tensor
        explains is `other`, and `inside_kernels_bytes` says how much of that kernels
        allocated inside themselves. Tensors made before the call (a prepared batch)
        are not counted.
    """
    _check_callable(step, "step")
    tracker = MemoryTracker(model=model, optimizer=optimizer)
    device = torch.device(tracker.device_type)
    if device.type == "cuda":
        torch.cuda.synchronize()
        gc.collect()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    known: list[int] = []
    timeline = tracked_run(lambda: (known.append(tracker.current_bytes), step()), tracker)()
    index = timeline.peak_index
    breakdown = timeline.at(index)
    peak = sum(breakdown.values())
    if device.type != "cuda":
        return StepMemory(peak, breakdown, str(device), CPU_TRACKER, timeline.inside_at(index))
    torch.cuda.synchronize()
    foreign = max(0, before - known[0])  # tensors the notebook holds elsewhere
    allocator_peak = torch.cuda.max_memory_allocated() - foreign
    excess = max(0, allocator_peak - peak)
    breakdown["other"] += excess
    return StepMemory(sum(breakdown.values()), breakdown, str(device), CUDA_ALLOCATOR, excess)


def new_live_bytes(fn: Callable[[], object]) -> int:
    """Bytes of storage created by `fn()` and still alive afterwards, excluding its result."""
    _check_callable(fn, "fn")
    with MemoryTracker() as tracker:
        result = fn()
    return tracker.new_live_bytes(exclude=tensors_in(result))


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


_T = TypeVar("_T")


def run_or_oom(fn: Callable[[], _T]) -> _T | None:
    """Run `fn()` and return its result, or None when CUDA ran out of memory.

    For sweeps over sizes: a size that does not fit must not kill the lesson.
    On `torch.cuda.OutOfMemoryError` the exception (and with it every frame that
    held the failed attempt's tensors) is dropped, garbage is collected and the
    CUDA cache is emptied, so the next size starts from a clean allocator; the
    caller shows "OOM" for this one. Any other exception propagates.
    """
    _check_callable(fn, "fn")
    try:
        return fn()
    except torch.cuda.OutOfMemoryError:
        pass  # leave the except block first: its traceback pins the failed attempt's tensors
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return None
