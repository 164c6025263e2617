"""The memory planner: a fitted memory profile, and the rule that picks B, K, checkpointing (lesson 06).

The API that lesson 06 builds and checks, and that later lessons reuse (lesson 08's ledger,
lesson 09's meta-device profiles). The lesson's instruments (its model, the phase
measurements, the widget, the exercises) are in `helpers.lessons.lesson06`.

- `DECISION_RULE`, `RULE_COROLLARY`, `decision_rule()`: which technique first, stated once.
  `recommend`'s reasons, lesson 08's follow-up answer and lessons 06 and 09 quote these
  strings (a test checks the notebooks), so the rule cannot drift between them.
- `fit_profile(measure, sizes)` -> `MemoryProfile`: the floor, other, activation bytes per
  example and the optimizer-phase peak, fitted at a few micro-batch sizes from
  `StepMemory` (`helpers.memory.measure_step`) or `PhaseMemory`
  (`helpers.phases.measure_phases`) results; `MemoryProfile.predict_peak(b)` predicts
  the peak for any micro-batch.
- `recommend` -> `Plan`: `DECISION_RULE` applied to a budget (steps 4 and 5: the largest
  micro-batch at or above `min_micro_batch` that fits without checkpointing, else with it,
  then accumulate), or a `ValueError` that names the floor, the rule's step that stopped it,
  and the remedies (`REMEDIES`) when nothing fits.
- `popular_estimates` -> `Estimate`s: the rules of thumb people use (weights only, 16 and 18
  bytes per parameter, Korthikanti's activation formula with and without recomputation,
  `korthikanti_activation_bytes`) beside a measurement.
- `remedy_floors` -> `RemedyFloor`s: what each state remedy leaves of the measured floor, per
  worker, with the caveat a remedy carries (mixed precision saves nothing on the floor; pure
  bf16 loses small updates; FSDP's 1/W is the persistent state, not the per-rank peak).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from helpers.formulas import korthikanti_activation_bytes, linear_fit
from helpers.models import GPTConfig
from helpers.validate import callable_arg, choice, positive_int, positive_number

__all__ = [
    "CAVEATS", "DECISION_RULE", "EIGHT_BIT", "FSDP", "GB", "MIXED_PRECISION", "PURE_BF16", "REMEDIES",
    "RULE_COROLLARY",
    "Estimate", "MemoryProfile", "Plan", "RemedyFloor", "decision_rule", "fit_profile", "popular_estimates",
    "recommend", "remedy_floors",
]

GB = 1e9  # the explainer speaks in decimal gigabytes
REMEDIES = (
    "shard the model state across workers (FSDP / ZeRO-3, lesson 07)",
    "shard the optimizer state (ZeRO-1)",
    "keep the state in lower precision (8-bit or bf16 Adam moments; pure bf16 weights need "
    "stochastic rounding or Kahan summation)",
    "offload the optimizer state (or the parameters) to CPU memory",
)

# -- The rule: which technique first ---------------------------------------------------------------
# NOTE [one rule]: "if activations dominate, checkpoint" and "the largest micro-batch without
# checkpointing first" look opposed. They agree once the throughput of small micro-batches is part
# of the rule: shrinking the micro-batch is free in FLOPs until it starts to idle the device. This is
# the rule's only home: `recommend`'s reasons quote its steps, `helpers.review` quotes it in lesson
# 08, and lessons 06 and 09 restate it word for word (tests/test_planner.py checks the notebooks).
DECISION_RULE: tuple[str, ...] = (
    "Profile one update: the floor (weights + gradients + optimizer state), the activations per "
    "example, and the optimizer step's peak.",
    "If the floor or the optimizer step does not fit, neither technique helps: shard, offload or "
    "shrink the model state.",
    "Otherwise find the smallest micro-batch that still keeps the device busy (`min_micro_batch`; "
    "lesson 03 §7 measures throughput against micro-batch size).",
    "Take the largest micro-batch at or above that minimum that fits without checkpointing, and "
    "accumulate K = B_eff / B micro-steps: accumulation adds no FLOPs, it only costs the throughput "
    "of smaller micro-batches.",
    "Only if none fits, checkpoint (about one extra forward per micro-step) and take the largest "
    "micro-batch at or above the minimum that fits with it.",
)
RULE_COROLLARY = (
    "So \"checkpoint when activations dominate\" is the case where shrinking the micro-batch until "
    "it fits would take it below the minimum that keeps the device busy."
)


def decision_rule() -> str:
    """`DECISION_RULE` as a numbered list, then `RULE_COROLLARY` (plain text that is also Markdown)."""
    steps = "\n".join(f"{i}. {step}" for i, step in enumerate(DECISION_RULE, 1))
    return f"{steps}\n\n{RULE_COROLLARY}"


def _step(n: int) -> str:
    return f"Rule step {n}: {DECISION_RULE[n - 1]}"


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
            `helpers.phases.measure_phases`, which has both phase peaks) or a
            `helpers.meta_profile.StepProfile`.
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


# -- The planner -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """The planner's choice for one budget and effective batch."""

    micro_batch: int
    accumulation_steps: int
    checkpoint: bool
    predicted_peak_bytes: int
    reason: str
    budget_bytes: float = 0.0

    @property
    def effective_batch(self) -> int:
        """Examples per optimizer update: micro-batch x accumulation steps."""
        return self.micro_batch * self.accumulation_steps

    def describe(self) -> str:
        """E.g. '4 x 8, checkpointed (predicted peak 12.3 MB)'."""
        ck = ", checkpointed" if self.checkpoint else ""
        peak = _mb(self.predicted_peak_bytes)
        return f"{self.micro_batch} x {self.accumulation_steps}{ck} (predicted peak {peak})"


def _mb(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.2f} MiB"


Verify = Callable[[int, int, bool], int]


def _fits(profile: MemoryProfile, sizes: Sequence[int], effective_batch: int, budget: float,
          verify: Verify | None, checkpoint: bool, skipped: list[str]) -> tuple[int, int] | None:
    """The largest size whose predicted peak fits (and, with `verify`, whose checked peak fits too)."""
    for b in sizes:
        k = effective_batch // b
        peak = profile.predict_peak(b, accumulation_steps=k)
        if peak > budget:
            continue
        if verify is not None:
            checked = verify(b, k, checkpoint)
            if checked > budget:
                ck = ", checkpointed" if checkpoint else ""
                skipped.append(f"{b} x {k}{ck} was predicted at {_mb(peak)} but checked at {_mb(checked)}")
                continue
        return b, peak
    return None


def _skipped(skipped: list[str], budget: float) -> str:
    return ("" if not skipped else f" Skipped, over the {_mb(budget)} budget when checked: "
            f"{'; '.join(skipped)}.")


def recommend(budget_bytes: float, effective_batch: int, plain: MemoryProfile,
              checkpointed: MemoryProfile | None = None, *, min_micro_batch: int = 1,
              verify: Verify | None = None) -> Plan:
    """Choose micro-batch, accumulation steps and checkpointing for a memory budget.

    Applies `DECISION_RULE` to the profiles (step 1, the profiling, is `fit_profile`'s job):

    - step 4: take the largest micro-batch `b` that is at least `min_micro_batch`, divides
      `effective_batch`, and fits `budget_bytes` without checkpointing
      (`plain.predict_peak(b) <= budget_bytes`), with `effective_batch // b` accumulation steps;
    - step 5: only if none fits, the same with checkpointing (`checkpointed`, when given);
    - step 2: if nothing fits, raise.

    `min_micro_batch` is step 3's minimum: the smallest micro-batch that still keeps the device
    busy enough for you. Each `Plan.reason` quotes the step that chose it. `verify(b, k,
    checkpoint)`, when given, returns the checked peak of a candidate that the profile predicts
    to fit (e.g. a full profile of that configuration); a candidate whose checked peak is over
    the budget is skipped, and the next smaller one is tried: the planner never refuses while a
    smaller micro-batch fits. Raises `ValueError`
    for a budget or effective batch that is not positive, for a `min_micro_batch` above the
    effective batch, and when nothing fits: that message names the floor in bytes, says whether
    the floor, the optimizer step or the minimum micro-batch is what does not fit, and lists the
    remedies for model state.
    """
    budget = positive_number("budget_bytes", budget_bytes)
    effective_batch = positive_int("effective_batch", effective_batch)
    min_micro_batch = positive_int("min_micro_batch", min_micro_batch)
    for name, p in (("plain", plain), ("checkpointed", checkpointed)):
        if not (p is None and name == "checkpointed") and not isinstance(p, MemoryProfile):
            raise TypeError(f"{name} must be a MemoryProfile, got {type(p).__name__}")
    if min_micro_batch > effective_batch:
        raise ValueError(f"min_micro_batch={min_micro_batch} is larger than effective_batch="
                         f"{effective_batch}; it must be at most the effective batch")
    sizes = [b for b in range(effective_batch, min_micro_batch - 1, -1) if effective_batch % b == 0]
    skipped: list[str] = []
    found = _fits(plain, sizes, effective_batch, budget, verify, False, skipped)
    if found:
        b, peak = found
        k = effective_batch // b
        why = ("the whole effective batch fits in one pass, so there is nothing to accumulate"
               if k == 1 else f"it is the largest micro-batch from {min_micro_batch} up, dividing "
               f"{effective_batch}, that fits without checkpointing, so accumulate {k} micro-steps and "
               "spend no recompute")
        reason = (f"Micro-batch {b}: {why} (predicted peak {_mb(peak)} of {_mb(budget)}). {_step(4)}"
                  + _skipped(skipped, budget))
        return Plan(b, k, False, peak, reason, budget)
    smallest = plain.predict_peak(sizes[-1], accumulation_steps=effective_batch // sizes[-1])
    if checkpointed is not None:
        found = _fits(checkpointed, sizes, effective_batch, budget, verify, True, skipped)
        if found:
            b, peak = found
            k = effective_batch // b
            reason = (f"Micro-batch {b} with checkpointing: without it even micro-batch {sizes[-1]} would "
                      f"peak at {_mb(smallest)}, over the {_mb(budget)} budget; checkpointing brings "
                      f"micro-batch {b} to {_mb(peak)}, and {k} accumulation steps make the batch of "
                      f"{effective_batch}. {_step(5)}" + _skipped(skipped, budget))
            return Plan(b, k, True, peak, reason, budget)
    raise ValueError(_refusal(budget, effective_batch, sizes[-1], min_micro_batch, smallest, plain,
                              checkpointed) + _skipped(skipped, budget))


def _refusal(budget: float, effective_batch: int, b: int, min_micro_batch: int, smallest: float,
             plain: MemoryProfile, checkpointed: MemoryProfile | None) -> str:
    """Why nothing fits at micro-batch `b` (the smallest candidate), and what to do instead."""
    floor, k = plain.floor_bytes, effective_batch // b
    profiles = [plain] if checkpointed is None else [plain, checkpointed]
    optimizer_step = min(p.optimizer_peak(b) for p in profiles)
    if budget < floor:
        where, step = "the budget is below the floor itself", _step(2)
    else:
        with_ckpt = ("" if checkpointed is None else " without checkpointing, "
                     f"{checkpointed.predict_peak(b, accumulation_steps=k)} bytes with it")
        where = (f"the floor fits, but even micro-batch {b} does not (predicted {round(smallest)} bytes"
                 f"{with_ckpt})")
        if optimizer_step > budget:
            where += f", and the optimizer step alone peaks at {optimizer_step} bytes"
            step = _step(2)
        elif min_micro_batch > 1:
            step = (f"{_step(3)} A minimum below {min_micro_batch} may fit, at the cost of throughput; "
                    "otherwise shrink the model state.")
        else:
            step = "Even one example's activations do not fit beside the floor; shrink the model state."
    return (
        f"Nothing fits in a budget of {round(budget)} bytes for an effective batch of {effective_batch} "
        f"(micro-batch >= {min_micro_batch}): the floor (parameters + gradients + optimizer state) is "
        f"{floor} bytes, and {where}. Accumulation and checkpointing only shrink activations; they never "
        f"lower the floor. {step} Remedies for the model state: {'; '.join(REMEDIES)}."
    )


# -- The estimators people use, and the remedies for the floor -------------------------------------


@dataclass(frozen=True)
class Estimate:
    """One estimator's prediction beside the measured value it estimates."""

    name: str
    predicted_bytes: float
    measured_bytes: int
    leaves_out: str

    @property
    def error(self) -> float:
        """Relative error (predicted - measured) / measured; negative is an underestimate."""
        return (self.predicted_bytes - self.measured_bytes) / self.measured_bytes


def popular_estimates(cfg: GPTConfig, n_params: int, micro_batch: int, measured_peak: int, *,
                      checkpointed: bool, planner_bytes: int | None = None) -> list[Estimate]:
    """The estimates people use for the peak of a training step, beside `measured_peak`.

    Weights only (4 bytes/param, what model-loading calculators report), 16 bytes/param
    (fp32 Adam: weights, gradients, two moments), 18 bytes/param (the figure quoted for
    mixed-precision Adam), 16 bytes/param plus Korthikanti's activations (with full
    recomputation when `checkpointed`), and the planner's prediction when given.
    """
    n_params = positive_int("n_params", n_params)
    positive_int("measured_peak", measured_peak)
    korth = korthikanti_activation_bytes(cfg, micro_batch, recompute=checkpointed)
    kname = "full recompute, 2sbh per layer" if checkpointed else "sbh(34 + 5as/h) per layer"
    out = [
        Estimate("weights only (4 B/param)", 4 * n_params, measured_peak,
                 "gradients, optimizer state, activations, temporaries: counts model loading only"),
        Estimate("16 B/param (fp32 Adam)", 16 * n_params, measured_peak,
                 "activations, the logits, optimizer temporaries: model state only"),
        Estimate("18 B/param (mixed-precision Adam)", 18 * n_params, measured_peak,
                 "activations; counts 16-bit weights beside an fp32 master copy, fp32 gradients and "
                 "moments (2 + 4 + 4 + 8), not this fp32 model"),
        Estimate(f"16 B/param + Korthikanti ({kname})", 16 * n_params + korth, measured_peak,
                 "embeddings, final norm, logits and loss, the gradient of the logits, "
                 + ("one block's recomputed internals during backward, " if checkpointed else "")
                 + "optimizer temporaries"),
    ]
    if planner_bytes is not None:
        out.append(Estimate("planner (fitted to measurements)", planner_bytes, measured_peak,
                            "nothing it was fitted on; it must be refitted for a new model or device"))
    return out


@dataclass(frozen=True)
class RemedyFloor:
    """What one remedy for model state leaves of the floor, per worker, and what it does not say.

    `caveat` is empty, or the condition the row's number needs (print it beside the row).
    """

    remedy: str
    floor_bytes: float
    saving_bytes: float
    caveat: str = ""


MIXED_PRECISION = "mixed precision (bf16 + fp32 master, Adam state)"
PURE_BF16 = "pure bf16 (weights, gradients, Adam state)"
FSDP = "FSDP / ZeRO-3"
EIGHT_BIT = "8-bit Adam state (an estimate, never measured)"
# NOTE [mixed precision]: bf16 autocast (or bf16 weights with an fp32 master copy) keeps
# 2 + 2 + 4 + 8 = 16 B/param with Adam: the same floor as fp32 (ZeRO's 16 psi). Only pure bf16 is
# smaller (2 + 2 + 4 = 8 B/param), and plain bf16 updates round small steps to nothing.
CAVEATS = {
    MIXED_PRECISION: "bf16 weights and gradients beside fp32 master weights and Adam's fp32 moments, "
                     "2 + 2 + 4 + 8 = 16 B/param as in fp32: it shrinks activations, not the floor",
    PURE_BF16: "no fp32 master copy, 2 + 2 + 4 = 8 B/param, but bf16 weights lose small updates unless "
               "the optimizer uses stochastic rounding or Kahan summation",
    EIGHT_BIT: "an estimate, not a measurement: 1 byte per moment (2 B/param), plus the quantisation "
               "scales and the library's own temporaries, which no meta profile sees",
    FSDP: "1/W of the floor is the persistent state per worker; the per-rank peak also holds the "
          "all-gathered unit being computed; lesson 07 measures it",
}


def remedy_floors(parameters: int, gradients: int, optimizer_state: int,
                  workers: Sequence[int] = (2, 4), *, precision: str = "fp32") -> list[RemedyFloor]:
    """The floor under each remedy, computed from the measured floor of fp32 Adam.

    `parameters`, `gradients` and `optimizer_state` are measured fp32 bytes (4, 4 and 8 per
    parameter: Adam's state is two parameter-sized moments). Each row is the floor per worker,
    its saving against the measured floor, and its caveat (`CAVEATS`). Bytes per parameter:
    fp32 Adam 16, SGD with momentum 12, SGD 8, mixed precision 2 + 2 + 4 (fp32 master) + 8 = 16
    (no saving), pure bf16 8, bf16 Adam moments 12, offloaded optimizer state 8, ZeRO-1 over W
    workers 8 + 8/W, FSDP / ZeRO-3 16/W of persistent state. Sharding is measured for real in
    lesson 07.

    `precision` is the mode the bytes were measured in: "fp32" or "bf16" (autocast over fp32
    master weights: the same fp32 state, so the same rows; the mixed-precision row never drops
    the fp32 master copy), or "pure-bf16" (2 + 2 + 4 bytes measured: the precision rows go, and
    the first row is the measured pure-bf16 floor).
    """
    choice("precision", precision, ("fp32", "bf16", "pure-bf16"))
    p, g, s = (positive_int(n, v) for n, v in (("parameters", parameters), ("gradients", gradients),
                                             ("optimizer_state", optimizer_state)))
    floor = p + g + s
    first = {"fp32": "Adam, fp32 (measured)", "bf16": "Adam, bf16 mixed precision (measured)",
             "pure-bf16": "Adam, pure bf16 (measured)"}[precision]
    rows = [
        (first, floor, CAVEATS[PURE_BF16] if precision == "pure-bf16" else ""),
        ("SGD with momentum (one buffer)", p + g + s / 2, ""),
        ("SGD, no momentum (no state)", p + g, ""),
        (MIXED_PRECISION, p / 2 + g / 2 + p + s, CAVEATS[MIXED_PRECISION]),
        (PURE_BF16, p / 2 + g / 2 + s / 2, CAVEATS[PURE_BF16]),
        ("bf16 Adam state (fp32 weights and gradients)", p + g + s / 2, ""),
        (EIGHT_BIT, p + g + s / 4, CAVEATS[EIGHT_BIT]),
        ("optimizer state offloaded to CPU", p + g, ""),
    ]
    if precision == "pure-bf16":  # already 16-bit: no precision row applies
        rows = [r for r in rows if r[0] not in (MIXED_PRECISION, PURE_BF16,
                                                "bf16 Adam state (fp32 weights and gradients)",
                                                EIGHT_BIT)]
    for w in (positive_int("workers[i]", w) for w in workers):
        rows.append((f"optimizer state sharded over {w} workers (ZeRO-1)", p + g + s / w, ""))
        rows.append((f"persistent state sharded over {w} workers ({FSDP})", floor / w, CAVEATS[FSDP]))
    return [RemedyFloor(name, f, floor - f, caveat) for name, f, caveat in rows]
