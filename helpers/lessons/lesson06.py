"""Combine and choose (lesson 06): the lesson's model, a real OOM under a cap, the widget, the exercises.

The planner itself (`MemoryProfile`, `fit_profile`, `Plan`, `recommend`, the estimators and
the remedies) is in `helpers.planner`; the phase measurements (`measure_phases`,
`UpdateMeasurer`) are in `helpers.techniques.phases`. Here, in the order the notebook uses them:

- `lesson_config` / `lesson_model`: the GPT this lesson measures at each scale.
- `run_capped`: run a callable under a CUDA per-process memory cap; an OOM is caught.
- `PlannerLab`: the pure function behind the lesson's widget.
- `draw_decision_diagram`: the decision procedure as a small figure.
- `predicted_peak_bytes`, `widget_latency_cases`: the per-lesson protocol;
  `explainer_profiles` and `check_exercise_1` ... `check_exercise_3`: the exercise checkers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from helpers.core.device import SCALES, by_scale
from helpers.core.validate import choice, positive_int
from helpers.measure.formulas import gpt_param_count, korthikanti_activation_bytes
from helpers.measure.memory_profile import MemoryProfile, fit_profile
from helpers.models.gpt import GPT, GPTConfig
from helpers.plan.planner import GB, Plan, recommend
from helpers.techniques.phases import PhaseMemory, UpdateMeasurer

__all__ = [
    "EXPLAINER_GB", "LARGEST_RUN", "PlannerLab", "check_exercise_1", "check_exercise_2", "check_exercise_3",
    "LessonSizes", "draw_decision_diagram", "explainer_profiles", "lesson_config", "lesson_model",
    "lesson_sizes", "predicted_peak_bytes", "widget_latency_cases",
]

# The explainer's 24 GB example, in decimal GB (floor = weights + gradients + optimizer state).
EXPLAINER_GB = {"capacity": 24.0, "floor": 14.5, "other": 2.0, "act_8": 7.0, "act_4": 3.8, "ckpt_4": 2.0}

# -- The model of this lesson ----------------------------------------------------------------------


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

    Args:
        scale: "tiny", "small", "medium" or "full".
        device: where it goes.
        seed: the seed of its weights.

    Returns:
        The `GPT`.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT(lesson_config(scale))
    return model.to(device).train()


# -- A real OOM under a cap (CUDA) -----------------------------------------------------------------


# -- The widget ------------------------------------------------------------------------------------


@dataclass
class PlannerLab:
    """The state behind the widget: the model, one measurer per mode, and the fitted profiles.

    `show(budget_bytes, micro_batch, accumulation_steps, checkpointed)` is what one
    slider move runs. It measures that configuration (an update of min(K, 2)
    micro-steps: the peak is the same for any K >= 2), predicts it, asks the planner for
    the effective batch B x K, prints the answer and draws the bar. `build(scale, device)`
    makes one.

    Args:
        model: the lesson's GPT.
        plain, checkpointed: the profiles fitted without and with checkpointing.
        measurers: {checkpointed: its `UpdateMeasurer`}.
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
        plain = UpdateMeasurer(model, optimizer="adam")  # one Adam, shared: one set of optimizer state
        measurers = {False: plain, True: UpdateMeasurer(model, checkpointed=True, optimizer=plain.optimizer)}
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
        from helpers.core import plots, units

        measured, predicted, plan = self.answer(budget_bytes, micro_batch, accumulation_steps, checkpointed)
        k = accumulation_steps
        fits = measured.peak_bytes <= budget_bytes
        print(f"effective batch B x K = {micro_batch} x {k} = {micro_batch * k}"
              f"{', checkpointed' if checkpointed else ''}")
        fmt = units.format_bytes
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
        ax.hlines(predicted / size, -0.4, 0.4, colors="black", lw=2.5, label="predicted peak")  # the bar wide
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        plots.show(fig)

    def budget_options(self, max_micro_batch: int, n: int = 12) -> list[tuple[str, int]]:
        """Budget choices for a slider: from below the floor to above the largest plain peak."""
        from helpers.core.units import format_bytes

        low = 0.9 * self.plain.floor_bytes
        high = 1.1 * self.plain.predict_peak(max_micro_batch, accumulation_steps=2)
        values = [round(low + (high - low) * i / (n - 1)) for i in range(n)]
        return [(format_bytes(v), v) for v in values]


# -- The decision diagram --------------------------------------------------------------------------


def draw_decision_diagram(path: str | None = None) -> object:
    """Draw the decision procedure as a flowchart.

    Args:
        path: save it there as a PNG when given.

    Returns:
        The matplotlib figure (show it with `helpers.core.plots.show`).
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    fig, ax = plt.subplots(figsize=(10.0, 5.4))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 6.1)
    ax.set(xticks=[], yticks=[])  # a drawing, not a chart: no ticks, no frame, no grid
    ax.grid(False)
    for spine in ax.spines.values():
        spine.set_visible(False)

    def box(x0: float, x1: float, y: float, h: float, text: str, color: str) -> None:
        ax.add_patch(FancyBboxPatch((x0, y - h / 2), x1 - x0, h, boxstyle="round,pad=0.04",
                                    fc=color, ec="#555", lw=1.0))
        ax.text((x0 + x1) / 2, y, text, ha="center", va="center", fontsize=8.5)

    def arrow(a: tuple[float, float], b: tuple[float, float], label: str = "") -> None:
        ax.annotate("", xy=b, xytext=a, arrowprops=dict(arrowstyle="->", color="#333", lw=1.2))
        if label and a[0] == b[0]:  # a vertical arrow: its label beside it, clear of the boxes
            ax.text(a[0] + 0.12, (a[1] + b[1]) / 2, label, fontsize=8, color="#333", ha="left", va="center")
        elif label:
            ax.text((a[0] + b[0]) / 2, (a[1] + b[1]) / 2 + 0.1, label, fontsize=8, color="#333", ha="center")

    ask, ok, stop = "#fff3d6", "#e3f2e1", "#f7e1e1"
    box(2.3, 7.5, 5.5, 0.7, "Profile one update: floor (weights + gradients + optimizer state),\n"
                            "activations per example, the optimizer step's peak", "#e8eef7")
    box(2.6, 7.2, 4.3, 0.7, "Does the floor (and the optimizer step)\nfit the budget?", ask)
    box(2.6, 7.2, 3.0, 0.95, "Your minimum B: the smallest micro-batch that keeps\nthe device busy "
                             "(throughput, lesson 03 §7). Largest B >= it,\n"
                             "dividing the effective batch B_eff, that fits WITHOUT checkpointing?", ask)
    box(2.6, 7.2, 1.7, 0.7, "Largest such B that fits\nWITH checkpointing?", ask)
    box(7.8, 9.9, 3.0, 0.8, "Use B, no checkpointing;\naccumulate K = B_eff / B", ok)
    box(7.8, 9.9, 1.7, 0.7, "Checkpoint, use B;\naccumulate K = B_eff / B", ok)
    box(0.1, 2.0, 3.0, 2.4, "Model state dominates:\nshard it across\nworkers (lesson 07),\n"
                            "shard the optimizer\nstate, lower its\nprecision, or\noffload it", stop)
    arrow((4.9, 5.15), (4.9, 4.65))
    arrow((4.9, 3.95), (4.9, 3.5), "yes")
    arrow((4.9, 2.5), (4.9, 2.05), "no")
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


# -- Protocol: predicted peak and widget latency cases ---------------------------------------------

LARGEST_RUN = (32, 1)  # (micro-batch, steps): the naive whole-batch update, the lesson's largest run


@dataclass(frozen=True)
class LessonSizes:
    """The sizes lesson 06 uses at one scale: its GPT and its largest run (micro-batch, steps)."""

    config: GPTConfig
    largest_run: tuple[int, int]


def lesson_sizes(scale: str) -> LessonSizes:
    """Every size lesson 06 uses at `scale` ("tiny", "small", "medium" or "full")."""
    return LessonSizes(lesson_config(scale), LARGEST_RUN)


def predicted_peak_bytes(scale: str) -> int:
    """Predicted peak of lesson 06's largest run at `scale`: 32 examples in one pass, plain.

    Floor = 16 bytes per parameter (fp32 Adam, checked in the lesson), plus, per
    example, Korthikanti's fp32 activations for the layers and three logit-sized
    tensors (logits, log-softmax, their gradient), with a 1.5x margin for what the
    formula leaves out (the lesson shows its error), plus one parameter copy for the
    optimizer step's temporaries.
    """
    cfg = lesson_config(scale)
    s, h, v = cfg.seq_len, cfg.d_model, cfg.vocab_size
    n_params = gpt_param_count(cfg)
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


# -- Exercises -------------------------------------------------------------------------------------


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
