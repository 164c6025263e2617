"""One training update measured phase by phase: the forward/backward peak and the step's (lesson 06).

`helpers.memory.measure_step` gives an update's overall peak; lesson 06 also needs to know
which phase sets it, because the optimizer step's temporaries can bind at small micro-batches.

- `measure_phases(update, model=, optimizer=)` -> `PhaseMemory`: both phase peaks, each with
  its breakdown; it reads like a `StepMemory`, so `helpers.planner.fit_profile` takes either.
- `UpdateMeasurer(model)`: `measurer(b)` measures one accumulation update at micro-batch `b`
  of token sequences, with or without checkpointing (`checkpoint_every_block`).
- `accumulate_update`: the accumulation loop being measured (the one the notebook teaches).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from helpers.checks import callable_arg, positive_int
from helpers.data import token_batch
from helpers.memory import MemoryTracker, floor_of
from helpers.models import GPT, device_of
from helpers.training import lm_loss, make_optimizer

__all__ = [
    "PhaseMemory",
    "UpdateMeasurer",
    "accumulate_update",
    "checkpoint_every_block",
    "measure_phases",
]



def checkpoint_every_block(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A `model.block_wrapper` that checkpoints each block (non-reentrant)."""
    return checkpoint(block, x, use_reentrant=False)


def accumulate_update(
    model: nn.Module, optimizer: torch.optim.Optimizer, batches: Sequence[tuple[torch.Tensor, torch.Tensor]]
) -> None:
    """One optimizer update from `len(batches)` micro-batches: the loop the notebook teaches."""
    optimizer.zero_grad(set_to_none=True)
    for idx, targets in batches:
        loss = lm_loss(model(idx), targets)
        (loss / len(batches)).backward()
    optimizer.step()


# -- Measuring both phases of an update ------------------------------------------------------------


class PhasePeaks:
    """What every record of both phase peaks derives the same way (`PhaseMemory` here,
    `helpers.meta_profile.StepProfile`): the floor at the peak and the phase that binds.
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
    `method`, `floor_bytes`), and adds the forward/backward phase's peak and the
    optimizer step's peak, each with its own breakdown.
    """

    peak_bytes: int
    breakdown: dict[str, int]
    device: str
    method: str
    forward_peak_bytes: int
    forward_breakdown: dict[str, int]
    optimizer_peak_bytes: int
    optimizer_breakdown: dict[str, int]


def measure_phases(
    update: Callable[[], object], *, model: nn.Module, optimizer: torch.optim.Optimizer
) -> PhaseMemory:
    """Run `update()` once (micro-steps, then `optimizer.step()`) and measure both phase peaks.

    The categories come from `helpers.memory.MemoryTracker`; the optimizer phase is
    what runs inside `optimizer.step()`, the forward phase everything before it
    (forward and backward passes). On CPU the peaks are the tracker's
    (`method="cpu-tracker"`); on CUDA they are the caching allocator's
    `max_memory_allocated`, read just before the step and over the step
    (`method="cuda-allocator"`), and whatever the allocator holds beyond the tracked
    tensors is reported as `other`, as `helpers.memory.measure_step` does.
    Run one update first, so that the optimizer state exists (steady training).
    """
    callable_arg("update", update, "a zero-argument callable")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
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
    try:
        with tracker:
            known_before = tracker.current_bytes
            update()
    finally:
        handle.remove()
    timeline = tracker.timeline()
    total = timeline.total
    in_opt = [i for i, p in enumerate(timeline.phases) if p == "optimizer"]
    in_fwd = [i for i, p in enumerate(timeline.phases) if p != "optimizer"]
    fwd = timeline.at(max(in_fwd, key=total.__getitem__))
    opt = timeline.at(max(in_opt, key=total.__getitem__)) if in_opt else dict.fromkeys(fwd, 0)
    if cuda:
        torch.cuda.synchronize()
        allocator.setdefault("forward", torch.cuda.max_memory_allocated())
        allocator["optimizer"] = torch.cuda.max_memory_allocated() if in_opt else 0
        foreign = max(0, before - known_before)  # tensors the notebook holds elsewhere
        for breakdown, key in ((fwd, "forward"), (opt, "optimizer")):
            if key == "optimizer" and not in_opt:
                continue
            breakdown["other"] += max(0, allocator[key] - foreign - sum(breakdown.values()))
    f_peak, o_peak = sum(fwd.values()), sum(opt.values())
    top = fwd if f_peak >= o_peak else opt
    device = str(device_of(model))
    method = "cuda-allocator" if cuda else "cpu-tracker"
    return PhaseMemory(max(f_peak, o_peak), dict(top), device, method, f_peak, fwd, o_peak, opt)


class UpdateMeasurer:
    """`measurer(b)` measures one update of `steps` micro-batches of `b` token sequences.

    It keeps one optimizer (a name in `OPTIMIZERS`, or an existing optimizer of `model`
    to share), warmed up once so that its state exists, and sets `model.block_wrapper`
    to `checkpoint_every_block` while measuring when `checkpointed` is true. With
    `steps >= 2` the gradients of the previous micro-steps are alive during each
    forward pass, as in any accumulation update; the peak is then the same for every
    number of steps.
    """

    def __init__(self, model: GPT, *, checkpointed: bool = False,
                 optimizer: str | torch.optim.Optimizer = "adam", steps: int = 2, seed: int = 0) -> None:
        if not isinstance(model, GPT):
            raise TypeError(f"model must be a helpers.models.GPT, got {type(model).__name__}")
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
        wrapper = checkpoint_every_block if self.checkpointed else None

        def update() -> None:
            previous, self.model.block_wrapper = self.model.block_wrapper, wrapper
            try:
                accumulate_update(self.model, self.optimizer, batches)
            finally:
                self.model.block_wrapper = previous

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
