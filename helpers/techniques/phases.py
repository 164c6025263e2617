"""One training update measured phase by phase: the forward/backward peak and the step's (lesson 06).

`helpers.memory.measure_step` gives an update's overall peak; lesson 06 also needs to know
which phase sets it, because the optimizer step's temporaries can bind at small micro-batches.

- `measure_phases(update, model=, optimizer=)` -> `PhaseMemory`: both phase peaks, each with
  its breakdown; it reads like a `StepMemory`, so `helpers.measure.memory_profile.fit_profile` takes either.
- `UpdateMeasurer(model)`: `measurer(b)` measures one accumulation update at micro-batch `b`
  of token sequences, with or without checkpointing (`helpers.techniques.checkpointing.apply_ac`).
- `accumulate_update`: the accumulation loop being measured, the explainer's loop as the
  notebook writes it: `predictions` and `loss` stay bound until the next micro-step
  reassigns them, so one micro-step's logits are alive during the next one's forward pass,
  and the last ones through `optimizer.step()`.

Every `PhaseMemory` from `UpdateMeasurer` also says what the loop with `del predictions`
after the loss (a loop that keeps no output) would peak at: `PhaseMemory.released`,
taken from the same run (`helpers.measure.tracker.MemoryTracker.could_release`).

Re-exported from `helpers.techniques.update_memory` (one update measured whole): `measure_update`,
`measure_config`, `ConfigMemory`, `breakdown_for`, `activation_sweep`.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from helpers.core.data import token_batch
from helpers.core.device import device_of
from helpers.core.training import lm_loss, make_optimizer
from helpers.core.validate import callable_arg, positive_int
from helpers.measure.memory import floor_of, measurable_model, tracked_run
from helpers.measure.timeline import Timeline
from helpers.measure.tracker import MemoryTracker, release_point
from helpers.models.gpt import GPT
from helpers.techniques.checkpointing import apply_ac

__all__ = ["PhaseMemory", "UpdateMeasurer", "accumulate_update", "measure_phases", "phase_peaks"]


def accumulate_update(
    model: nn.Module, optimizer: torch.optim.Optimizer, batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    *, loss_fn: Callable[[object, torch.Tensor], torch.Tensor] = lm_loss, autocast: torch.dtype | None = None,
) -> None:
    """One optimizer update from `len(batches)` micro-batches: the loop the notebook teaches, as written.

    `predictions` and `loss` are variables, so each micro-step's outputs stay alive until the
    next micro-step reassigns them (through its forward pass), and the last ones through
    `optimizer.step()`. `release_point` only tells a measuring tracker where a loop with
    `del predictions` would drop them; it changes nothing here. `loss_fn(predictions, targets)`
    is the mean loss (default `lm_loss`; e.g. `BatchSpec.loss` for a model that returns an
    object with `.logits`). `autocast` (e.g. `torch.bfloat16`) runs the forward pass and the
    loss under `torch.autocast` of the batch's device, mixed precision over the model's own
    (fp32) weights; backward and the step run outside it, as PyTorch recommends.
    """
    optimizer.zero_grad(set_to_none=True)
    for idx, targets in batches:
        with _autocast(idx.device, autocast):
            predictions = model(idx)
            loss = loss_fn(predictions, targets)
        release_point(predictions, loss)
        (loss / len(batches)).backward()
    optimizer.step()


def _autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """`torch.autocast` of `device`'s type in `dtype`, or a context that does nothing for None."""
    return contextlib.nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


# -- Measuring both phases of an update ------------------------------------------------------------


class PhasePeaks:
    """What every record of both phase peaks derives the same way (`PhaseMemory` here,
    `helpers.meta.step_profile.StepProfile`): the floor at the peak and the phase that binds.
    The record supplies `breakdown`, `forward_peak_bytes` and `optimizer_peak_bytes`.
    """

    @property
    def floor_bytes(self) -> int:
        """Parameters + gradients + optimizer state at the peak."""
        return floor_of(self.breakdown)

    @property
    def binding_phase(self) -> str:
        """'forward' when the forward/backward phase sets the peak, else 'optimizer'."""
        return "forward" if self.forward_peak_bytes >= self.optimizer_peak_bytes else "optimizer"


@dataclass(frozen=True)
class PhaseMemory(PhasePeaks):
    """One update's memory, with the peak of each phase.

    It reads like a `helpers.memory.StepMemory` (`peak_bytes`, `breakdown`, `device`,
    `method`, `floor_bytes`, `inside_kernels_bytes`), and adds the forward/backward
    phase's peak and the optimizer step's peak, each with its own breakdown.

    - `first_step_peak_bytes` / `first_step_breakdown`: the peak of the first micro-step
      (its forward and backward passes), which is what an update of one micro-step (K = 1)
      peaks at before its optimizer step: no gradients and no earlier outputs exist yet.
    - `released`: the same update as a loop with `del predictions` after the loss would
      hold it (the outputs die at their release point), or None if the update marked no
      release point (`helpers.measure.tracker.release_point`).
    """

    peak_bytes: int
    breakdown: dict[str, int]
    device: str
    method: str
    forward_peak_bytes: int
    forward_breakdown: dict[str, int]
    optimizer_peak_bytes: int
    optimizer_breakdown: dict[str, int]
    first_step_peak_bytes: int = 0
    first_step_breakdown: dict[str, int] | None = None
    inside_kernels_bytes: int = 0
    released: PhaseMemory | None = None


def phase_peaks(timeline: Timeline) -> dict[str, tuple[int, dict[str, int], int]]:
    """(peak bytes, breakdown, inside-kernel bytes) of a timeline's phases of one update.

    Keys: "forward" (everything before the optimizer step), "optimizer" (inside
    `optimizer.step()`, zeros if it never ran), "first step" (up to the start of the
    second micro-step's forward pass, or the whole forward phase if there is one), and
    "overall".
    """
    total, phases = timeline.total, timeline.phases
    second = next((i for i in range(1, len(phases)) if phases[i] == "forward"
                   and phases[i - 1] in ("backward", "recompute")), len(phases))

    def peak(indices: list[int]) -> tuple[int, dict[str, int], int]:
        if not indices:
            return 0, dict.fromkeys(timeline.series, 0), 0
        i = max(indices, key=total.__getitem__)
        return total[i], timeline.at(i), timeline.inside_at(i)

    out = {
        "forward": peak([i for i, p in enumerate(phases) if p != "optimizer"]),
        "optimizer": peak([i for i, p in enumerate(phases) if p == "optimizer"]),
        "first step": peak([i for i in range(second) if phases[i] != "optimizer"]),
    }
    out["overall"] = max(out["forward"], out["optimizer"], key=lambda v: v[0])
    return out


def measure_phases(
    update: Callable[[], object], *, model: nn.Module, optimizer: torch.optim.Optimizer
) -> PhaseMemory:
    """Run `update()` once (micro-steps, then `optimizer.step()`) and measure both phase peaks.

    Args:
        update: one whole update (zero-argument). Run one update first, so that the
            optimizer state exists (steady training).
        model: the model it trains.
        optimizer: the optimizer it steps; what runs inside `optimizer.step()` is the
            optimizer phase, everything before it the forward phase (forward and backward).

    Returns:
        A `PhaseMemory`. The categories come from `helpers.measure.tracker.MemoryTracker`. The
        totals come from the allocator: on CPU its own record of this run (`method`
        "cpu-tracker": the tracker's categories over the CPU allocator's total, what no
        tracked tensor explains in `other`); on CUDA the caching allocator's
        `max_memory_allocated`, read just before the step and over the step
        ("cuda-allocator"), whatever it holds beyond the tracked tensors in `other`.
        If the update marks release points (`accumulate_update` does), `released` is the
        same run as a loop with `del predictions` would hold it.
    """
    callable_arg("update", update, "a zero-argument callable")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    measurable_model(model, "measure_phases")
    tracker = MemoryTracker(model=model, optimizer=optimizer)
    cuda = tracker.device_type == "cuda"
    allocator: dict[str, int] = {}

    def before_step(*_: object) -> None:
        if cuda:
            torch.cuda.synchronize()
            allocator["forward"] = torch.cuda.max_memory_allocated()
            torch.cuda.reset_peak_memory_stats()

    if cuda:
        torch.cuda.synchronize()
        gc.collect()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    handle = optimizer.register_step_pre_hook(before_step)
    known: list[int] = []
    try:
        timeline_of = tracked_run(lambda: (known.append(tracker.current_bytes), update()), tracker)
    finally:
        handle.remove()
    peaks = phase_peaks(timeline_of(False))
    excess = {"forward": 0, "optimizer": 0}
    if cuda:
        torch.cuda.synchronize()
        allocator.setdefault("forward", torch.cuda.max_memory_allocated())
        allocator["optimizer"] = torch.cuda.max_memory_allocated() if peaks["optimizer"][0] else 0
        foreign = max(0, before - known[0])  # tensors the notebook holds elsewhere
        for key in excess:
            if allocator[key]:
                excess[key] = max(0, allocator[key] - foreign - peaks[key][0])
    device = str(device_of(model))
    method = "cuda-allocator" if cuda else "cpu-tracker"
    keep = _phase_memory(peaks, excess, device, method)
    if not any(rec.release != float("inf") for rec in tracker.records):
        return keep
    return replace(keep, released=_phase_memory(phase_peaks(timeline_of(True)), excess, device, method))


def _phase_memory(peaks: dict[str, tuple[int, dict[str, int], int]], excess: dict[str, int],
                  device: str, method: str) -> PhaseMemory:
    """A `PhaseMemory` from `phase_peaks`, with the CUDA allocator's excess per phase added to `other`."""
    found = {}
    for key, extra in (("forward", excess["forward"]), ("optimizer", excess["optimizer"]),
                       ("first step", excess["forward"])):
        total, breakdown, inside = peaks[key]
        breakdown = {**breakdown, "other": breakdown["other"] + extra}
        found[key] = (total + extra, breakdown, inside + extra)
    fwd, opt, first = found["forward"], found["optimizer"], found["first step"]
    top = fwd if fwd[0] >= opt[0] else opt
    return PhaseMemory(top[0], dict(top[1]), device, method, fwd[0], fwd[1], opt[0], opt[1],
                       first[0], first[1], top[2])


class UpdateMeasurer:
    """`measurer(b)` measures one update of `steps` micro-batches of `b` token sequences.

    With `steps >= 2` the gradients of the previous micro-steps (and the previous micro-step's
    outputs, which the loop's `predictions` variable still holds) are alive during each
    forward pass, as in any accumulation update; the peak is then the same for every
    number of steps, and the first micro-step's peak (`PhaseMemory.first_step_peak_bytes`)
    is that of an update of one micro-step.

    Args:
        model: the GPT measured.
        checkpointed: set `model.block_wrapper` to `apply_ac`'s "full" mode while measuring.
        optimizer: a name in `OPTIMIZERS`, or an existing optimizer of `model` to share; it
            is warmed up once so that its state exists.
        steps: micro-steps per update.
        seed: seeds the token batches.
    """

    def __init__(self, model: GPT, *, checkpointed: bool = False,
                 optimizer: str | torch.optim.Optimizer = "adam", steps: int = 2, seed: int = 0) -> None:
        if not isinstance(model, GPT):
            raise TypeError(f"model must be a helpers.models.gpt.GPT, got {type(model).__name__}")
        if not isinstance(checkpointed, bool):
            raise TypeError(f"checkpointed must be a bool, got {type(checkpointed).__name__}")
        self.model = model
        self.checkpointed = checkpointed
        self.steps = positive_int("steps", steps)
        self.seed = seed
        if isinstance(optimizer, torch.optim.Optimizer):
            self.optimizer = optimizer  # shared: one set of optimizer state on the device
        else:
            self.optimizer = make_optimizer(optimizer, model)
        self._warm = bool(self.optimizer.state)

    def batches(self, micro_batch: int, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """`steps` token micro-batches of `micro_batch` sequences on the model's device."""
        cfg, device = self.model.cfg, device_of(self.model)
        return [token_batch(micro_batch, cfg.seq_len, cfg.vocab_size, seed=self.seed + i, device=device)
                for i in range(steps)]

    def update_for(self, micro_batch: int, steps: int | None = None) -> Callable[[], None]:
        """A zero-argument update (with this measurer's checkpointing) for `micro_batch` x `steps`."""
        positive_int("micro_batch", micro_batch)
        batches = self.batches(micro_batch, positive_int("steps", self.steps if steps is None else steps))
        mode = "full" if self.checkpointed else "none"

        def update() -> None:
            with apply_ac(self.model, mode):
                accumulate_update(self.model, self.optimizer, batches)

        return update

    def __call__(self, micro_batch: int, steps: int | None = None) -> PhaseMemory:
        """Measure one update of `steps` (default: this measurer's) micro-batches of `micro_batch`."""
        if not self._warm:
            self.update_for(1, 1)()  # the optimizer state exists from here on
            self._warm = True
        update = self.update_for(micro_batch, steps)
        try:
            return measure_phases(update, model=self.model, optimizer=self.optimizer)
        finally:
            self.optimizer.zero_grad(set_to_none=True)
