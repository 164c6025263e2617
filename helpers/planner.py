"""Combine and choose (lesson 06): a memory planner whose every prediction is checked.

The lesson's instruments, in the order the notebook uses them:

- `lesson_config` / `lesson_model`: the GPT this lesson measures at each scale.
- `measure_phases`: one accumulation update, measured with both phase peaks: the
  end of the forward pass (activations alive) and the optimizer step (Adam's
  temporaries on top of the state and gradients). `PhaseMemory` is the result.
  `UpdateMeasurer` builds token batches and calls it for a micro-batch size.
- `fit_profile` -> `MemoryProfile`: the floor, other, activation bytes per example
  and the optimizer-phase peak, fitted at a few micro-batch sizes;
  `MemoryProfile.predict_peak(b)` predicts the peak for any micro-batch.
- `recommend` -> `Plan`: the explainer's decision procedure as a rule (largest micro-batch
  that fits without checkpointing, else with it, then accumulate), or a `ValueError` that
  names the floor and the remedies when nothing fits.
- `popular_estimates`: the rules of thumb people use (weights only, 16 and 18 bytes per
  parameter, Korthikanti's activation formula with and without recomputation) beside a
  measurement. `remedy_floors`: what each state remedy leaves of the measured floor.
- `run_capped`: run a callable under a CUDA per-process memory cap; an OOM is caught.
- `PlannerLab`: the pure function behind the lesson's widget.
- `draw_decision_diagram`: the decision procedure as a small figure.
- `predicted_peak_bytes`, `widget_latency_cases`: the per-lesson protocol;
  `check_exercise_1` ... `check_exercise_3`: the exercise checkers.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from helpers.budget import linear_fit
from helpers.checkpointing import korthikanti_terms
from helpers.checks import callable_arg, choice, positive_int, positive_number
from helpers.data import token_batch
from helpers.device import SCALES, by_scale
from helpers.memory import MemoryTracker, run_or_oom
from helpers.models import GPT, GPTConfig

__all__ = [
    "EXPLAINER_GB",
    "GB",
    "OPTIMIZERS",
    "REMEDIES",
    "Estimate",
    "MemoryProfile",
    "PhaseMemory",
    "Plan",
    "PlannerLab",
    "RemedyFloor",
    "UpdateMeasurer",
    "accumulate_update",
    "check_exercise_1",
    "check_exercise_2",
    "check_exercise_3",
    "checkpoint_every_block",
    "draw_decision_diagram",
    "explainer_profiles",
    "fit_profile",
    "korthikanti_activation_bytes",
    "lesson_config",
    "lesson_model",
    "measure_phases",
    "popular_estimates",
    "predicted_peak_bytes",
    "recommend",
    "remedy_floors",
    "run_capped",
    "widget_latency_cases",
]

GB = 1e9  # the explainer speaks in decimal gigabytes
OPTIMIZERS = ("sgd", "sgd-momentum", "adam")
REMEDIES = (
    "shard the model state across workers (FSDP / ZeRO-3, lesson 07)",
    "shard the optimizer state (ZeRO-1)",
    "keep the state in lower precision (bf16 weights, 8-bit optimizer state)",
    "offload the optimizer state (or the parameters) to CPU memory",
)
# The explainer's 24 GB example, in decimal GB (floor = weights + gradients + optimizer state).
EXPLAINER_GB = {"capacity": 24.0, "floor": 14.5, "other": 2.0, "act_8": 7.0, "act_4": 3.8, "ckpt_4": 2.0}

# ---------------------------------------------------------------------------
# The model of this lesson
# ---------------------------------------------------------------------------


def lesson_config(scale: str) -> GPTConfig:
    """The GPT measured in lesson 06 at `scale`.

    Its vocabulary is large next to its width, as in real language models, so the
    embedding and the LM head are the largest parameters. That makes the optimizer
    step's temporaries visible beside the activations of a small micro-batch.
    """
    choice("scale", scale, SCALES)
    v, s, d, a, n = by_scale(
        scale,
        tiny=(1024, 16, 32, 2, 2),
        small=(4096, 32, 128, 4, 4),
        medium=(16384, 256, 768, 12, 6),
        full=(16384, 512, 1024, 16, 8),
    )
    return GPTConfig(vocab_size=v, seq_len=s, d_model=d, n_heads=a, n_layers=n, dropout=0.0)


def lesson_model(scale: str, device: torch.device | str, seed: int = 0) -> GPT:
    """A freshly initialised `lesson_config(scale)` GPT on `device`, in train mode.

    It is built under `torch.random.fork_rng`, so the global RNG is left as it was.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT(lesson_config(scale))
    return model.to(device).train()


def checkpoint_every_block(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A `model.block_wrapper` that checkpoints each block (non-reentrant)."""
    return checkpoint(block, x, use_reentrant=False)


def accumulate_update(
    model: nn.Module, optimizer: torch.optim.Optimizer, batches: Sequence[tuple[torch.Tensor, torch.Tensor]]
) -> None:
    """One optimizer update from `len(batches)` micro-batches: the loop the notebook teaches."""
    optimizer.zero_grad(set_to_none=True)
    for idx, targets in batches:
        logits = model(idx)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        (loss / len(batches)).backward()
    optimizer.step()


def _make_optimizer(name: str, model: nn.Module) -> torch.optim.Optimizer:
    choice("optimizer", name, OPTIMIZERS)
    if name == "adam":
        return torch.optim.Adam(model.parameters(), lr=1e-3)
    return torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9 if name == "sgd-momentum" else 0.0)


# ---------------------------------------------------------------------------
# Measuring both phases of an update
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PhaseMemory:
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

    @property
    def floor_bytes(self) -> int:
        """Parameters + gradients + optimizer state at the peak."""
        b = self.breakdown
        return b["parameters"] + b["gradients"] + b["optimizer_state"]

    @property
    def binding_phase(self) -> str:
        """'forward' when the forward/backward phase sets the peak, else 'optimizer'."""
        return "forward" if self.forward_peak_bytes >= self.optimizer_peak_bytes else "optimizer"


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
    device = str(next(model.parameters()).device)
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
            self.optimizer = _make_optimizer(optimizer, model)
        self._warm = bool(self.optimizer.state)

    def batches(self, micro_batch: int, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """`steps` token micro-batches of `micro_batch` sequences on the model's device."""
        cfg, device = self.model.cfg, next(self.model.parameters()).device
        return [token_batch(micro_batch, cfg.seq_len, cfg.vocab_size, seed=self.seed + i, device=device)
                for i in range(steps)]

    def update_for(self, micro_batch: int, steps: int | None = None) -> Callable[[], None]:
        """A zero-argument update (with this measurer's checkpointing) for `micro_batch` x `steps`."""
        positive_int("micro_batch", micro_batch)
        batches = self.batches(micro_batch, positive_int("steps", steps or self.steps))
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


# ---------------------------------------------------------------------------
# The profile
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryProfile:
    """A training job's memory as a function of the micro-batch size `b`.

    - `floor_bytes`: parameters + gradients + optimizer state (no technique here lowers it);
    - `gradient_bytes`: the gradients inside that floor;
    - `other_bytes` + `other_bytes_per_example * b`: the rest at the forward phase's
      peak (buffers, the gradient of the logits, temporaries, allocator slack);
    - `activation_intercept_bytes` + `activation_bytes_per_example * b`: the activations
      alive at the forward phase's peak;
    - `optimizer_peak_bytes` + `optimizer_bytes_per_example * b`: the optimizer step's
      peak: the floor and the step's temporaries, plus whatever the training loop still
      holds of its last micro-batch (a `logits` or `loss` variable keeps its tensors alive).
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

    def activations(self, b: int) -> float:
        """Predicted activation bytes alive at the forward phase's peak."""
        return self.activation_intercept_bytes + self.activation_bytes_per_example * positive_int("b", b)

    def forward_peak(self, b: int, *, accumulation_steps: int = 2) -> int:
        """Predicted peak of the forward/backward phase at micro-batch `b`.

        With `accumulation_steps >= 2` the gradients of earlier micro-steps are alive
        during the forward pass. With 1 they do not exist yet when the activations
        peak, so the peak is lower by the gradients (and at least the floor, reached
        when backward has made every gradient and freed every activation).
        """
        k = positive_int("accumulation_steps", accumulation_steps)
        peak = (self.floor_bytes + self.other_bytes + self.other_bytes_per_example * b
                + self.activations(b))
        if k == 1:
            peak = max(peak - self.gradient_bytes, self.floor_bytes)
        return round(peak)

    def optimizer_peak(self, b: int) -> int:
        """Predicted peak of the optimizer step at micro-batch `b`."""
        return round(self.optimizer_peak_bytes + self.optimizer_bytes_per_example * positive_int("b", b))

    def predict_peak(self, b: int, *, accumulation_steps: int = 2) -> int:
        """Predicted peak bytes of an update at micro-batch `b`: the larger of the two phases.

        `accumulation_steps` only matters when it is 1 (see `forward_peak`).
        """
        return max(self.forward_peak(b, accumulation_steps=accumulation_steps), self.optimizer_peak(b))

    def binding_phase(self, b: int, *, accumulation_steps: int = 2) -> str:
        """'forward' or 'optimizer': the phase whose peak the prediction says is higher."""
        fwd = self.forward_peak(b, accumulation_steps=accumulation_steps)
        return "forward" if fwd >= self.optimizer_peak(b) else "optimizer"

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


def fit_profile(measure: Callable[[int], object], micro_batches: Sequence[int] = (1, 2, 4),
                *, label: str = "") -> MemoryProfile:
    """Measure at each micro-batch size and fit a `MemoryProfile`.

    `measure(b)` runs one training update at micro-batch `b` and returns a
    `StepMemory` (from `helpers.memory.measure_step`) or a `PhaseMemory` (from
    `measure_phases`, which has both phase peaks). With a `PhaseMemory` the forward
    phase is fitted at every size and the optimizer phase is read directly. With a
    plain `StepMemory` only the overall peak is known: a measurement whose peak holds
    (almost) no activations is taken as an optimizer-step peak, the others as
    forward peaks, and at least two sizes must peak in the forward phase.
    Activations, other and the optimizer-phase peak are fitted as straight lines in `b`
    (least squares). The forward line uses the sizes where the forward phase binds
    (when there are at least two): where the optimizer step binds, the forward peak can
    sit at another point of the pass and follow another line.
    """
    callable_arg("measure", measure, "a callable measure(b) -> StepMemory")
    sizes = [positive_int("micro_batches[i]", b) for b in micro_batches]
    if len(set(sizes)) < 2:
        raise ValueError(f"micro_batches needs at least two distinct sizes, got {list(micro_batches)}")
    results = {b: measure(b) for b in sorted(set(sizes))}
    for b, m in results.items():
        if not hasattr(m, "breakdown") or not hasattr(m, "peak_bytes"):
            raise TypeError(f"measure({b}) must return a StepMemory or PhaseMemory, got {type(m).__name__}")
    floors = [m.floor_bytes for m in results.values()]
    if max(floors) - min(floors) > 0.01 * max(floors) and all(hasattr(m, "forward_breakdown")
                                                            for m in results.values()):
        raise ValueError(f"the floor changed across micro-batches ({floors}); measure(b) must use the "
                         "same model and optimizer every time")
    forward: dict[int, dict[str, int]] = {}
    binds: dict[int, bool] = {}
    optimizer: dict[int, int] = {}
    for b, m in results.items():
        if hasattr(m, "forward_breakdown"):
            forward[b] = m.forward_breakdown
            optimizer[b] = m.optimizer_peak_bytes
            binds[b] = m.forward_peak_bytes >= m.optimizer_peak_bytes
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
    acts = linear_fit(xs, [forward[b]["activations"] for b in xs])
    other = linear_fit(xs, [forward[b]["other"] for b in xs])
    if len(optimizer) >= 2:
        opt = linear_fit(sorted(optimizer), [optimizer[b] for b in sorted(optimizer)])
        opt_base, opt_rate = opt.intercept, opt.slope
    else:
        opt_base, opt_rate = float(max(optimizer.values(), default=0)), 0.0
    grads = [forward[b]["gradients"] for b in xs]
    floor = max(b["parameters"] + b["gradients"] + b["optimizer_state"] for b in forward.values())
    method = next(iter(results.values())).method
    return MemoryProfile(
        floor_bytes=floor, gradient_bytes=max(grads), other_bytes=other.intercept,
        other_bytes_per_example=other.slope, activation_bytes_per_example=acts.slope,
        activation_intercept_bytes=acts.intercept,
        optimizer_peak_bytes=opt_base, optimizer_bytes_per_example=opt_rate, method=method,
        micro_batches=tuple(sorted(results)), label=label,
    )


# ---------------------------------------------------------------------------
# The planner
# ---------------------------------------------------------------------------


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


def _fits(profile: MemoryProfile, sizes: Sequence[int], effective_batch: int,
          budget: float) -> tuple[int, int] | None:
    for b in sizes:
        peak = profile.predict_peak(b, accumulation_steps=effective_batch // b)
        if peak <= budget:
            return b, peak
    return None


def recommend(budget_bytes: float, effective_batch: int, plain: MemoryProfile,
              checkpointed: MemoryProfile | None = None, *, min_micro_batch: int = 1) -> Plan:
    """Choose micro-batch, accumulation steps and checkpointing for a memory budget.

    The rule follows the explainer's order:

    1. take the largest micro-batch `b` that is at least `min_micro_batch`, divides
       `effective_batch`, and fits `budget_bytes` without checkpointing
       (`plain.predict_peak(b) <= budget_bytes`);
    2. only if none fits, the same with checkpointing (`checkpointed`, when given);
    3. `accumulation_steps = effective_batch // micro_batch`.

    `min_micro_batch` is the smallest micro-batch that still keeps the device busy
    enough for you. Raises `ValueError` for a budget or effective batch that is not
    positive, for a `min_micro_batch` above the effective batch, and when nothing fits:
    that message names the floor in bytes and the remedies for model state.
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
    found = _fits(plain, sizes, effective_batch, budget)
    if found:
        b, peak = found
        k = effective_batch // b
        why = ("the whole effective batch fits in one pass, so there is nothing to accumulate"
               if k == 1 else f"it is the largest micro-batch dividing {effective_batch} that fits without "
               f"checkpointing, so accumulate {k} micro-steps and spend no recompute")
        reason = f"Micro-batch {b}: {why} (predicted peak {_mb(peak)} of {_mb(budget)})."
        return Plan(b, k, False, peak, reason, budget)
    smallest = plain.predict_peak(sizes[-1], accumulation_steps=effective_batch // sizes[-1])
    if checkpointed is not None:
        found = _fits(checkpointed, sizes, effective_batch, budget)
        if found:
            b, peak = found
            k = effective_batch // b
            reason = (f"Micro-batch {b} with checkpointing: without it even micro-batch {sizes[-1]} would "
                      f"peak at {_mb(smallest)}, over the {_mb(budget)} budget; checkpointing brings "
                      f"micro-batch {b} to {_mb(peak)}, and {k} accumulation steps make the batch of "
                      f"{effective_batch}.")
            return Plan(b, k, True, peak, reason, budget)
    floor = plain.floor_bytes
    where = ("the budget is below the floor itself" if budget < floor else
             f"the floor fits, but even micro-batch {sizes[-1]} does not (predicted {round(smallest)} bytes"
             + ("" if checkpointed is None else " without checkpointing, "
                f"{checkpointed.predict_peak(sizes[-1], accumulation_steps=effective_batch // sizes[-1])} "
                "bytes with it") + ")")
    raise ValueError(
        f"Nothing fits in a budget of {round(budget)} bytes for an effective batch of {effective_batch} "
        f"(micro-batch >= {min_micro_batch}): the floor (parameters + gradients + optimizer state) is "
        f"{floor} bytes, and {where}. Accumulation and checkpointing only shrink activations; they never "
        f"lower the floor. Remedies for the model state: {'; '.join(REMEDIES)}."
    )


# ---------------------------------------------------------------------------
# The estimators people use, and the remedies for the floor
# ---------------------------------------------------------------------------


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


def korthikanti_activation_bytes(cfg: GPTConfig, micro_batch: int, *, recompute: bool,
                                 act_bytes: int = 4) -> float:
    """Korthikanti et al.'s activation bytes for `cfg.n_layers` layers at `micro_batch`.

    Without recomputation: sbh(34 + 5as/h) per layer in 16-bit, here with
    `act_bytes` per element and without the dropout terms (this model has no dropout).
    With full recomputation: the 2sbh (16-bit) layer input per layer. Either way the
    formula covers the transformer layers only.
    """
    s, h, a, n = cfg.seq_len, cfg.d_model, cfg.n_heads, cfg.n_layers
    b = positive_int("micro_batch", micro_batch)
    if recompute:
        return n * s * b * h * act_bytes
    terms = korthikanti_terms(s=s, b=b, h=h, a=a, act_bytes=act_bytes, dropout=cfg.dropout > 0)
    return n * sum(terms.values())


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
                 "activations; assumes 16-bit weights + fp32 master copy, not this fp32 model"),
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
    """What one remedy for model state leaves of the floor, per worker."""

    remedy: str
    floor_bytes: float
    saving_bytes: float


def remedy_floors(parameters: int, gradients: int, optimizer_state: int,
                  workers: Sequence[int] = (2, 4)) -> list[RemedyFloor]:
    """The floor under each remedy, computed from the measured floor of fp32 Adam.

    `parameters`, `gradients` and `optimizer_state` are measured bytes (Adam's state is
    two parameter-sized moments). Each row is the floor per worker and its saving
    against the measured floor. Sharding is measured for real in lesson 07.
    """
    p, g, s = (positive_int(n, v) for n, v in (("parameters", parameters), ("gradients", gradients),
                                             ("optimizer_state", optimizer_state)))
    floor = p + g + s
    rows = [
        ("Adam, fp32 (measured)", floor),
        ("SGD with momentum (one buffer)", p + g + s / 2),
        ("SGD, no momentum (no state)", p + g),
        ("bf16 parameters and gradients, fp32 Adam state", p / 2 + g / 2 + s),
        ("bf16 Adam state", p + g + s / 2),
        ("optimizer state offloaded to CPU", p + g),
    ]
    for w in (positive_int("workers[i]", w) for w in workers):
        rows.append((f"optimizer state sharded over {w} workers (ZeRO-1)", p + g + s / w))
        rows.append((f"everything sharded over {w} workers (FSDP / ZeRO-3)", floor / w))
    return [RemedyFloor(name, f, floor - f) for name, f in rows]


# ---------------------------------------------------------------------------
# A real OOM under a cap (CUDA)
# ---------------------------------------------------------------------------


def run_capped(fn: Callable[[], object], budget_bytes: float, device: torch.device, *,
               counted_bytes: int = 0) -> object | None:
    """Run `fn()` with this process's CUDA memory capped at `budget_bytes`; None if it ran out.

    `counted_bytes` is memory already allocated that the budget includes (the
    parameters and optimizer state, which a measured peak counts too). The cap, set with
    `torch.cuda.set_per_process_memory_fraction`, is what the allocator holds now plus
    `budget_bytes - counted_bytes`, so an allocation past it raises
    `torch.cuda.OutOfMemoryError`. That is caught by `helpers.memory.run_or_oom`, memory is
    freed and None is returned. The previous cap (`LESSONS_GPU_MEMORY_GB`, or none) is put
    back afterwards. CUDA only: on CPU, draw the budget as a labelled line instead.
    """
    from helpers.device import apply_memory_cap

    if not isinstance(device, torch.device) or device.type != "cuda":
        raise ValueError(f"run_capped needs a CUDA device, got {device!r}; on CPU draw a budget line instead")
    budget = positive_number("budget_bytes", budget_bytes)
    if not 0 <= counted_bytes < budget:
        raise ValueError(f"counted_bytes must be in [0, budget_bytes={budget:.0f}), got {counted_bytes!r}")
    gc.collect()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = min(1.0, (torch.cuda.memory_reserved(device) + budget - counted_bytes) / total)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    try:
        return run_or_oom(fn)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
        apply_memory_cap(device)  # put back the LESSONS_GPU_MEMORY_GB cap, if one is set
        gc.collect()
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------
# The widget
# ---------------------------------------------------------------------------


@dataclass
class PlannerLab:
    """The state behind the widget: the model, one measurer per mode, and the fitted profiles.

    `show(budget_bytes, micro_batch, accumulation_steps, checkpointed)` is what one
    slider move runs. It measures that configuration (an update of min(K, 2)
    micro-steps: the peak is the same for any K >= 2), predicts it, asks the planner for
    the effective batch B x K, prints the answer and draws the bar.
    """

    model: GPT
    plain: MemoryProfile
    checkpointed: MemoryProfile
    measurers: dict[bool, UpdateMeasurer] = field(default_factory=dict)

    @classmethod
    def build(cls, scale: str, device: torch.device | str,
              micro_batches: Sequence[int] = (2, 4, 8)) -> PlannerLab:
        """Build the lesson model at `scale` and fit both profiles (a few measured updates)."""
        model = lesson_model(scale, device)
        optimizer = _make_optimizer("adam", model)
        measurers = {ck: UpdateMeasurer(model, checkpointed=ck, optimizer=optimizer) for ck in (False, True)}
        plain = fit_profile(measurers[False], micro_batches, label="plain")
        ckpt = fit_profile(measurers[True], micro_batches, label="checkpointed")
        return cls(model, plain, ckpt, measurers)

    def answer(self, budget_bytes: float, micro_batch: int, accumulation_steps: int,
               checkpointed: bool) -> tuple[PhaseMemory, int, Plan | str]:
        """(measured, predicted peak, the planner's plan or its refusal) for one setting."""
        k = positive_int("accumulation_steps", accumulation_steps)
        measured = self.measurers[bool(checkpointed)](positive_int("micro_batch", micro_batch), min(k, 2))
        profile = self.checkpointed if checkpointed else self.plain
        predicted = profile.predict_peak(micro_batch, accumulation_steps=k)
        try:
            plan: Plan | str = recommend(budget_bytes, micro_batch * k, self.plain, self.checkpointed)
        except ValueError as err:
            plan = str(err)
        return measured, predicted, plan

    def show(self, budget_bytes: float, micro_batch: int, accumulation_steps: int,
             checkpointed: bool) -> None:
        """One slider move: measure, predict, recommend, print and draw."""
        from helpers import plots

        measured, predicted, plan = self.answer(budget_bytes, micro_batch, accumulation_steps, checkpointed)
        k = accumulation_steps
        fits = measured.peak_bytes <= budget_bytes
        print(f"effective batch B x K = {micro_batch} x {k} = {micro_batch * k}"
              f"{', checkpointed' if checkpointed else ''}")
        fmt = plots.format_bytes
        print(f"peak: predicted {fmt(predicted)}, measured {fmt(measured.peak_bytes)}"
              f" ({100 * (predicted / measured.peak_bytes - 1):+.1f}%, {measured.method}, "
              f"set by the {measured.binding_phase} phase) -> "
              + ("fits the budget" if fits else "does NOT fit the budget"))
        if isinstance(plan, Plan):
            print(f"planner for an effective batch of {plan.effective_batch}: {plan.describe()}")
            print(f"  {plan.reason}")
        else:
            print(f"planner: {plan}")
        fig, (ax,) = plots.figure(width=6.5, height=3.0)
        plots.stacked_bars(ax, {"measured": measured.breakdown}, budget=budget_bytes,
                           budget_label="budget" + (" (a stand-in, not a measured capacity)"
                                                    if measured.method == "cpu-tracker" else ""),
                           title=f"{micro_batch} x {k}{' checkpointed' if checkpointed else ''}: "
                                 + ("fits" if fits else "over budget"))
        unit, size = plots.byte_unit(max(measured.peak_bytes, budget_bytes))
        ax.plot([0], [predicted / size], marker="_", markersize=40, mew=2.5, color="black",
                label="predicted peak")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        plots.show(fig)

    def budget_options(self, max_micro_batch: int, n: int = 12) -> list[tuple[str, int]]:
        """Budget choices for a slider: from below the floor to above the largest plain peak."""
        from helpers.plots import format_bytes

        low = 0.9 * self.plain.floor_bytes
        high = 1.1 * self.plain.predict_peak(max_micro_batch, accumulation_steps=2)
        values = [round(low + (high - low) * i / (n - 1)) for i in range(n)]
        return [(format_bytes(v), v) for v in values]


# ---------------------------------------------------------------------------
# The decision diagram
# ---------------------------------------------------------------------------


def draw_decision_diagram(path: str | None = None) -> object:
    """Draw the decision procedure as a flowchart; save it to `path` (PNG) when given.

    Returns the matplotlib figure (show it with `helpers.plots.show`).
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    fig, ax = plt.subplots(figsize=(10.0, 5.4))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 6.1)
    ax.axis("off")

    def box(x0: float, x1: float, y: float, h: float, text: str, color: str) -> None:
        ax.add_patch(FancyBboxPatch((x0, y - h / 2), x1 - x0, h, boxstyle="round,pad=0.04",
                                    fc=color, ec="#555", lw=1.0))
        ax.text((x0 + x1) / 2, y, text, ha="center", va="center", fontsize=8.5)

    def arrow(a: tuple[float, float], b: tuple[float, float], label: str = "") -> None:
        ax.annotate("", xy=b, xytext=a, arrowprops=dict(arrowstyle="->", color="#333", lw=1.2))
        if label:
            ax.text((a[0] + b[0]) / 2, (a[1] + b[1]) / 2 + 0.1, label, fontsize=8, color="#333", ha="center")

    ask, ok, stop = "#fff3d6", "#e3f2e1", "#f7e1e1"
    box(2.6, 7.2, 5.5, 0.7, "Profile one update: floor (weights + gradients + optimizer state),\n"
                            "activations per example, the optimizer step's peak", "#e8eef7")
    box(2.6, 7.2, 4.3, 0.7, "Does the floor (and the optimizer step)\nfit the budget?", ask)
    box(2.6, 7.2, 3.0, 0.8, "Largest micro-batch B (dividing the effective\nbatch, B >= your minimum) "
                            "that fits\nWITHOUT checkpointing?", ask)
    box(2.6, 7.2, 1.7, 0.7, "Largest such B that fits\nWITH checkpointing?", ask)
    box(7.8, 9.9, 3.0, 0.8, "Use B, no checkpointing;\naccumulate K = E / B", ok)
    box(7.8, 9.9, 1.7, 0.7, "Checkpoint, use B;\naccumulate K = E / B", ok)
    box(0.1, 2.0, 3.0, 2.4, "Model state dominates:\nshard it across\nworkers (lesson 07),\n"
                            "shard the optimizer\nstate, lower its\nprecision, or\noffload it", stop)
    arrow((4.9, 5.15), (4.9, 4.65))
    arrow((4.9, 3.95), (4.9, 3.4), "yes")
    arrow((4.9, 2.6), (4.9, 2.05), "no")
    arrow((7.2, 3.0), (7.8, 3.0), "yes")
    arrow((7.2, 1.7), (7.8, 1.7), "yes")
    arrow((2.6, 4.3), (1.3, 4.2), "no")
    arrow((2.6, 1.7), (2.0, 2.0), "no")
    ax.text(5.0, 0.6, "Checkpointing trades recompute for activation memory; accumulation trades "
                      "micro-steps for a larger effective batch.\nNeither lowers the floor.",
            ha="center", va="center", fontsize=8.5, style="italic", color="#333")
    ax.set_title("Lesson 06: choosing micro-batch, accumulation and checkpointing for a budget")
    if path is not None:
        fig.savefig(path, dpi=110, bbox_inches="tight")
    return fig


# ---------------------------------------------------------------------------
# Protocol: predicted peak and widget latency cases
# ---------------------------------------------------------------------------

LARGEST_RUN = (32, 1)  # (micro-batch, steps): the naive whole-batch update, the lesson's largest run


def predicted_peak_bytes(scale: str) -> int:
    """Predicted peak of lesson 06's largest run at `scale`: 32 examples in one pass, plain.

    Floor = 16 bytes per parameter (fp32 Adam, checked in the lesson), plus, per
    example, Korthikanti's fp32 activations for the layers and three logit-sized
    tensors (logits, log-softmax, their gradient), with a 1.5x margin for what the
    formula leaves out (the lesson shows its error), plus one parameter copy for the
    optimizer step's temporaries.
    """
    cfg = lesson_config(scale)
    v, s, h, n = cfg.vocab_size, cfg.seq_len, cfg.d_model, cfg.n_layers
    n_params = v * h + s * h + n * (12 * h * h + 13 * h) + 2 * h + h * v
    b = LARGEST_RUN[0]
    per_example = korthikanti_activation_bytes(cfg, 1, recompute=False) + 3 * s * v * 4 + 2 * s * h * 4
    return int(20 * n_params + 1.5 * b * per_example)


def widget_latency_cases(scale: str, device: torch.device) -> dict[str, Callable[[], object]]:
    """One zero-argument callable per control value of the lesson's widget (one slider move each)."""
    lab = PlannerLab.build(scale, device)
    options = lab.budget_options(16)
    mid = options[len(options) // 2][1]
    base = {"budget_bytes": mid, "micro_batch": 4, "accumulation_steps": 8, "checkpointed": False}
    moves: Mapping[str, dict[str, object]] = {
        "budget below floor": {"budget_bytes": options[0][1]},
        "budget high": {"budget_bytes": options[-1][1]},
        "B=1": {"micro_batch": 1},
        "B=16": {"micro_batch": 16},
        "K=1": {"accumulation_steps": 1},
        "K=8": {"accumulation_steps": 8},
        "checkpoint on": {"checkpointed": True},
        "checkpoint on, B=16": {"checkpointed": True, "micro_batch": 16},
    }
    return {name: (lambda kw={**base, **change}: lab.show(**kw)) for name, change in moves.items()}


# ---------------------------------------------------------------------------
# Exercises
# ---------------------------------------------------------------------------


def explainer_profiles() -> tuple[MemoryProfile, MemoryProfile]:
    """(plain, checkpointed) profiles built from the explainer's 24 GB example, in bytes.

    Activations 7.0 GB at 8 and 3.8 GB at 4 give 0.8 GB per example plus 0.6 GB;
    checkpointed, 2.0 GB at 4 is taken as 0.5 GB per example. The explainer gives no
    optimizer-step peak, so it is set to the floor.
    """
    e = EXPLAINER_GB
    slope = (e["act_8"] - e["act_4"]) / 4 * GB
    common = dict(floor_bytes=int(e["floor"] * GB), gradient_bytes=0, other_bytes=e["other"] * GB,
                  other_bytes_per_example=0.0, optimizer_peak_bytes=e["floor"] * GB,
                  optimizer_bytes_per_example=0.0, method="explainer")
    plain = MemoryProfile(activation_bytes_per_example=slope,
                          activation_intercept_bytes=e["act_4"] * GB - 4 * slope, label="plain", **common)
    ckpt = MemoryProfile(activation_bytes_per_example=e["ckpt_4"] / 4 * GB, activation_intercept_bytes=0.0,
                         label="checkpointed", **common)
    return plain, ckpt


def check_exercise_1(micro_batch: int, accumulation_steps: int, checkpointed: bool) -> str:
    """Exercise 1: the explainer's job on a 20 GB budget, effective batch 32, micro-batch >= 4."""
    plan = recommend(20 * GB, 32, *explainer_profiles(), min_micro_batch=4)
    answer = (micro_batch, accumulation_steps, checkpointed)
    if answer == (plan.micro_batch, plan.accumulation_steps, plan.checkpoint):
        msg = f"Correct: {plan.describe()}. {plan.reason}"
    elif answer[:2] == (plan.micro_batch, plan.accumulation_steps):
        msg = "Close: the sizes are right, but check whether micro-batch 4 fits 20 GB without checkpointing."
    else:
        msg = ("Not yet. Try the rule in order: plain micro-batches 32, 16, 8, 4 (peak = 14.5 + 2.0 + "
               "activations GB), then the same with checkpointing; K = 32 / B.")
    print(msg)
    return msg


def check_exercise_2(floor_gb: float) -> str:
    """Exercise 2: the explainer's floor (14.5 GB with fp32 Adam) with SGD + momentum instead."""
    expected = EXPLAINER_GB["floor"] * 12 / 16
    if isinstance(floor_gb, bool) or not isinstance(floor_gb, int | float):
        msg = f"Give a number of GB, got {type(floor_gb).__name__}."
    elif abs(floor_gb - expected) <= 0.05:
        msg = (f"Correct: {expected:.3f} GB. Adam holds 16 bytes per parameter (4 weight, 4 gradient, "
               "8 state); SGD with momentum holds 12 (one 4-byte buffer).")
    else:
        msg = ("Not yet. Count bytes per parameter: weights 4, gradients 4, Adam's two moments 8 = 16, "
               "so 14.5 GB is 16 bytes per parameter. Momentum keeps one buffer.")
    print(msg)
    return msg


def check_exercise_3(budget_bytes: float, plain: MemoryProfile, checkpointed: MemoryProfile,
                     effective_batch: int = 32) -> str:
    """Exercise 3: the smallest budget for which the planner still finds a plan (within 1%)."""
    plans = [p.predict_peak(1, accumulation_steps=effective_batch) for p in (plain, checkpointed)]
    expected = min(plans)
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int | float):
        msg = f"Give a number of bytes, got {type(budget_bytes).__name__}."
    elif abs(budget_bytes - expected) <= 0.01 * expected:
        msg = (f"Correct: about {expected:,} bytes, the lower of the two predicted peaks at micro-batch 1 "
               f"(with K = {effective_batch}). Below it, only the remedies for model state help.")
    else:
        msg = ("Not yet. The smallest plan is micro-batch 1 with the most accumulation; take the lower "
               "of the two profiles' predict_peak(1, accumulation_steps=...) values.")
    print(msg)
    return msg
