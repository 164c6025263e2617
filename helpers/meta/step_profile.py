"""One profiled training update's record, read from a tracker's timeline (lesson 09's profiler).

`helpers.meta_profile.Profiler.step` returns a `StepProfile`: the update's peak and the peak of
each phase (the end of the forward pass, the backward pass, the optimizer step), each with its
breakdown by category, and the timeline it was read from. `_step_profile` reads one from a
`helpers.measure.timeline.Timeline`; `_marks_blocks_done` marks, in each micro-step's backward, the point
where every block's backward has run (`BLOCKS_DONE`, which `helpers.plan.peak_envelope` cuts at).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from helpers.measure.timeline import Timeline
from helpers.measure.tracker import MemoryTracker
from helpers.techniques.checkpointing import blocks_of
from helpers.techniques.phases import PhasePeaks, phase_peaks

__all__ = ["BLOCKS_DONE", "StepProfile"]

BLOCKS_DONE = "blocks done"


@contextlib.contextmanager
def _marks_blocks_done(model: nn.Module, tracker: MemoryTracker | None) -> Iterator[None]:
    """During one forward pass: the tracker marks `BLOCKS_DONE` when backward has passed every block.

    The first call of the first block (`blocks_of`) hooks its input, whose gradient exists once the
    backward of every block has run; what follows (the embedding's backward) is the part of the pass
    whose memory does not grow with the number of blocks (`helpers.plan.peak_envelope`). The hook returns
    nothing, so the gradient is unchanged; no mark is made without blocks or an input that needs grad.
    """
    try:
        first = blocks_of(model)[0] if tracker is not None else None
    except ValueError:
        first = None
    if first is None:
        yield
        return

    def hook(module: nn.Module, args: tuple[object, ...]) -> None:
        handle.remove()  # the first call only: a checkpoint's recompute calls the block again
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and x.requires_grad:
            x.register_hook(on_grad)

    def on_grad(grad: torch.Tensor) -> None:
        tracker.mark(BLOCKS_DONE, collect=False)

    handle = first.register_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()


# ---------------------------------------------------------------------------
# One profiled update
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StepProfile(PhasePeaks):
    """One accumulation update's memory, by phase; reads like lesson 06's `PhaseMemory`.

    `forward_end_*` is what is alive when the last micro-step's loss exists (before its
    backward); `backward_*` the peak of the backward passes (recomputation included);
    `optimizer_*` the peak inside `optimizer.step()`. `forward_peak_*` is the peak of
    everything before the step (forward and backward), as `fit_profile` expects, and
    `first_step_*` that of the first micro-step alone (an update of one micro-step).
    `inside_kernels_bytes` is the part of "other" at the peak that kernels allocated inside
    themselves (on meta, `kernel_buffer_bytes`: bytes per call of each fused-attention
    backward, modelled; on a real CPU, the allocator's record). `released` is the same
    update as a loop with `del predictions` after the loss would hold it.
    """

    micro_batch: int
    accumulation_steps: int
    peak_bytes: int
    breakdown: dict[str, int]
    forward_end_bytes: int
    forward_end_breakdown: dict[str, int]
    backward_peak_bytes: int
    backward_breakdown: dict[str, int]
    optimizer_peak_bytes: int
    optimizer_breakdown: dict[str, int]
    forward_peak_bytes: int
    forward_breakdown: dict[str, int]
    device: str
    method: str
    target: str
    precision: str
    kernels: tuple[str, ...] = ()
    first_step_peak_bytes: int = 0
    first_step_breakdown: dict[str, int] | None = None
    inside_kernels_bytes: int = 0
    kernel_buffer_bytes: dict[str, int] = field(default_factory=dict)
    released: StepProfile | None = None
    timeline: Timeline | None = field(default=None, repr=False, compare=False)

    @property
    def phases(self) -> dict[str, dict[str, int]]:
        """The three phase breakdowns by name."""
        return {
            "end of forward": self.forward_end_breakdown,
            "backward peak": self.backward_breakdown,
            "optimizer step peak": self.optimizer_breakdown,
        }


def _step_profile(timeline: Timeline, fields: dict[str, object]) -> StepProfile:
    """A `StepProfile` from one timeline of the update (`fields`: the ones that do not come from it)."""
    end_mark = max(i for i, label in timeline.marks if label == "end of forward")
    total, phases = timeline.total, timeline.phases
    bwd = [i for i, p in enumerate(phases) if p in ("backward", "recompute")]
    peaks = phase_peaks(timeline)
    backward = timeline.at(max(bwd, key=total.__getitem__)) if bwd else dict.fromkeys(timeline.series, 0)
    end = timeline.at(end_mark)
    top, fwd, opt, first = peaks["overall"], peaks["forward"], peaks["optimizer"], peaks["first step"]
    return StepProfile(
        peak_bytes=top[0], breakdown=dict(top[1]), forward_end_bytes=sum(end.values()),
        forward_end_breakdown=end, backward_peak_bytes=sum(backward.values()), backward_breakdown=backward,
        optimizer_peak_bytes=opt[0], optimizer_breakdown=opt[1], forward_peak_bytes=fwd[0],
        forward_breakdown=fwd[1], first_step_peak_bytes=first[0], first_step_breakdown=first[1],
        inside_kernels_bytes=top[2], timeline=timeline, **fields,
    )
