"""Lesson 03 (notebooks/03_gradient_accumulation.ipynb): its widgets, plots, sizes and exercise checkers.

- `gradient_error(...)` / `show_gradient_error(...)` (max relative error) and
  `show_micro_step_memory(...)`: the widgets' work.
- `scatter_grads(...)`, `plot_micro_step_memory(...)`: the lesson's plots.
- `lesson_sizes(scale)`, `predicted_peak_bytes(scale)`,
  `widget_latency_cases(scale, device, model, loops)`: sizes and the per-lesson protocol
  (the memory widget's moves run the loops the notebook passes).
- `check_exercise_1..4`: the exercises' checkers.

The instruments it uses live apart: the gradient API (`flat_grad`, `full_batch_grad`,
`accumulated_grad`, `compare_grads`, `group_gradient`, `angle_degrees`) in `helpers.accumulation`,
`micro_step_memory` in `helpers.memory`, the throughput sweep (`throughput_sweep`) in
`helpers.techniques.costs`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import torch
from torch import nn

from helpers.core.device import by_scale, device_of
from helpers.core.training import clear_grads, lm_loss
from helpers.core.validate import answer_number, positive_int
from helpers.lessons import verdict
from helpers.measure.formulas import gpt_activation_bytes, gpt_param_count
from helpers.measure.memory import MicroStepMemory, micro_step_memory, run_or_oom, saved_activation_bytes
from helpers.models.gpt import GPTConfig
from helpers.techniques.accumulation import GradDiff, LossFn, accumulated_grad, compare_grads, full_batch_grad

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = [
    "LessonSizes", "check_exercise_1", "check_exercise_2", "check_exercise_3", "check_exercise_4",
    "gradient_error", "lesson_sizes", "plot_micro_step_memory", "predicted_peak_bytes", "scatter_grads",
    "show_gradient_error", "show_micro_step_memory", "widget_latency_cases",
]


# -- widgets -------------------------------------------------------------------------
def gradient_error(
    micro_batch: int,
    steps: int,
    scale: bool = True,
    *,
    seed: int = 0,
    sizes: tuple[int, int, int, int] = (16, 64, 2, 4),
    device: torch.device | str = "cpu",
) -> tuple[GradDiff, torch.Tensor, torch.Tensor]:
    """Widget function: accumulated vs full-batch gradient of a small ResidualMLP.

    Builds a fresh `ResidualMLP(*sizes)` (d_in, width, depth, d_out) and a
    regression batch of `micro_batch * steps` examples, both from `seed`
    without touching the global RNG. Returns `(diff, reference, candidate)`:
    the comparison, the full-batch gradient and the accumulated one.
    """
    from helpers.core.data import regression_batch
    from helpers.models.nets import ResidualMLP

    positive_int("micro_batch", micro_batch)
    positive_int("steps", steps)
    d_in, width, depth, d_out = sizes
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = ResidualMLP(d_in, width, depth, d_out).to(device)
    x, y = regression_batch(micro_batch * steps, d_in, d_out, seed=seed + 1, device=device)
    mse = torch.nn.functional.mse_loss
    reference = full_batch_grad(model, mse, x, y)
    candidate = accumulated_grad(model, mse, x, y, micro_batch, scale=scale)
    return compare_grads(reference, candidate), reference, candidate


def scatter_grads(ax: Axes, reference: torch.Tensor, candidate: torch.Tensor, *, steps: int,
                  title: str = "", max_points: int = 4000) -> None:
    """Scatter candidate against reference gradient entries, with the lines y = x and y = Kx.

    Args:
        ax: the axes.
        reference, candidate: flat gradients of the same shape.
        steps: K, the slope of the second line.
        title: the axes title.
        max_points: the most entries drawn, picked with a fixed seed, so that big models
            still draw in a fraction of a second.
    """
    n = reference.numel()
    pick = torch.randperm(n, generator=torch.Generator().manual_seed(0))[:max_points]
    ref, cand = reference.detach().cpu()[pick], candidate.detach().cpu()[pick]
    ax.scatter(ref, cand, s=4, alpha=0.5)
    lim = float(reference.abs().max()) * 1.05
    ax.plot([-lim, lim], [-lim, lim], color="k", lw=0.8, label="equal (y = x)")
    ax.plot([-lim, lim], [-lim * steps, lim * steps], color="crimson", lw=0.8, ls="--",
            label=f"K times (y = {steps}x)")
    ax.set_xlim(-lim, lim)
    ylim = max(lim, float(cand.abs().max()) * 1.05)  # each panel on its own axes
    ax.set_ylim(-ylim, ylim)
    ax.set_xlabel("full-batch gradient entry")
    ax.set_ylabel("accumulated gradient entry")
    ax.set_title(title)
    ax.legend(fontsize=8)


def show_gradient_error(micro_batch: int = 8, steps: int = 4, scale: bool = True) -> None:
    """Widget: plot accumulated against full-batch gradient entries and print the errors.

    A thin wrapper around `gradient_error` (which tests call directly).

    Args:
        micro_batch, steps: B and K.
        scale: divide each micro-batch's loss by K.
    """
    from helpers.core.plots import figure, show

    diff, ref, cand = gradient_error(micro_batch, steps, scale)
    fig, (ax,) = figure(width=5.5, height=4.0)
    scatter_grads(ax, ref, cand, steps=steps,
                  title=f"B = {micro_batch}, K = {steps}, "
                        f"{'loss / K' if scale else 'no division by K'}")
    show(fig)
    print(f"micro-batch size (B) = {micro_batch}, accumulation steps (K) = {steps} -> "
          f"effective batch B x K = {micro_batch * steps}")
    print(f"max relative error (max_rel) {diff.max_rel:.2e} | norm_ratio {diff.norm_ratio:.5f} | "
          f"cosine {diff.cosine:.6f}")


def plot_micro_step_memory(ax: Axes, results: dict[str, MicroStepMemory], *,
                           unit_bytes: int, title: str = "",
                           references: dict[str, float] | None = None) -> None:
    """Lines of live memory after each micro-step, in multiples of `unit_bytes`.

    Each line starts at 0 (live memory before the loop). Loops whose lines coincide (within 1% of
    `unit_bytes` at every mark) are drawn once, with their names joined by " = ", so no line
    hides another. The x ticks carry the marks' own labels ("start", "1", ..., "backward").

    Args:
        ax: the axes to draw on.
        results: {loop name: its `micro_step_memory` result}.
        unit_bytes: the unit of the y axis (one micro-batch's saved activations).
        title: the axes title.
        references: {label: height in units} drawn as a labelled bracket that rises that far
            above the first loop's last mark, e.g. one micro-batch of logits held by the loop's
            variable: the offset between the correct loop and the loops that hold it.
    """
    from matplotlib.patches import FancyArrowPatch

    positive_int("unit_bytes", unit_bytes)
    curves: list[tuple[list[str], list[float], list[str]]] = []  # (names, heights, mark labels)
    for name, res in results.items():
        heights = [(v - res.live_after[0]) / unit_bytes for v in res.live_after]
        same = next((c for c in curves if len(c[1]) == len(heights)
                     and max(abs(a - b) for a, b in zip(c[1], heights, strict=True)) <= 0.01), None)
        if same is None:
            curves.append(([name], heights, list(res.labels)))
        else:
            same[0].append(name)
    styles = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ("-", "x"), ("--", "v")]
    longest: list[str] = []
    for i, (names, heights, labels) in enumerate(curves):
        line, marker = styles[i % len(styles)]
        ax.plot(range(len(heights)), heights, ls=line, marker=marker, ms=5, label=" = ".join(names),
                alpha=0.85)
        longest = labels if len(labels) > len(longest) else longest
    ticks = ["start" if lab == "start" else lab.removeprefix("micro-step ") for lab in longest]
    ax.set_xticks(range(len(ticks)), ticks)
    base = curves[0][1][-1] if curves else 0.0  # where the first loop (the correct one) ends
    x = len(longest) - 1.5  # between the last two marks, clear of the markers
    for label, height in (references or {}).items():
        ax.add_patch(FancyArrowPatch((x, base), (x, base + height), arrowstyle="<->", mutation_scale=10,
                                     shrinkA=0, shrinkB=0, color="#444", lw=1))
        ax.annotate(label, (x, base + height / 2), xytext=(5, 0), textcoords="offset points",
                    ha="left", va="center", fontsize=8, color="#444")
    ax.set_xlabel("after micro-step")
    ax.set_ylabel("live memory above start\n(x one micro-batch's activations)")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, -0.2), ncol=1)


# -- sizes and the per-lesson protocol ---------------------------------------------------
@dataclass(frozen=True)
class LessonSizes:
    """The sizes lesson 03 uses at one scale (see `lesson_sizes`)."""

    mlp: dict  # ResidualMLP(**mlp)
    micro: int  # MLP micro-batch
    k: int  # MLP accumulation steps
    gpt: GPTConfig
    gpt_micro: int
    gpt_k: int
    b_eff: int  # throughput sweep: effective batch
    widget_b_max: int  # memory widget: largest micro-batch size B
    widget_k_max: int  # ... and largest accumulation steps K
    updates: int  # SGD updates of the K-times-gradient run (the wider GPU-scale MLPs learn slower)


def lesson_sizes(scale: str) -> LessonSizes:
    """Lesson 03's sizes at `scale` ('tiny', 'small', 'medium' or 'full')."""
    def pick(**kw: object) -> object:
        return by_scale(scale, **kw)

    micro, k = pick(tiny=(4, 4), small=(8, 8), medium=(32, 8), full=(64, 8))
    gpt_micro, gpt_k = pick(tiny=(4, 3), small=(8, 4), medium=(8, 4), full=(4, 4))
    b_max, k_max = pick(tiny=(8, 8), small=(8, 8), medium=(8, 8), full=(4, 8))
    return LessonSizes(
        mlp=pick(tiny=dict(d_in=16, width=64, depth=2, d_out=4),
                 small=dict(d_in=32, width=128, depth=3, d_out=8),
                 medium=dict(d_in=128, width=512, depth=6, d_out=32),
                 full=dict(d_in=256, width=1024, depth=8, d_out=64)),
        micro=micro, k=k,
        gpt=pick(
            tiny=GPTConfig(vocab_size=512, seq_len=32, d_model=32, n_heads=2, n_layers=1, dropout=0.0),
            small=GPTConfig(vocab_size=2048, seq_len=64, d_model=64, n_heads=4, n_layers=2, dropout=0.0),
            medium=GPTConfig(vocab_size=16384, seq_len=256, d_model=512, n_heads=8, n_layers=4,
                             dropout=0.0),
            full=GPTConfig(vocab_size=32768, seq_len=512, d_model=768, n_heads=12, n_layers=6,
                           dropout=0.0),
        ),
        gpt_micro=gpt_micro, gpt_k=gpt_k,
        b_eff=pick(tiny=8, small=16, medium=32, full=32),
        widget_b_max=b_max, widget_k_max=k_max,
        updates=pick(tiny=15, small=15, medium=30, full=30),
    )


def predicted_peak_bytes(scale: str) -> int:
    """Predicted peak memory of lesson 03's largest experiment at `scale`, in bytes.

    From `gpt_activation_bytes` (checked in the lesson) and the parameter
    count: weights and gradients, the activations alive at once, and two
    logits-sized temporaries of the backward. The candidates: the float64
    full-batch gradient of the equality check, the summed-losses leak (K
    micro-batches alive), the throughput sweep's largest micro-batch and the
    memory widget's largest B x K. The ResidualMLP runs are far smaller.
    """
    z = lesson_sizes(scale)
    cfg, p = z.gpt, gpt_param_count(z.gpt)

    def run(sequences_alive: int, micro: int, dtype_bytes: int = 4) -> int:
        logits = dtype_bytes * micro * cfg.seq_len * cfg.vocab_size
        return (2 * dtype_bytes * p + gpt_activation_bytes(cfg, sequences_alive, dtype_bytes=dtype_bytes)
                + 2 * logits)

    group = z.gpt_micro * z.gpt_k
    return max(
        run(group, group, dtype_bytes=8),  # full_batch_grad in float64
        run(group, z.gpt_micro),  # sum the losses, one backward
        run(z.b_eff, z.b_eff),  # throughput at micro-batch = effective batch
        run(z.widget_b_max * z.widget_k_max, z.widget_b_max),  # memory widget, summed losses
    )


# -- the memory widget -----------------------------------------------------------------
def show_micro_step_memory(
    model: nn.Module, loops: dict[str, Callable[..., object]], loss_fn: LossFn,
    micro_batch: int = 8, steps: int = 4, *, seed: int = 5,
) -> dict[str, MicroStepMemory]:
    """Widget: live memory after each micro-step of each loop, for B = `micro_batch` and K = `steps`.

    Memory is drawn in units of one micro-batch's saved activations. A loop that runs out
    of GPU memory is shown as OOM.

    Args:
        model: a `GPT`.
        loops: {name: loop}; each is called as `loop(batches, mark)` (the lesson's teaching loops).
        loss_fn: the loss the unit is measured with.
        micro_batch, steps: B and K.
        seed: seeds the token batches.

    Returns:
        {name: `MicroStepMemory`} of the loops that fit.
    """
    from helpers.core.data import token_batch
    from helpers.core.plots import figure, show
    from helpers.core.units import format_bytes

    positive_int("micro_batch", micro_batch)
    positive_int("steps", steps)
    cfg = model.cfg
    device = device_of(model)
    x, y = token_batch(micro_batch * steps, cfg.seq_len, cfg.vocab_size, seed=seed, device=device)
    batches = list(zip(x.split(micro_batch), y.split(micro_batch), strict=True))
    unit = saved_activation_bytes(lambda: loss_fn(model(batches[0][0]), batches[0][1]))
    clear_grads(model)
    results = {}
    for name, loop in loops.items():
        res = run_or_oom(lambda loop=loop: micro_step_memory(partial(loop, batches), model))
        clear_grads(model)
        if res is None:
            print(f"{name}: OOM at B = {micro_batch}, K = {steps}")
        else:
            results[name] = res
    fig, (ax,) = figure(width=7, height=4.2)
    plot_micro_step_memory(ax, results, unit_bytes=unit,
                           title=f"B = {micro_batch}, K = {steps} (1 x = {format_bytes(unit)})")
    show(fig)
    print(f"micro-batch size (B) = {micro_batch}, accumulation steps (K) = {steps} -> "
          f"effective batch B x K = {micro_batch * steps} sequences")
    return results


def widget_latency_cases(
    scale: str,
    device: torch.device,
    model: nn.Module | None = None,
    loops: dict[str, Callable[..., object]] | None = None,
) -> dict[str, Callable[[], object]]:
    """One zero-argument callable per widget control of lesson 03, each doing one slider move.

    Args:
        scale: the lesson's scale ("tiny", "small", "medium" or "full").
        device: where the gradient widget's model runs.
        model: the GPT the memory widget's loops run (the notebook's `gpt`).
        loops: the notebook's own widget loops, `{name: loop(batches, mark)}`, each running
            `model`. The lesson keeps no copy of its teaching loops: without `model` and
            `loops` the memory widget's moves are left out.

    Returns:
        {move: callable}: the gradient widget's moves (micro-batch size B, accumulation
        steps K, loss / K), and with `model` and `loops` the memory widget's (B and K).
    """
    z = lesson_sizes(scale)
    cases: dict[str, Callable[[], object]] = {
        "gradient B=64": lambda: show_gradient_error(64, 4, True),
        "gradient K=16": lambda: show_gradient_error(8, 16, True),
        "gradient B=64, K=16": lambda: show_gradient_error(64, 16, True),
        "gradient loss / K off": lambda: show_gradient_error(8, 4, False),
    }
    if (model is None) != (loops is None):
        raise ValueError("widget_latency_cases: give both model and loops (the notebook's), or neither")
    if model is not None and loops is not None:
        memory = partial(show_micro_step_memory, model, loops, lm_loss)
        cases.update({
            "memory B=1": lambda: memory(1, z.gpt_k),
            f"memory B={z.widget_b_max}": lambda: memory(z.widget_b_max, z.gpt_k),
            f"memory K={z.widget_k_max}": lambda: memory(z.gpt_micro, z.widget_k_max),
            f"memory B={z.widget_b_max}, K={z.widget_k_max}": lambda: memory(z.widget_b_max, z.widget_k_max),
        })
    return cases


# -- exercise checkers -------------------------------------------------------------------
def check_exercise_1(step_ratio: object) -> str:
    """Exercise 1: SGD with max_norm=1.0: the unscaled run's first step length / the scaled run's.

    Answer with a number. Returns (and prints) "Correct: ..." or a hint; never raises.
    """
    v = answer_number(step_ratio)
    return verdict(v is not None and abs(v - 1.0) <= 0.02,
                "while both gradient norms are above max_norm, clipping rescales both to the same "
                "length, so the steps are equally long and the missing 1/K is invisible. The "
                "gradient-norm log still shows K times larger norms before clipping.",
                "clip_grad_norm_ rescales a gradient whose norm is above max_norm to exactly max_norm.")


def check_exercise_2(step_ratio: object) -> str:
    """Exercise 2: Adam: the unscaled run's first weight change / the scaled run's (a number)."""
    v = answer_number(step_ratio)
    return verdict(v is not None and abs(v - 1.0) <= 0.05,
                "Adam divides the first moment by the square root of the second, so a gradient K times "
                "larger gives (almost) the same step; only eps breaks the tie. It is still not the same "
                "algorithm: eps, weight decay and clipping thresholds now act on K-times gradients.",
                "Adam's first step is lr * m / (sqrt(v) + eps) with m = (1 - b1) g and v = (1 - b2) g^2.")


def check_exercise_3(changed: object) -> str:
    """Exercise 3: with retain_graph=True in keep_logits, which kept-logits line grows?

    Answer with one of 'keep logits', 'keep logits.detach()', 'keep predictions'.
    """
    text = str(changed).strip().lower()
    ok = "logits" in text and "detach" not in text and "prediction" not in text
    return verdict(ok, "only the kept logits (with their grad_fn) keep the retained graph alive: about one "
                    "micro-batch of activations more per micro-step. Detached logits and predictions "
                    "hold no graph, so those lines do not change.",
                "which of the kept tensors still refers to the graph that retain_graph=True kept?")


def check_exercise_4(leak: object, fix: object) -> str:
    """Exercise 4: `running = running + loss` after each backward: which leak ('a', 'b', 'c'), which fix?"""
    leak_ok = str(leak).strip().lower().strip("()") == "c"
    fix_ok = any(word in str(fix).lower() for word in ("item", "detach"))
    return verdict(leak_ok and fix_ok,
                "it is (c), a kept tensor with a grad_fn: each backward has already freed the saved "
                "activations, so only a few bytes per micro-step stay, but the chain of graph nodes "
                "grows. Fix: running += loss.item() (or loss.detach()).",
                "backward runs every micro-step here, so the saved activations are freed; what does "
                "`running` still hold on to? (leak: 'a', 'b' or 'c'; fix: one word)")
