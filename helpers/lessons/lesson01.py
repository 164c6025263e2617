"""Lesson 01 (notebooks/01_where_memory_goes.ipynb): the explainer's budget, and the same table measured.

- The explainer's calculator: `explainer_table()` rebuilds its three 24 GB rows from
  `EXPLAINER_INPUTS` (`budget_row`: one micro-batch's activations on top of the model state);
  `drawn_budget()` turns the measured 8 x 4 peak into the budget line drawn beside them.
- Sizes: `lesson_sizes(scale)`. The model is `helpers.models.gpt.explainer_model()`; the measuring
  is `helpers.techniques.update_memory` (`measure_config`, `activation_sweep`) and the formulas
  are `helpers.measure.formulas`.
- Figures and the widget: `plot_measured_table`, `plot_peak_vs_steps`, `plot_saved_by_origin`,
  `show_update` (one update's measured peak, as a bar).
- Exercises: `check_exercise_1/2/3()`. Per-lesson protocol: `predicted_peak_bytes()`,
  `widget_latency_cases()`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from helpers.core import plots, units
from helpers.core.data import token_batch
from helpers.core.device import SCALES
from helpers.core.plots import figure, show, stacked_bars
from helpers.core.training import lm_loss
from helpers.core.validate import answer_number, choice, non_negative_number, positive_int, positive_number
from helpers.measure.formulas import (
    FP32,
    activation_bytes_per_example,
    param_counts,
    predicted_update_peak_bytes,
)
from helpers.measure.memory import StepMemory, run_or_oom
from helpers.models.gpt import GPT, explainer_config, explainer_model
from helpers.techniques.saved_tensors import origin_group
from helpers.techniques.update_memory import ConfigMemory, measure_config, measure_update

__all__ = [
    "BUDGET_LABEL", "BudgetRow", "EXPLAINER_INPUTS", "GB", "LessonSizes", "budget_row", "check_exercise_1",
    "check_exercise_2", "check_exercise_3", "drawn_budget", "explainer_table", "lesson_sizes",
    "plot_measured_table", "plot_peak_vs_steps", "plot_saved_by_origin", "predicted_peak_bytes",
    "show_update", "widget_latency_cases",
]

GB = 1e9  # the explainer speaks in decimal gigabytes

# The explainer's profile of a 24 GB GPU (decimal GB).
EXPLAINER_INPUTS = {
    "capacity_gb": 24.0,
    "model_state_gb": 14.5,  # weights + gradients + optimizer state
    "overhead_gb": 2.0,  # CUDA workspaces, framework
    "activations_gb": {8: 7.0, 4: 3.8},  # saved activations per micro-batch size
    "checkpointed_activations_gb": {4: 2.0},
}


@dataclass(frozen=True)
class BudgetRow:
    """One configuration of the budget: what is held at once, and whether it fits."""

    label: str
    micro_batch: int
    steps: int
    activations_gb: float
    peak_gb: float
    capacity_gb: float

    @property
    def effective_batch(self) -> int:
        """Examples per optimizer update: micro-batch x accumulation steps."""
        return self.micro_batch * self.steps

    @property
    def headroom_gb(self) -> float:
        """Capacity left at the peak (negative means out of memory)."""
        return self.capacity_gb - self.peak_gb


def budget_row(
    micro_batch: int, steps: int, activations_gb: float, *, label: str = "",
    model_state_gb: float = EXPLAINER_INPUTS["model_state_gb"],
    overhead_gb: float = EXPLAINER_INPUTS["overhead_gb"],
    capacity_gb: float = EXPLAINER_INPUTS["capacity_gb"],
) -> BudgetRow:
    """Peak = model state + overhead + the activations of ONE micro-batch.

    Accumulation steps do not appear in the peak: each micro-batch's
    activations are freed by its backward before the next one starts.
    """
    positive_int("micro_batch", micro_batch)
    positive_int("steps", steps)
    for name, value in (("activations_gb", activations_gb), ("model_state_gb", model_state_gb),
                        ("overhead_gb", overhead_gb)):
        non_negative_number(name, value)
    positive_number("capacity_gb", capacity_gb)
    peak = model_state_gb + overhead_gb + activations_gb
    label = label or f"{micro_batch} x {steps}"
    return BudgetRow(label, micro_batch, steps, activations_gb, round(peak, 6), capacity_gb)


def explainer_table() -> list[BudgetRow]:
    """The explainer's three rows, rebuilt from `EXPLAINER_INPUTS`.

    Returns:
        `BudgetRow`s for 8 x 4, 4 x 8 and 4 x 8 checkpointed.
    """
    acts = EXPLAINER_INPUTS["activations_gb"]
    ckpt = EXPLAINER_INPUTS["checkpointed_activations_gb"]
    return [
        budget_row(8, 4, acts[8], label="8 x 4"),
        budget_row(4, 8, acts[4], label="4 x 8"),
        budget_row(4, 8, ckpt[4], label="4 x 8, checkpointed"),
    ]


def drawn_budget(tightest_peak_bytes: float) -> float:
    """The budget line lesson 01 draws: the measured 8 x 4 peak x 24 / 23.5.

    The explainer's 8 x 4 row peaks at 23.5 of 24 GB, its tightest fit. Scaling
    the measured 8 x 4 peak by the same 24 / 23.5 gives a budget that stands to
    the measured rows as 24 GB stands to the explainer's rows at their tightest.
    It is a budget, not a measured capacity.

    Args:
        tightest_peak_bytes: the measured 8 x 4 peak.

    Returns:
        The budget in bytes.
    """
    positive_number("tightest_peak_bytes", tightest_peak_bytes)
    tightest = explainer_table()[0]
    return tightest_peak_bytes * tightest.capacity_gb / tightest.peak_gb


# -- the sizes the lesson measures ------------------------------------------------------------
@dataclass(frozen=True)
class LessonSizes:
    """How large lesson 01's experiments get at one scale."""

    micro_batches: tuple[int, ...]  # the micro-batch sweep
    max_micro_batch: int  # the widget's B slider
    max_steps: int  # the widget's K slider


_SIZES = {
    "tiny": LessonSizes((3, 4, 5, 6, 8), 8, 8),  # at B <= 2 the tiny model peaks in the optimizer step
    "small": LessonSizes((1, 2, 4, 8, 16), 16, 16),
    "medium": LessonSizes((1, 2, 4, 8, 16), 16, 16),
    "full": LessonSizes((1, 2, 4, 8, 12), 12, 16),
}


def lesson_sizes(scale: str) -> LessonSizes:
    """The micro-batch sweep and the widget's slider ranges at `scale`."""
    return _SIZES[choice("scale", scale, SCALES)]


def predicted_peak_bytes(scale: str) -> int:
    """Predicted peak of lesson 01's largest experiment at `scale`, in bytes.

    The largest experiment is a two-micro-step Adam update at the largest
    micro-batch the lesson measures (its sweep and its widget); every other
    measurement (the 8 x 4 and 4 x 8 rows, the step-count sweep) uses a micro-batch
    of at most 8. Computed with `predicted_update_peak_bytes`, the formula the
    notebook checks against its measurements; nothing is allocated.
    """
    sizes = lesson_sizes(scale)
    largest = max(*sizes.micro_batches, sizes.max_micro_batch, 8)
    return predicted_update_peak_bytes(explainer_config(scale), largest, optimizer="adam", steps=2)


def show_update(model: GPT, micro_batch: int, steps: int, optimizer: str, budget: float | None) -> None:
    """Lesson 01's widget: the measured peak of one update of `steps` micro-batches, as a bar.

    Prints the effective batch B x K and whether the peak fits `budget`. Measures with
    `max_micro_steps=2`: the peak of K micro-steps is the peak of the first two (lesson 01
    checks this).

    Args:
        model: the lesson's GPT.
        micro_batch, steps: B and K.
        optimizer: a name in `OPTIMIZERS`.
        budget: bytes, drawn as a line; None draws none.
    """
    positive_int("micro_batch", micro_batch)
    positive_int("steps", steps)
    mem = run_or_oom(lambda: measure_update(model, micro_batch=micro_batch, steps=steps,
                                            optimizer=optimizer, max_micro_steps=2))
    effective = f"effective batch B x K = {micro_batch} x {steps} = {micro_batch * steps}"
    if mem is None:
        print(f"{effective}: out of memory on this device (OOM)")
        return
    fits = ""
    if budget is not None:
        room = budget - mem.peak_bytes
        fits = (f"; fits the budget with {units.format_bytes(room)} to spare" if room >= 0
                else f"; over the budget by {units.format_bytes(-room)}")
    print(f"{effective}; peak {units.format_bytes(mem.peak_bytes)} ({mem.method}){fits}")
    fig, (ax,) = plots.figure(width=5.8, height=3.4)
    plots.stacked_bars(ax, {f"B={micro_batch}, K={steps}": mem.breakdown}, budget=budget,
                       budget_label=BUDGET_LABEL,
                       title=f"{optimizer}: one update, {effective}")
    ax.title.set_fontsize(9)
    plots.show(fig)


def plot_peak_vs_steps(results: dict[int, StepMemory], micro_batch: int) -> None:
    """Measured peak (bars) and effective batch (line) against the number of accumulation steps; shown.

    Args:
        results: {K: the update's `StepMemory`}.
        micro_batch: B, the same for every K.

    Raises:
        ValueError: if `results` is empty.
    """
    if not results:
        raise ValueError("results is empty: measure at least one step count")
    ks = sorted(results)
    peaks = [results[k].peak_bytes for k in ks]
    unit, size = plots.byte_unit(max(peaks))
    fig, (ax,) = plots.figure(width=7.0, height=3.4)
    labels = [str(k) for k in ks]
    ax.bar(labels, [p / size for p in peaks], color=plots.COLORS["activations"], label="measured peak")
    ax.set(xlabel="accumulation steps (K)", ylabel=f"peak ({unit})",
           title=f"micro-batch B = {micro_batch}: the peak stays, the effective batch grows")
    twin = ax.twinx()
    twin.plot(labels, [micro_batch * k for k in ks], "o-", color="#333", label="effective batch B x K")
    twin.set_ylabel("effective batch B x K")
    twin.grid(False)
    twin.spines["right"].set_visible(True)
    lines = ax.get_legend_handles_labels()
    lines2 = twin.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=9, loc="upper center",
              bbox_to_anchor=(0.5, -0.22), ncol=2)  # below the axes: off the bars and points
    plots.show(fig)


# -- half precision: what autograd saves, by op and dtype --------------------------------------


def plot_saved_by_origin(tables: dict[str, dict[tuple[str, str], int]]) -> None:
    """Horizontal bars of saved bytes per op group for each run, each labelled with its dtype(s); shown.

    Args:
        tables: {run label: its `saved_tensor_bytes` table}.

    Raises:
        ValueError: if `tables` is empty.
    """
    if not tables:
        raise ValueError("tables is empty: give at least one {run label: saved_tensor_bytes(...)}")
    grouped: dict[str, dict[str, dict[str, int]]] = {}  # group -> run -> dtype -> bytes
    for run, table in tables.items():
        for (op, dtype), nbytes in table.items():
            by_dtype = grouped.setdefault(origin_group(op), {}).setdefault(run, {})
            by_dtype[dtype] = by_dtype.get(dtype, 0) + nbytes
    totals = {g: {run: sum(d.values()) for run, d in runs.items()} for g, runs in grouped.items()}
    keys = sorted(totals, key=lambda g: -max(totals[g].values()))
    unit, size = plots.byte_unit(max(max(v.values()) for v in totals.values()))
    fig, (ax,) = plots.figure(width=8.5, height=0.42 * len(keys) + 1.4)
    height = 0.8 / len(tables)
    for i, run in enumerate(tables):
        for j, group in enumerate(keys):
            value = totals[group].get(run, 0) / size
            if not value:
                continue
            y = j + i * height
            ax.barh(y, value, height=height, color=f"C{i}")
            dtypes = "+".join(sorted(grouped[group][run]))
            ax.text(value, y, f" {dtypes}", va="center", fontsize=8, color="#333")
    from matplotlib.patches import Patch

    handles = [Patch(color=f"C{i}") for i in range(len(tables))]
    ax.legend(handles, list(tables), fontsize=8, loc="lower right")
    ax.set_yticks([j + 0.4 - height / 2 for j in range(len(keys))], keys, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.3 * max(max(v.values()) for v in totals.values()) / size)
    ax.set(xlabel=f"saved for backward ({unit})", title="What autograd keeps, by op and dtype")
    plots.show(fig)


# -- exercises -----------------------------------------------------------------------------------
def _close(answer: float, truth: float, rel: float) -> bool:
    return abs(answer - truth) <= rel * abs(truth)


def check_exercise_1(floor_bytes: object = None, per_example_bytes: object = None) -> str:
    """Exercise 1: the small model with d_model doubled to 128 (Adam, float32).

    `floor_bytes`: parameters + gradients + Adam state; `per_example_bytes`: the
    activations of one example. Each must be within 2%. Returns "Correct: ..." or
    a hint; never raises for a wrong answer.
    """
    cfg = dataclasses.replace(explainer_config("small"), d_model=128)
    n_elements, n_tensors = param_counts(cfg)
    floor = 4 * FP32 * n_elements + FP32 * n_tensors
    per_example = activation_bytes_per_example(cfg)
    lines = []
    for name, answer, truth, hint in [
        ("floor_bytes", floor_bytes, floor,
         "count the parameters (12 d^2 per block plus the embeddings and head), then x 4 bytes x 4 "
         "copies: weights, gradients and Adam's two moments"),
        ("per_example_bytes", per_example_bytes, per_example,
         "use the formula of section 3 with h = 128; the s^2 and sV terms do not change with h"),
    ]:
        value = answer_number(answer)
        if answer is None:
            lines.append(f"{name}: no answer yet. Hint: {hint}.")
        elif value is None:
            lines.append(f"{name}: give a number of bytes, got {type(answer).__name__}.")
        elif _close(value, truth, 0.02):
            lines.append(f"Correct: {name} = {units.format_bytes(truth)} ({truth:,} bytes; "
                         f"yours {value:,.0f}).")
        else:
            way = "high" if value > truth else "low"
            lines.append(f"{name}: {value:,.0f} is too {way} (off by more than 2%). Hint: {hint}.")
    return "\n".join(lines)


def check_exercise_2(state_ratio: object = None) -> str:
    """Exercise 2: SGD with momentum=0.9 keeps how many parameter-sizes of state? (measured here)."""
    with torch.random.fork_rng(devices=[]):  # leaves the notebook's random stream alone
        model = GPT(explainer_config("tiny"))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    idx, targets = token_batch(2, model.cfg.seq_len, model.cfg.vocab_size)
    lm_loss(model(idx), targets).backward()
    opt.step()
    state = sum(t.untyped_storage().nbytes() for s in opt.state.values() for t in s.values()
                if isinstance(t, torch.Tensor))
    truth = state / sum(p.untyped_storage().nbytes() for p in model.parameters())
    value = answer_number(state_ratio)
    if state_ratio is None:
        return "No answer yet. Hint: momentum keeps one running buffer per parameter tensor, of its shape."
    if value is None:
        return f"Give a number (a multiple of the parameters' bytes), got {type(state_ratio).__name__}."
    if _close(value, truth, 0.02):
        return f"Correct: measured {truth:.2f} x the parameters (one momentum buffer per parameter)."
    return (f"Not quite: {value:g} is off. Hint: Adam keeps two buffers (exp_avg, exp_avg_sq); "
            "how many does momentum need?")


def check_exercise_3(peak_gb: object = None) -> str:
    """Exercise 3: the explainer's 4 x 8 peak if Adam's two moments were kept in bf16 (GB, +-0.1)."""
    model_state = EXPLAINER_INPUTS["model_state_gb"]
    quarter = model_state / 4  # fp32 weights, gradients, exp_avg, exp_avg_sq: four equal parts
    truth = explainer_table()[1].peak_gb - quarter  # the two moments shrink from 2 quarters to 1
    value = answer_number(peak_gb)
    if peak_gb is None:
        return ("No answer yet. Hint: assume the 14.5 GB is four equal float32 parts (weights, "
                "gradients and Adam's two moments). What does bf16 do to two of them?")
    if value is None:
        return f"Give a number of GB, got {type(peak_gb).__name__}."
    if abs(value - truth) <= 0.1:
        return (f"Correct: {truth:.3f} GB. The two moments drop from 7.25 to 3.625 GB; nothing "
                "else in the row changes.")
    return (f"Not quite: {value:g} GB. Hint: start from the 4 x 8 row's 20.3 GB; Adam's state is half "
            "of the 14.5 GB, and bf16 halves it.")


# -- the per-lesson protocol ------------------------------------------------------------------
def widget_latency_cases(scale: str, device: torch.device) -> dict[str, Callable[[], object]]:
    """One zero-argument callable per control of lesson 01's widget, each one slider move.

    Builds the model and the drawn budget as the notebook does (the budget from
    the measured 8 x 4 peak) and moves B, K and the optimizer to their ends.
    """
    choice("scale", scale, SCALES)
    model = explainer_model(scale, device)
    sizes = lesson_sizes(scale)
    budget = drawn_budget(measure_config(model, micro_batch=8, steps=4, max_micro_steps=2).peak_bytes)

    def move(micro_batch: int = 4, steps: int = 8, optimizer: str = "adam") -> Callable[[], None]:
        return lambda: show_update(model, micro_batch, steps, optimizer, budget)

    return {
        "B=1": move(micro_batch=1),
        f"B={sizes.max_micro_batch}": move(micro_batch=sizes.max_micro_batch),
        "K=1": move(steps=1),
        f"K={sizes.max_steps}": move(steps=sizes.max_steps),
        "optimizer sgd": move(optimizer="sgd"),
        "optimizer adam": move(optimizer="adam"),
    }


BUDGET_LABEL = "24 GB budget, scaled (drawn)"


def plot_measured_table(rows: Sequence[ConfigMemory], labels: Sequence[str] | None = None,
                        budget: float | None = None, *, budget_label: str = BUDGET_LABEL) -> None:
    """Stacked bars (floor, activations, other) of measured rows, with an optional budget line; shown.

    Args:
        rows: the measured configurations (`ConfigMemory`).
        labels: one label per row (default "B x K").
        budget: bytes at which to draw the budget line, if any.
        budget_label: the budget line's label.

    Raises:
        ValueError: if `rows` is empty or `labels` has another length.
    """
    if not rows:
        raise ValueError("rows is empty: measure at least one configuration")
    labels = list(labels) if labels is not None else [f"{r.micro_batch} x {r.steps}" for r in rows]
    if len(labels) != len(rows):
        raise ValueError(f"got {len(labels)} labels for {len(rows)} rows")
    data = {
        label: {
            "parameters + gradients + optimizer_state": r.floor_bytes,
            "activations": r.activations_bytes,
            "other": r.other_bytes,
        }
        for label, r in zip(labels, rows, strict=True)
    }
    fig, (ax,) = figure(width=7.5, height=3.4)
    stacked_bars(ax, data, budget=budget, budget_label=budget_label,
                       title=f"Measured peak per configuration ({rows[0].method})")
    show(fig)
