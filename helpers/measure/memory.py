"""Honest memory measurement for one training step, on CPU and on CUDA.

The core is `MemoryTracker` (in `helpers.measure.tracker`, which explains how it works), a
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
(`helpers.measure.allocator`: every allocation and free, the buffers a kernel allocates inside
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

from helpers.core.device import CPU_TRACKER, CUDA_ALLOCATOR, TENSOR_TRACKER, device_of
from helpers.core.training import cleared_grads, trainable_params
from helpers.core.validate import callable_arg, positive_number
from helpers.measure.allocator import AllocatorRecord, allocator_timeline
from helpers.measure.dispatch import tensors_in
from helpers.measure.timeline import Timeline
from helpers.measure.tracker import MemoryTracker

__all__ = [
    "FLOOR", "Mark", "MicroStepMemory", "StepMemory", "floor_of", "measurable_model", "measure_step",
    "micro_step_memory", "new_live_bytes", "record_timeline", "run_capped", "run_or_oom",
    "saved_activation_bytes", "tracked_run", "tracker_method",
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


def measurable_model(model: nn.Module, caller: str) -> None:
    """Refuse a model on the meta device, where nothing is allocated and so nothing is measured.

    On meta the tracker still counts the tensors a step makes, but no allocator records the
    buffers that kernels allocate inside themselves (a conv net's step read 20.7% below the
    same step on the CPU), so a figure would be silently low. The meta profiler adds those
    buffers; this says to use it.

    Args:
        model: the model a measuring function was given.
        caller: that function's name, for the message.

    Raises:
        ValueError: if any parameter or buffer of `model` is on the meta device. (A `model` that is
            no `nn.Module` is left to `MemoryTracker`, which refuses it.)
    """
    if isinstance(model, nn.Module) and any(t.is_meta for t in (*model.parameters(), *model.buffers())):
        raise ValueError(
            f"{caller} measures a real step, but this model is on the meta device, where nothing is "
            "allocated: its figure would miss what kernels allocate inside themselves. To plan a meta "
            "model, use helpers.meta_profile.Profiler (it adds those buffers) or `python -m helpers.plan`; "
            "to measure, build the model on the CPU or a GPU"
        )


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

    Args:
        step: a zero-argument callable, e.g. one training step.
        model: the model it trains (its state is categorised).
        optimizer: the optimizer it steps, if any.

    Returns:
        The `Timeline` of the run.
    """
    _check_callable(step, "step")
    measurable_model(model, "record_timeline")
    with MemoryTracker(model=model, optimizer=optimizer) as tracker:
        step()
    return tracker.timeline()


def tracked_run(
    run: Callable[[], object], tracker: MemoryTracker
) -> Callable[..., Timeline]:
    """Run `run()` under `tracker`, with the CPU allocator's record when the device is the CPU.

    Returns `timeline(released=False)`: on CPU the allocator-based timeline
    (`helpers.measure.allocator.allocator_timeline`), elsewhere the tracker's own.
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

    Raises:
        ValueError: if `step` is not callable, or `model` is on the meta device (plan it with
            `helpers.meta_profile.Profiler` or `python -m helpers.plan` instead).
    """
    _check_callable(step, "step")
    measurable_model(model, "measure_step")
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
    """Bytes of storage created by `fn()` and still alive afterwards, excluding its result.

    Args:
        fn: a zero-argument callable.

    Returns:
        The bytes, as `MemoryTracker.new_live_bytes` counts them.
    """
    _check_callable(fn, "fn")
    with MemoryTracker() as tracker:
        result = fn()
    return tracker.new_live_bytes(exclude=tensors_in(result))


def saved_activation_bytes(forward: Callable[[], torch.Tensor]) -> int:
    """Bytes that autograd keeps for backward after `forward()`.

    The bytes of tensor storage alive after the call that were not alive before, not
    counting the returned tensor itself. Works under full and selective checkpointing,
    because it watches live storages rather than saved-tensor hooks.

    Args:
        forward: a zero-argument callable returning a tensor that requires grad.

    Returns:
        The saved bytes.

    Raises:
        ValueError: if `forward` returns no tensor, or one that does not require grad.
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


Mark = Callable[[str], int]


@dataclass
class MicroStepMemory:
    """Live memory of an accumulation loop, read after every micro-step.

    - `labels`, `live_after`: one entry per `mark(label)` call of the loop,
      preceded by ("start", live bytes before the loop).
    - `peak_bytes`: the largest live tensor memory at any op of the loop.
    - `peak_activations`: the largest amount of live forward-pass tensors.
    - `method`: how it was measured: `TENSOR_TRACKER` (the tracker of live storages alone,
      on every device).
    """

    labels: list[str]
    live_after: list[int]
    peak_bytes: int
    peak_activations: int
    method: str

    def growth(self, first: int = 1, last: int = -1) -> int:
        """Live bytes at mark `last` minus live bytes at mark `first` (start is mark 0)."""
        return self.live_after[last] - self.live_after[first]


def tracker_method(device: torch.device | str) -> str:
    """The label of a `MemoryTracker` measurement on `device`: always `TENSOR_TRACKER`.

    The tracker alone counts live tensor storages, on every device. It is neither the caching
    allocator (`CUDA_ALLOCATOR`) nor `measure_step`'s CPU figure (`CPU_TRACKER`: the CPU
    allocator's record, with the tracker's categories), so its figures carry their own label.
    Between micro-steps, where lesson 03 reads it, no kernel holds a buffer of its own, so the
    two CPU figures agree there.

    Args:
        device: the device measured (validated).

    Returns:
        `TENSOR_TRACKER`.
    """
    torch.device(device)  # validates the argument
    return TENSOR_TRACKER


def micro_step_memory(loop: Callable[[Mark], object], model: nn.Module) -> MicroStepMemory:
    """Run `loop(mark)` once under a `MemoryTracker` and read live memory at each mark.

    Tensors made before the call (the batches) are not counted; the model's parameters
    and gradients are. Grads are cleared before and after, so runs do not see each
    other's gradients.

    Args:
        loop: the accumulation loop under study; it calls `mark(label)` after each micro-step.
        model: the model the loop trains.

    Returns:
        A `MicroStepMemory`: the labels, live bytes after each mark, the peaks and the method.
    """
    callable_arg("loop", loop, "a callable taking mark(label)")
    trainable_params(model)
    measurable_model(model, "micro_step_memory")
    with cleared_grads(model):
        with MemoryTracker(model=model) as tracker:
            labels, live = ["start"], [tracker.mark("start")]

            def mark(label: str) -> int:
                labels.append(str(label))
                live.append(tracker.mark(str(label)))
                return live[-1]

            loop(mark)
        timeline = tracker.timeline()
    method = tracker_method(device_of(model))
    return MicroStepMemory(
        labels=labels,
        live_after=live,
        peak_bytes=max(timeline.total),
        peak_activations=max(timeline.series["activations"]),
        method=method,
    )


def run_capped(fn: Callable[[], object], budget_bytes: float, device: torch.device, *,
               counted_bytes: int = 0) -> object | None:
    """Run `fn()` with this process's CUDA memory capped at `budget_bytes`; None if it ran out.

    The cap, set with `torch.cuda.set_per_process_memory_fraction`, is what the allocator
    holds now plus `budget_bytes - counted_bytes`, so an allocation past it raises
    `torch.cuda.OutOfMemoryError`. That is caught by `helpers.memory.run_or_oom`, memory is
    freed and None is returned. The previous cap (`LESSONS_GPU_MEMORY_GB`, or none) is put
    back afterwards. CUDA only: on CPU, draw the budget as a labelled line instead.

    Args:
        fn: a zero-argument callable.
        budget_bytes: the memory it may use, in bytes.
        device: a CUDA device.
        counted_bytes: memory already allocated that the budget includes (the parameters
            and optimizer state, which a measured peak counts too).

    Returns:
        What `fn()` returned, or None when it ran out of memory.

    Raises:
        ValueError: if `device` is not CUDA, or `counted_bytes` is not in [0, budget_bytes).
    """
    from helpers.core.device import apply_memory_cap, cuda_index

    if not isinstance(device, torch.device) or device.type != "cuda":
        raise ValueError(f"run_capped needs a CUDA device, got {device!r}; on CPU draw a budget line instead")
    budget = positive_number("budget_bytes", budget_bytes)
    if not 0 <= counted_bytes < budget:
        raise ValueError(f"counted_bytes must be in [0, budget_bytes={budget:.0f}), got {counted_bytes!r}")
    gc.collect()
    torch.cuda.empty_cache()
    index = cuda_index(device)
    total = torch.cuda.get_device_properties(index).total_memory
    fraction = min(1.0, (torch.cuda.memory_reserved(index) + budget - counted_bytes) / total)
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    try:
        return run_or_oom(fn)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, index)
        apply_memory_cap(device)  # put back the LESSONS_GPU_MEMORY_GB cap, if one is set
        gc.collect()
        torch.cuda.empty_cache()
