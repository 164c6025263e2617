"""The memory planner: a fitted memory profile, and the rule that picks B, K, checkpointing (lesson 06).

The API that lesson 06 builds and checks, and that later lessons reuse (lesson 08's ledger,
lesson 09's meta-device profiles). The lesson's instruments (its model, the phase
measurements, the widget, the exercises) are in `helpers.lessons.lesson06`.

- `DECISION_RULE`, `RULE_REFINEMENTS`, `RULE_COROLLARY`, `decision_rule()`: which technique
  first, stated once. `recommend`'s reasons, lesson 08's follow-up answer and lessons 00, 06 and
  09 quote these strings (tests check the notebooks; lesson 09 quotes the steps and the
  corollary), so the rule cannot drift between them.
- `recommend` -> `Plan`: `DECISION_RULE` applied to a budget (steps 4 and 5: the largest
  micro-batch at or above `min_micro_batch` that fits without checkpointing, else with it,
  then accumulate), or a `ValueError` that names the floor, the rule's step that stopped it,
  and the remedies (`REMEDIES`) when nothing fits.

Re-exported here (this module's public names stay where they were):
- from `helpers.measure.memory_profile`: `fit_profile(measure, sizes)` -> `MemoryProfile`, the floor,
  other, activation bytes per example and the optimizer-phase peak fitted at a few micro-batch
  sizes; `MemoryProfile.predict_peak(b)` predicts the peak for any micro-batch.
- from `helpers.plan.estimates`: `popular_estimates` -> `Estimate`s (the rules of thumb people use
  beside a measurement) and `remedy_floors` -> `RemedyFloor`s (what each state remedy leaves of
  the floor, per worker, with its caveat in `CAVEATS`).
- from `helpers.measure.formulas`: `korthikanti_activation_bytes`, the activation formula those estimates use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from helpers.core.units import format_bytes
from helpers.core.validate import positive_int, positive_number
from helpers.measure.memory_profile import MemoryProfile

__all__ = [
    "DECISION_RULE", "GB", "REMEDIES", "RULE_COROLLARY", "RULE_REFINEMENTS", "NoPlanError", "Plan",
    "decision_rule", "recommend",
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
# 08, and lessons 06 and 09 restate it word for word (tests/plan/test_planner.py checks the notebooks).
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
# NOTE [two refinements]: the steps above are what `recommend` applies (plain or full checkpointing).
# Two cases the steps leave out, stated once here and restated word for word by lessons 00, 06 and
# 08: selective checkpointing, measured in lesson 02 §5 (the attention core) and lesson 10 §15
# (Transformers' `every_n_layers`); and sharded state, where accumulation costs communication too
# (lesson 07 shards the state). The planner itself plans neither.
RULE_REFINEMENTS: tuple[str, ...] = (
    "Between steps 4 and 5, before halving the micro-batch again or checkpointing every layer, try "
    "selective checkpointing: Korthikanti et al. recompute only the attention core, for about 70% fewer "
    "activations at about 3% more FLOPs (lesson 02 §5 measures its price per byte saved); Transformers' "
    "`every_n_layers` checkpoints every n-th layer (lesson 10 §15).",
    "Under sharded state (FSDP, ZeRO-3) accumulation is not free: every micro-step all-gathers the "
    "parameters again, forward and backward, so K micro-steps move about K times the parameter traffic "
    "of one; weigh that against checkpointing's recompute (lesson 07 shards the state).",
)
RULE_COROLLARY = (
    "So \"checkpoint when activations dominate\" is the case where shrinking the micro-batch until "
    "it fits would take it below the minimum that keeps the device busy."
)


def decision_rule() -> str:
    """`DECISION_RULE` numbered, `RULE_REFINEMENTS` as bullets, then `RULE_COROLLARY` (also Markdown)."""
    steps = "\n".join(f"{i}. {step}" for i, step in enumerate(DECISION_RULE, 1))
    refinements = "\n".join(f"- {note}" for note in RULE_REFINEMENTS)
    return f"{steps}\n\n{refinements}\n\n{RULE_COROLLARY}"


def _step(n: int) -> str:
    return f"Rule step {n}: {DECISION_RULE[n - 1]}"


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
        """E.g. '4 x 8, checkpointed (predicted peak 12.3 MiB)'."""
        ck = ", checkpointed" if self.checkpoint else ""
        peak = _mb(self.predicted_peak_bytes)
        return f"{self.micro_batch} x {self.accumulation_steps}{ck} (predicted peak {peak})"


_mb = format_bytes  # one convention for every size the planner prints: KiB, MiB, GiB, one decimal


class NoPlanError(ValueError):
    """`recommend`'s refusal: nothing fits. The message says why, in KiB/MiB/GiB.

    Attributes:
        budget_bytes: the budget that nothing fits, in bytes.
        floor_bytes: the plain profile's floor (parameters + gradients + optimizer state), in bytes.
    """

    def __init__(self, message: str, budget_bytes: float, floor_bytes: int) -> None:
        super().__init__(message)
        self.budget_bytes = budget_bytes
        self.floor_bytes = floor_bytes


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


def _unmeasured(profile: MemoryProfile, b: int, verify: Verify | None) -> str:
    """A note when micro-batch `b` is below the smallest size `profile` measured and nothing checked it.

    Below its smallest measured size a fitted line is extended downwards, where the peak can sit at
    another point of the update (it is the largest of several lines, each a different moment), so
    the prediction may be low.
    """
    sizes = profile.micro_batches
    if verify is not None or not sizes or b >= min(sizes):
        return ""
    return (f" Micro-batch {b} is below the smallest size the profile measured ({min(sizes)}): its peak is "
            "extended from larger sizes, not measured; measure it (or pass verify=) before relying on it.")


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
    smaller micro-batch fits. Without `verify`, a plan whose micro-batch is below the smallest size
    the profile measured (`MemoryProfile.micro_batches`) says so in its reason: that peak is
    extended from larger sizes, not measured. Raises `ValueError`
    for a budget or effective batch that is not positive, for a `min_micro_batch` above the
    effective batch, and `NoPlanError` (a `ValueError`) when nothing fits: its message names the
    budget and the floor in KiB/MiB/GiB (its `budget_bytes` and `floor_bytes` keep the bytes), says whether
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
                  + _skipped(skipped, budget) + _unmeasured(plain, b, verify))
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
                      f"{effective_batch}. {_step(5)}" + _skipped(skipped, budget)
                      + _unmeasured(checkpointed, b, verify))
            return Plan(b, k, True, peak, reason, budget)
    raise NoPlanError(_refusal(budget, effective_batch, sizes[-1], min_micro_batch, smallest, plain,
                               checkpointed) + _skipped(skipped, budget), budget, plain.floor_bytes)


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
                     f"{_mb(checkpointed.predict_peak(b, accumulation_steps=k))} with it")
        where = (f"the floor fits, but even micro-batch {b} does not (predicted {_mb(smallest)}"
                 f"{with_ckpt})")
        if optimizer_step > budget:
            where += f", and the optimizer step alone peaks at {_mb(optimizer_step)}"
            step = _step(2)
        elif min_micro_batch > 1:
            step = (f"{_step(3)} A minimum below {min_micro_batch} may fit, at the cost of throughput; "
                    "otherwise shrink the model state.")
        else:
            step = "Even one example's activations do not fit beside the floor; shrink the model state."
    return (
        f"Nothing fits in a budget of {_mb(budget)} for an effective batch of {effective_batch} "
        f"(micro-batch >= {min_micro_batch}): the floor (parameters + gradients + optimizer state) is "
        f"{_mb(floor)}, and {where}. Accumulation and checkpointing only shrink activations; they never "
        f"lower the floor. {step} Remedies for the model state: {'; '.join(REMEDIES)}."
    )
