"""A fitted memory profile of one training update (lesson 06): `fit_profile` -> `MemoryProfile`.

`fit_profile(measure, sizes)` fits the floor, other, activation bytes per example and the
optimizer-phase peak at a few micro-batch sizes from `StepMemory` (`helpers.memory.measure_step`)
or `PhaseMemory` (`helpers.techniques.phases.measure_phases`) results; `MemoryProfile.predict_peak(b)`
predicts the peak for any micro-batch. `helpers.planner` plans with it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from helpers.core.validate import callable_arg, positive_int
from helpers.measure.formulas import linear_fit

__all__ = ["MemoryProfile", "fit_profile"]


# -- The profile -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryProfile:
    """A training job's memory as a function of the micro-batch size `b`.

    It describes the explainer's loop as written, whose `predictions` variable keeps one
    micro-step's outputs alive into the next micro-step (and the last ones through the
    optimizer step):

    - `floor_bytes`: parameters + gradients + optimizer state (no technique here lowers it);
    - `gradient_bytes`: the gradients inside that floor;
    - `other_bytes` + `other_bytes_per_example * b`: the rest at the forward phase's
      peak (buffers, the gradient of the logits, temporaries, allocator slack);
    - `activation_intercept_bytes` + `activation_bytes_per_example * b`: the activations
      alive at the forward phase's peak (the outputs the loop's variable holds included);
    - `optimizer_peak_bytes` + `optimizer_bytes_per_example * b`: the optimizer step's
      peak: the floor and the step's temporaries, plus whatever the training loop still
      holds of its last micro-batch (a `logits` or `loss` variable keeps its tensors alive);
    - `single_step_bytes` + `single_step_bytes_per_example * b`: the forward phase's peak of
      an update of one micro-step (K = 1: no gradients and no earlier outputs alive yet),
      when it was measured (both 0 otherwise);
    - `released`: the same job in a loop with `del predictions` after the loss (a loop that
      keeps no output), when it was measured; `predict_peak(b, keep_output=False)` uses it.

    `fit_profile` makes every line at least every measured point it was fitted on.
    """

    floor_bytes: int
    gradient_bytes: int
    other_bytes: float
    other_bytes_per_example: float
    activation_bytes_per_example: float
    activation_intercept_bytes: float
    optimizer_peak_bytes: float
    optimizer_bytes_per_example: float
    method: str
    micro_batches: tuple[int, ...] = ()
    label: str = ""
    single_step_bytes: float = 0.0
    single_step_bytes_per_example: float = 0.0
    released: MemoryProfile | None = None

    def activations(self, b: int) -> float:
        """Predicted activation bytes alive at the forward phase's peak."""
        return self.activation_intercept_bytes + self.activation_bytes_per_example * positive_int("b", b)

    def _loop(self, keep_output: bool) -> MemoryProfile:
        if not isinstance(keep_output, bool):
            raise TypeError(f"keep_output must be a bool, got {type(keep_output).__name__}")
        return self if keep_output or self.released is None else self.released

    def forward_peak(self, b: int, *, accumulation_steps: int = 2, keep_output: bool = True) -> int:
        """Predicted peak of the forward/backward phase at micro-batch `b`.

        With `accumulation_steps >= 2` the gradients of earlier micro-steps (and, in the
        loop as written, the previous micro-step's outputs) are alive during the forward
        pass. With 1 they do not exist yet: the peak lower by the gradients, at least the
        floor (reached when backward has made every gradient and freed every activation)
        and at least the measured one-step line when there is one. `keep_output=False`
        predicts the loop with `del predictions` (see `released`).
        """
        k = positive_int("accumulation_steps", accumulation_steps)
        p = self._loop(keep_output)
        peak = (p.floor_bytes + p.other_bytes + p.other_bytes_per_example * positive_int("b", b)
                + p.activations(b))
        if k >= 2:
            return round(peak)
        # K = 1: the accumulation line less the gradients (none exist during the first forward),
        # and never below the measured one-step line. That line was fitted at small sizes, where
        # the one-step peak can sit at the end of backward (gradients made, activations freed), so
        # extrapolated alone it grows too slowly; the larger of the two holds in both regimes.
        one = p.single_step_bytes + p.single_step_bytes_per_example * b
        return round(max(peak - p.gradient_bytes, p.floor_bytes, one))

    def optimizer_peak(self, b: int, *, keep_output: bool = True) -> int:
        """Predicted peak of the optimizer step at micro-batch `b`."""
        p = self._loop(keep_output)
        return round(p.optimizer_peak_bytes + p.optimizer_bytes_per_example * positive_int("b", b))

    def predict_peak(self, b: int, *, accumulation_steps: int = 2, keep_output: bool = True) -> int:
        """Predicted peak bytes of an update at micro-batch `b`: the larger of the two phases.

        `accumulation_steps` only matters when it is 1 (see `forward_peak`). `keep_output`
        True (the default) is the explainer's loop as written; False the loop with
        `del predictions` after the loss, when the profile measured it (`released`), else
        the same figure.
        """
        return max(self.forward_peak(b, accumulation_steps=accumulation_steps, keep_output=keep_output),
                   self.optimizer_peak(b, keep_output=keep_output))

    def held_output_bytes(self, b: int, *, accumulation_steps: int = 2) -> int:
        """What `del predictions` after the loss saves at micro-batch `b`: the peak's difference."""
        keep = self.predict_peak(b, accumulation_steps=accumulation_steps)
        return keep - self.predict_peak(b, accumulation_steps=accumulation_steps, keep_output=False)

    @property
    def held_output_bytes_per_example(self) -> float:
        """Bytes per example at the forward phase's peak that the loop's `predictions` variable holds."""
        if self.released is None:
            return 0.0
        rate = self.activation_bytes_per_example + self.other_bytes_per_example
        return rate - self.released.activation_bytes_per_example - self.released.other_bytes_per_example

    def binding_phase(self, b: int, *, accumulation_steps: int = 2, keep_output: bool = True) -> str:
        """'forward' or 'optimizer': the phase whose peak the prediction says is higher."""
        fwd = self.forward_peak(b, accumulation_steps=accumulation_steps, keep_output=keep_output)
        return "forward" if fwd >= self.optimizer_peak(b, keep_output=keep_output) else "optimizer"

    @property
    def crossover(self) -> float:
        """The micro-batch at which the two phase peaks are equal (with accumulation).

        Below it the optimizer step sets the peak; above it the forward pass does.
        It can be below 1 (the forward pass binds at every micro-batch), or infinite.
        """
        rate = (self.activation_bytes_per_example + self.other_bytes_per_example
                - self.optimizer_bytes_per_example)
        fixed = self.floor_bytes + self.other_bytes + self.activation_intercept_bytes
        return math.inf if rate <= 0 else (self.optimizer_peak_bytes - fixed) / rate


def _shortfall(intercept: float, slope: float, points: dict[int, float]) -> float:
    """How far the line intercept + slope * b falls below the highest of `points` (0 if never)."""
    return max([0.0, *(y - (intercept + slope * b) for b, y in points.items())])


def fit_profile(measure: Callable[[int], object], micro_batches: Sequence[int] = (1, 2, 4),
                *, label: str = "") -> MemoryProfile:
    """Measure at each micro-batch size and fit a `MemoryProfile`.

    Args:
        measure: `measure(b)` runs one training update at micro-batch `b` and returns a
            `StepMemory` (from `helpers.memory.measure_step`), a `PhaseMemory` (from
            `helpers.techniques.phases.measure_phases`, which has both phase peaks) or a
            `helpers.meta.step_profile.StepProfile`.
        micro_batches: the sizes to measure (at least two distinct).
        label: a name for the profile.

    Returns:
        The fitted `MemoryProfile`. With phase peaks the forward phase is fitted at every
        size and the optimizer phase is read directly; the first micro-step's peak gives
        the one-step line, and a `released` measurement (the loop with `del predictions`)
        the profile's `released`. With a plain `StepMemory` only the overall peak is known:
        a measurement whose peak holds (almost) no activations is taken as an
        optimizer-step peak, the others as forward peaks, and at least two sizes must
        peak in the forward phase. Activations, other and the optimizer-phase peak are
        fitted as straight lines in `b`. The forward lines (and the one-step line) go
        through the two largest sizes where the forward phase binds (any two, if fewer
        bind): where the optimizer step binds, or at small sizes, the forward peak can sit
        at another point of the pass and follow another line, and the largest sizes are
        the regime that larger micro-batches continue. The optimizer line is a least-squares
        fit of every size. Each line is then raised, if needed, so that it is never below a
        measured point it stands for: a prediction at a measured size is never below the
        measurement.

    Raises:
        ValueError: for fewer than two distinct sizes.
    """
    callable_arg("measure", measure, "a callable measure(b) -> StepMemory")
    sizes = [positive_int("micro_batches[i]", b) for b in micro_batches]
    if len(set(sizes)) < 2:
        raise ValueError(f"micro_batches needs at least two distinct sizes, got {list(micro_batches)}")
    results = {b: measure(b) for b in sorted(set(sizes))}
    for b, m in results.items():
        if not hasattr(m, "breakdown") or not hasattr(m, "peak_bytes"):
            raise TypeError(f"measure({b}) must return a StepMemory or PhaseMemory, got {type(m).__name__}")
    profile = _fit(results, label)
    released = [getattr(m, "released", None) for m in results.values()]
    if all(r is not None for r in released):
        profile = replace(profile, released=_fit(dict(zip(results, released, strict=True)), label))
    return profile


def _fit(results: dict[int, object], label: str) -> MemoryProfile:
    """`fit_profile`'s fit of measured results (see there)."""
    floors = [m.floor_bytes for m in results.values()]
    if max(floors) - min(floors) > 0.01 * max(floors) and all(hasattr(m, "forward_breakdown")
                                                            for m in results.values()):
        raise ValueError(f"the floor changed across micro-batches ({floors}); measure(b) must use the "
                         "same model and optimizer every time")
    forward: dict[int, dict[str, int]] = {}
    binds: dict[int, bool] = {}
    optimizer: dict[int, int] = {}
    first: dict[int, int] = {}
    for b, m in results.items():
        if hasattr(m, "forward_breakdown"):
            forward[b] = m.forward_breakdown
            optimizer[b] = m.optimizer_peak_bytes
            binds[b] = m.forward_peak_bytes >= m.optimizer_peak_bytes
            if getattr(m, "first_step_peak_bytes", 0):
                first[b] = m.first_step_peak_bytes
        elif m.breakdown["activations"] < 0.01 * m.peak_bytes:
            optimizer[b] = m.peak_bytes
        else:
            forward[b], binds[b] = m.breakdown, True
    if len(forward) < 2:
        raise ValueError(
            f"only {len(forward)} of the micro-batches {sorted(results)} peaked in the forward pass, so "
            "activations per example cannot be fitted; measure larger micro-batches, or return a "
            "PhaseMemory from measure_phases, which records both phases"
        )
    # Where the optimizer step binds, the forward peak may sit elsewhere in the pass (a
    # different regime); fit the forward line through the sizes where it binds, if there are two.
    xs = sorted(b for b in forward if binds[b])
    xs = xs if len(xs) >= 2 else sorted(forward)
    top = xs[-2:]  # the two largest: the regime that larger micro-batches continue
    acts = linear_fit(top, [forward[b]["activations"] for b in top])
    other = linear_fit(top, [forward[b]["other"] for b in top])
    if len(optimizer) >= 2:
        opt = linear_fit(sorted(optimizer), [optimizer[b] for b in sorted(optimizer)])
        opt_base, opt_rate = opt.intercept, opt.slope
    else:
        opt_base, opt_rate = float(max(optimizer.values(), default=0)), 0.0
    grads = [forward[b]["gradients"] for b in xs]
    floor = max(b["parameters"] + b["gradients"] + b["optimizer_state"] for b in forward.values())
    # Never below a measured point: the forward line at the sizes where it binds, the
    # optimizer line at every size, the one-step line wherever it is above the optimizer step.
    fwd_points = {b: float(sum(forward[b].values())) for b in xs}
    other_base = other.intercept + _shortfall(
        floor + other.intercept + acts.intercept, other.slope + acts.slope, fwd_points)
    opt_base += _shortfall(opt_base, opt_rate, {b: float(v) for b, v in optimizer.items()})
    one_base = one_rate = 0.0
    if len(first) >= 2:
        ones = [b for b in xs if b in first]
        ones = (ones if len(ones) >= 2 else sorted(first))[-2:]
        line = linear_fit(ones, [first[b] for b in ones])
        one_points = {b: float(v) for b, v in first.items() if v > optimizer.get(b, 0)}
        one_base = line.intercept + _shortfall(line.intercept, line.slope, one_points)
        one_rate = line.slope
    method = next(iter(results.values())).method
    return MemoryProfile(
        floor_bytes=floor, gradient_bytes=max(grads), other_bytes=other_base,
        other_bytes_per_example=other.slope, activation_bytes_per_example=acts.slope,
        activation_intercept_bytes=acts.intercept,
        optimizer_peak_bytes=opt_base, optimizer_bytes_per_example=opt_rate, method=method,
        micro_batches=tuple(sorted(results)), label=label,
        single_step_bytes=one_base, single_step_bytes_per_example=one_rate,
    )
