"""A model's plan from its meta profile: the report `python -m helpers.plan` prints (lesson 09).

- `plan_model(profile, ...)` -> `PlanReport`: from a model's `ModelProfile` (read once), the profile
  of each phase, bytes per example, the planner's choice for a budget (lesson 06's
  `helpers.planner.recommend`), the estimates people use beside ours, and what each remedy saves.
  `PlanReport.table()` prints it, `to_dict()` is the `--json`.
- `reported_card_bytes`, `margin_line`: the card a budget stands for, and the CUDA margin.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from helpers.core.units import format_bytes
from helpers.core.validate import ArgTypeError, choice, number_in_range, positive_number
from helpers.measure.memory_profile import MemoryProfile
from helpers.meta.model_profile import ModelProfile
from helpers.meta.profiler import CHECKPOINTS, PURE_BF16_WARNING, Profiler
from helpers.meta.step_profile import StepProfile
from helpers.plan.cards import CARDS, CUBLAS_SOURCE, cublas_workspace_bytes
from helpers.plan.estimates import CAVEATS, estimates_beside_ours, remedy_savings
from helpers.plan.planner import Plan, recommend
from helpers.plan.presets import DEFAULT_CUDA_MARGIN, GB

__all__ = ["PlanReport", "cpu_threads_note", "margin_line", "plan_model", "reported_card_bytes"]


def reported_card_bytes(budget_bytes: float) -> float:
    """What the card a budget stands for reports, in bytes.

    A budget of a whole number N of decimal GB is read as a card sold as "N GB", and such a
    card reports at most N GiB (24 x 2^30 = 25.8e9 bytes for "24 GB"); real cards report
    less (`helpers.plan.cards`: an L4 21.96 GiB, an RTX 4090 23.99 GiB). Any other budget
    (in GiB, or in bytes) is taken as what the card reports.

    Args:
        budget_bytes: the budget in bytes, as `presets.parse_budget` reads `--budget`.

    Returns:
        N x 2^30 (the most a card sold as N GB reports) for a budget of N decimal GB,
        otherwise `budget_bytes` itself.
    """
    gb = positive_number("budget_bytes", budget_bytes) / GB
    return round(gb) * 2**30 if round(gb) >= 1 and abs(gb - round(gb)) < 1e-9 else float(budget_bytes)


def margin_line(budget_bytes: float, usable_bytes: float) -> str:
    """The budget and what the plan may use, in GiB, and the margin as a share of the budget and of the card.

    Decimal GB appear once, only where a budget of N GB stands for a card sold as "N GB".
    """
    card = reported_card_bytes(budget_bytes)
    kept = budget_bytes - usable_bytes
    n = round(budget_bytes / GB)
    sold = f'{n} GB (decimal, as cards are sold) = ' if card != budget_bytes else ""
    text = f"budget {sold}{_fmt(budget_bytes)}, planning within {_fmt(usable_bytes)}"
    if kept <= 0:
        return text + " (no margin)"
    text += f": the margin keeps {kept / budget_bytes:.0%} of the budget free"
    if card != budget_bytes:
        text += f", {1 - usable_bytes / card:.0%} of {_fmt(card)}"
        sold = sorted((c.total_bytes, c.name) for c in CARDS.values() if c.sold_as == f"{n} GB")
        if sold:  # cards sold as N GB report less than N GiB, and not all the same: name one
            (low, first), (high, last) = sold[0], sold[-1]
            text += (f" (cards sold as {n} GB report {_fmt(low)} ({first}) to {_fmt(high)} ({last}): "
                     f"--gpu {first} plans for that card's own memory)")
    return text


_PRECISION_WORDS = {
    "fp32": "fp32 weights, gradients and optimizer state",
    "bf16": "bf16 autocast over fp32 master weights, fp32 gradients, fp32 optimizer state",
    "pure-bf16": "pure bf16: weights, gradients and optimizer state all bf16, no fp32 master copy",
}


_fmt = format_bytes  # one convention throughout: KiB, MiB, GiB, one decimal


def _count(n: int) -> str:
    """A parameter count in words: 1.24 B, 124.4 M, 12.3 k, or the plain count below a thousand."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.{2 if unit == 'B' else 1}f} {unit}"
    return str(n)


@dataclass
class PlanReport:
    """Everything `python -m helpers.plan` prints: profiles, the plan and the estimates beside it."""

    model: str
    n_params: int
    spec: str
    optimizer: str
    target: str
    precision: str
    kernels: tuple[str, ...]
    steps: dict[str, StepProfile]
    profiles: dict[str, MemoryProfile]
    budget_bytes: float
    usable_bytes: float
    effective_batch: int
    plan: Plan | None
    refusal: str
    checked_peak_bytes: int | None
    estimates: dict[str, float]
    remedies: dict[str, float]
    seconds: float
    notes: list[str] = field(default_factory=list)
    released_peak_bytes: int | None = None
    n_trainable: int = 0
    trainable: str = "all parameters"
    cpu_threads: int = field(default_factory=torch.get_num_threads)  # the intra-op threads it was planned at
    # per mode: (micro-batches (lo, hi), bytes one more example adds to the peak between them, from full
    # profiles with `check`, else the fit's activation + other slopes, with lo == hi == 0)
    growth: dict[str, tuple[int, int, float]] = field(default_factory=dict)
    # CUDA target: what the step's cuBLAS workspaces take from the caching allocator beside the tensors
    workspace_bytes: int = 0
    # the card the budget came from (`--gpu L4`): what it reports, and the CUDA context outside the allocator
    card_total_bytes: int | None = None
    context_bytes: int = 0

    @property
    def floor_bytes_per_param(self) -> float:
        """The floor (weights + gradients + optimizer state) per parameter: 16 for fp32 or bf16 mixed
        precision with Adam, 8 for pure bf16, about 4 plus a little for LoRA (frozen fp32 base)."""
        return self.profiles["plain"].floor_bytes / self.n_params

    @property
    def predicted_peak_bytes(self) -> int | None:
        """The plan's peak: the larger of the fitted prediction and the full profile of that configuration."""
        if self.plan is None:
            return None
        return max(self.plan.predicted_peak_bytes, self.checked_peak_bytes or 0)

    @property
    def predicted_allocated_bytes(self) -> int | None:
        """What `torch.cuda.max_memory_allocated` should read for the plan: the tensors' peak plus the
        cuBLAS workspaces (0 on a CPU target)."""
        peak = self.predicted_peak_bytes
        return None if peak is None else peak + self.workspace_bytes

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready dict (bytes as ints)."""
        steps = {
            mode: {
                "micro_batch": s.micro_batch,
                "peak_bytes": s.peak_bytes,
                "floor_bytes": s.floor_bytes,
                "phases": {name: {"total": sum(b.values()), **b} for name, b in s.phases.items()},
                "binding_phase": s.binding_phase,
            }
            for mode, s in self.steps.items()
        }
        prof = {
            mode: {
                "floor_bytes": p.floor_bytes,
                "activation_bytes_per_example": round(p.activation_bytes_per_example),
                "other_bytes_per_example": round(p.other_bytes_per_example),
                "optimizer_peak_bytes": round(p.optimizer_peak_bytes),
                "held_output_bytes_per_example": round(p.held_output_bytes_per_example),
            }
            for mode, p in self.profiles.items()
        }
        plan = (
            None
            if self.plan is None
            else {
                "micro_batch": self.plan.micro_batch,
                "accumulation_steps": self.plan.accumulation_steps,
                "checkpoint": self.plan.checkpoint,
                "predicted_peak_bytes": self.predicted_peak_bytes,
                "predicted_allocated_bytes": self.predicted_allocated_bytes,
                "fitted_peak_bytes": self.plan.predicted_peak_bytes,
                "checked_peak_bytes": self.checked_peak_bytes,
                "del_predictions_peak_bytes": self.released_peak_bytes,
                "del_predictions_saves_bytes": None if self.released_peak_bytes is None
                else self.predicted_peak_bytes - self.released_peak_bytes,
                "reason": self.plan.reason,
            }
        )
        return {
            "model": self.model,
            "parameters": self.n_params,
            "batch": self.spec,
            "optimizer": self.optimizer,
            "target": self.target,
            "cpu_threads": self.cpu_threads if self.target == "cpu" else None,
            "precision": self.precision,
            "trainable": self.trainable,
            "trainable_parameters": self.n_trainable,
            "floor_bytes_per_parameter": round(self.floor_bytes_per_param, 3),
            "attention_kernels": list(self.kernels),
            "method": "meta-tracker",
            "loop": "the explainer's loop as written (predictions alive until the next micro-step)",
            "step_at_micro_batch_1": steps,
            "profiles": prof,
            "budget_bytes": round(self.budget_bytes),
            "usable_bytes": round(self.usable_bytes),
            "cuda_workspace_bytes": self.workspace_bytes,
            "card_total_bytes": self.card_total_bytes,
            "cuda_context_bytes": self.context_bytes if self.card_total_bytes is not None else None,
            "effective_batch": self.effective_batch,
            "plan": plan,
            "refusal": self.refusal or None,
            "estimates_bytes": {k: round(v) for k, v in self.estimates.items()},
            "remedy_savings_bytes": {k: round(v) for k, v in self.remedies.items()},
            "seconds": round(self.seconds, 2),
            "notes": self.notes,
        }

    def table(self) -> str:
        """The report as plain-text tables."""
        lines = [
            f"{self.model}: {_count(self.n_params)} parameters, {self.spec}",
            f"trainable: {self.trainable} ({self.n_trainable:,} of {self.n_params:,} parameters "
            f"require grad; only they have gradients and optimizer state)",
            f"floor {_fmt(self.profiles['plain'].floor_bytes)}: {self.floor_bytes_per_param:.2f} bytes per "
            f"parameter ({_PRECISION_WORDS[self.precision]})",
            f"optimizer {self.optimizer}, precision {self.precision}, target {self.target} "
            f"(attention kernel: {', '.join(self.kernels) or 'none'}); profiled on the meta device "
            f"in {self.seconds:.1f} s",
            "",
        ]
        cats = ("parameters", "gradients", "optimizer_state", "activations", "other")
        head = (f"{'micro-batch 1, K>=2':34s}" + "".join(f"{c.replace('_', ' '):>16s}" for c in cats)
                + f"{'total':>12s}")
        lines.append(head)
        for mode, s in self.steps.items():
            for name, b in s.phases.items():
                row = f"{mode + ': ' + name:34s}" + "".join(f"{_fmt(b[c]):>16s}" for c in cats)
                lines.append(row + f"{_fmt(sum(b.values())):>12s}")
        lines.append("")
        for mode, p in self.profiles.items():
            # activations + other: what one more example adds to the peak. Printed alone, the
            # activation slope can be negative once the peak moves into backward (other grows instead).
            lo, hi, per_example = self.growth.get(
                mode, (0, 0, p.activation_bytes_per_example + p.other_bytes_per_example))
            where = f"from B = {lo} to {hi}, full profiles" if hi else "the fit"
            lines.append(
                f"{mode:>6s}: floor {_fmt(p.floor_bytes)}, "
                f"each example adds {_fmt(max(per_example, 0.0))} to the peak ({where}; "
                f"{_fmt(p.held_output_bytes_per_example)} per example held by `predictions`), "
                f"optimizer-step peak {_fmt(p.optimizer_peak_bytes)}"
            )
        buffers = {k: v for s in self.steps.values() for k, v in s.kernel_buffer_bytes.items()}
        for kernel, n in sorted(buffers.items()):
            lines.append(f"{kernel} attention backward: {_fmt(n)} of its own buffers per call (other)")
        lines.append("")
        margin = margin_line(self.budget_bytes, self.usable_bytes)
        lines.append(f"{margin}; effective batch {self.effective_batch}")
        if self.plan is not None:
            checked = (
                ""
                if self.checked_peak_bytes is None
                else f"; profiled again: {_fmt(self.checked_peak_bytes)}"
            )
            lines.append(f"PLAN: {self.plan.describe().split(' (predicted')[0]} (predicted peak "
                         f"{_fmt(self.predicted_peak_bytes)}, the larger of the fit's "
                         f"{_fmt(self.plan.predicted_peak_bytes)}{checked})")
            lines.append(f"  {self.plan.reason}")
            if self.workspace_bytes:
                lines.append(f"  on the card: tensors {_fmt(self.predicted_peak_bytes)} + cuBLAS workspaces "
                             f"{_fmt(self.workspace_bytes)} = {_fmt(self.predicted_allocated_bytes)} "
                             f"allocated [{CUBLAS_SOURCE}]")
            if self.card_total_bytes is not None:
                used = (self.predicted_allocated_bytes or 0) + self.context_bytes
                total = self.card_total_bytes
                lines.append(f"  what nvidia-smi would show at the peak: {_fmt(used)} (allocated + the CUDA "
                             f"context {_fmt(self.context_bytes)}) of the card's {_fmt(total)}, "
                             f"{_fmt(total - used)} left for fragmentation (reserved minus allocated, not "
                             "modelled) and what else the margin covers")
            if self.released_peak_bytes is not None:
                lines.append(
                    f"  with `del predictions` after the loss: peak {_fmt(self.released_peak_bytes)}, saves "
                    f"{_fmt(self.predicted_peak_bytes - self.released_peak_bytes)} (the plan is for the loop "
                    "as written, whose `predictions` variable holds the outputs until the next micro-step)"
                )
        else:
            lines.append(f"NO PLAN: {self.refusal}")
        lines.append("")
        lines.append("estimates beside ours:")
        for name, v in self.estimates.items():
            lines.append(f"  {name:48s}{_fmt(v):>12s}")
        lines.append("what each remedy would save:")
        for name, v in self.remedies.items():
            lines.append(f"  {name:48s}{_fmt(v):>12s}")
        lines.extend(f"WARNING: {n}" if n == PURE_BF16_WARNING else f"note: {n}" for n in self.notes)
        return "\n".join(lines)


def _plan(profiles: dict[str, MemoryProfile], usable: float, effective_batch: int,
          min_micro_batch: int, verify: Callable[[int, int, bool], int] | None) -> tuple[Plan | None, str]:
    """The planner's choice for these profiles (each candidate checked by `verify`), or None and why not."""
    try:
        plan = recommend(usable, effective_batch, profiles["plain"], profiles.get("checkpointed"),
                         min_micro_batch=min_micro_batch, verify=verify)
    except ValueError as err:
        return None, str(err)
    return plan, ""


def cpu_threads_note() -> str:
    """What a CPU-target plan holds for: the intra-op thread count it measured kernels' buffers at.

    oneDNN's convolution and 16-bit reduction buffers are per thread, so the plan measures them on
    the real CPU at `torch.get_num_threads()` (tests compare plans with real steps at 1 and 2 threads).
    """
    n = torch.get_num_threads()
    return (f"CPU target: planned for {n} intra-op thread{'s' if n > 1 else ''} (torch.get_num_threads(); "
            "kernels' own buffers, oneDNN's among them, are per thread and were measured at this count); "
            "a process with more threads may need more: plan it there")


def plan_model(
    profile: ModelProfile | Profiler,
    *,
    name: str,
    budget_bytes: float,
    effective_batch: int,
    checkpoint: str = "blocks",
    cuda_margin: float = DEFAULT_CUDA_MARGIN,
    min_micro_batch: int = 1,
    check: bool = True,
) -> PlanReport:
    """Plan a model for a budget (lesson 06's rule) from its meta profile, read once.

    `profile` is the model's `ModelProfile` (`Profiler.profile(checkpoint)`), or a `Profiler`,
    which is asked for it. `checkpoint="blocks"` lets the planner checkpoint every block when
    nothing fits without it; "none" keeps it off. For a CUDA target the planner keeps
    `cuda_margin` (a fraction) of the budget free for what tensors do not show: the
    CUDA context, cuDNN workspaces and the caching allocator's fragmentation; the cuBLAS
    workspaces are modelled (`cards.cublas_workspace_bytes`) and planned within the budget.
    With `check`, every candidate the fit says fits is profiled again in full before it is
    chosen; one whose full profile is over the budget is skipped and the next smaller one is
    tried (`recommend(verify=...)`), so the plan is never refused while a smaller micro-batch
    fits. The report's predicted peak is the larger of the fit and the full profile. The plan is
    for the explainer's loop as written; `released_peak_bytes` is the same configuration
    with `del predictions` after the loss.
    """
    start = time.perf_counter()
    choice("checkpoint", checkpoint, CHECKPOINTS)
    if isinstance(profile, Profiler):
        profile = profile.profile(checkpoint)
    if not isinstance(profile, ModelProfile):
        raise ArgTypeError("profile must be a helpers.meta.model_profile.ModelProfile or a "
                           f"helpers.meta_profile.Profiler, got {type(profile).__name__}")
    if checkpoint != "none" and "checkpointed" not in profile.modes:
        raise ValueError(f"checkpoint={checkpoint!r} needs a profile with the checkpointed mode, got modes "
                         f"{profile.modes}: make it with Profiler.profile('blocks'), or plan with "
                         "checkpoint='none'")
    budget = positive_number("budget_bytes", budget_bytes)
    margin = number_in_range("cuda_margin", cuda_margin, 0.0, 1.0, high_open=True)
    usable = budget * (1 - margin) if profile.target == "cuda" else budget
    workspace = cublas_workspace_bytes(profile.capability) if profile.target == "cuda" else 0
    profiles = {m: p for m, p in profile.profiles.items() if checkpoint != "none" or m == "plain"}
    steps = {m: profile.steps[m] for m in profiles}

    def verify(b: int, k: int, ckpt: bool) -> int:
        """The candidate profiled in full (K >= 2 stands for any K >= 2): the plan never goes below it."""
        return profile.full_step(b, k, ckpt).peak_bytes

    plan, refusal = _plan(profiles, usable - workspace, effective_batch, min_micro_batch,
                          verify if check else None)
    checked, released = None, None
    if plan is not None and check:
        full = profile.full_step(plan.micro_batch, plan.accumulation_steps, plan.checkpoint)
        checked, released = full.peak_bytes, full.released.peak_bytes if full.released else None
    if plan is not None and not check:
        k = plan.accumulation_steps
        released = profiles["checkpointed" if plan.checkpoint else "plain"].predict_peak(
            plan.micro_batch, accumulation_steps=k, keep_output=False)
    b = plan.micro_batch if plan is not None else 1
    mode = ("checkpointed" if (plan is None or plan.checkpoint) and "checkpointed" in profiles
            else "plain")
    remedies = remedy_savings(profile, b, mode, checkpointing="checkpointed" in profiles, exact=check)
    growth = {}
    if check:  # what one more example adds, between two full profiles around the plan's micro-batch
        hi = max(b, 2)
        lo = hi // 2
        for m in profiles:
            ck = m == "checkpointed"
            rise = profile.full_step(hi, 2, ck).peak_bytes - profile.full_step(lo, 2, ck).peak_bytes
            growth[m] = (lo, hi, rise / (hi - lo))
    kernels = tuple(sorted({k for s in steps.values() for k in s.kernels}))
    notes = [PURE_BF16_WARNING] if profile.precision == "pure-bf16" else []
    if profile.target == "cuda":
        notes.append(
            f"CUDA target (sm{profile.capability}): attention assumed {', '.join(kernels) or 'absent'} "
            "(PyTorch's CUDA SDPA order: flash for fp16/bf16 without a mask on sm80 and later, which also "
            "takes grouped-query attention with enable_gqa; else memory-efficient, or math for "
            "grouped-query attention; with a mask Transformers expands K and V first, and the copies are "
            "saved); foreach optimizer (about one "
            f"parameter-sized temporary during the step); {margin:.0%} of the budget kept free "
            f"(--cuda-margin) beside the modelled cuBLAS workspaces ({_fmt(workspace)}) for what the profile "
            "does not count: cuDNN workspaces and kernels "
            "other than the assumed ones (inside torch.cuda.max_memory_allocated), fragmentation "
            "(memory_reserved minus memory_allocated) and the CUDA context (outside the allocator; "
            "nvidia-smi shows it)"
        )
        notes.append(
            "CUDA target: a fused-attention backward's own buffers are assumed, not measured: "
            "FlashAttention-2 keeps an fp32 dq accumulator and fp32 row sums; the memory-efficient kernel "
            "fp32 row sums, and fp32 dq, dk, dv accumulators for 16-bit inputs "
            "(helpers.meta.kernel_buffers.attention_backward_buffer_bytes)"
        )
    if profile.target == "cpu":
        notes.append(cpu_threads_note())
    if profile.optimizer in ("adam", "adamw"):
        notes.extend(f"{name}: {caveat}" for name, caveat in CAVEATS.items())
    return PlanReport(
        name,
        profile.n_params,
        profile.batch,
        profile.optimizer,
        profile.target,
        profile.precision,
        kernels,
        steps,
        profiles,
        budget,
        usable,
        effective_batch,
        plan,
        refusal,
        checked,
        estimates_beside_ours(profile, b, exact=check),
        remedies,
        time.perf_counter() - start,
        notes,
        released,
        profile.n_trainable,
        profile.trainable,
        growth=growth,
        workspace_bytes=workspace,
    )
