"""Lesson 04 (notebooks/04_accumulation_pitfalls.ipynb): sizes, figures, the two widgets, exercises."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from matplotlib.axes import Axes

from helpers.core.device import by_scale
from helpers.core.validate import positive_int
from helpers.lessons import verdict
from helpers.measure.formulas import convnet_activation_bytes, convnet_param_count, mlp_activation_bytes
from helpers.techniques.pitfalls import Schedule, lr_schedule, norm_error_curve

__all__ = [
    "LessonSizes", "bn_error_by_steps", "check_exercise_1", "check_exercise_2", "check_exercise_3",
    "check_exercise_4", "lesson_sizes", "plot_error_curves", "plot_lr_schedules", "predicted_peak_bytes",
    "show_bn_error", "show_schedule", "widget_latency_cases",
]


def plot_error_curves(ax: Axes, curves: dict[str, dict[int, float]], *, batch: int) -> None:
    """Log-log plot of gradient error against micro-batch size; zeros are drawn at 1e-9.

    Args:
        ax: the axes.
        curves: {label: {micro_batch: L2 relative error}}.
        batch: the full batch, marked with a dotted line.
    """
    from helpers.core.plots import plain_ticks

    styles = [("o", "-"), ("s", "-"), ("^", "--"), ("D", "-."), ("v", ":")]
    for (label, curve), (marker, ls) in zip(curves.items(), styles * 2, strict=False):
        ax.plot(list(curve), [max(v, 1e-9) for v in curve.values()], marker=marker, ls=ls,
                label=label, alpha=0.85)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.axvline(batch, color="#999", ls=":", lw=1)
    ax.text(0.99, 0.02, "points at 1e-9 are exactly 0", transform=ax.transAxes, ha="right",
            fontsize=8, color="#666")
    ax.set_xlabel("micro-batch size (examples)")
    ax.set_ylabel("L2 relative gradient error")
    ax.set_title(f"accumulated vs full-batch gradient (batch {batch})")
    ax.legend(fontsize=8)
    plain_ticks(ax)


def plot_lr_schedules(ax: Axes, schedules: dict[str, Schedule], *, title: str = "") -> None:
    """LR against examples seen, one line per schedule, with the warmup end marked.

    Args:
        ax: the axes.
        schedules: {label: `Schedule`}.
        title: the axes title.
    """
    for (label, s), color in zip(schedules.items(), ("#4C72B0", "#DD8452", "#55A868"),
                                 strict=False):
        ax.plot(s.examples, s.lrs, label=label, color=color)
        ax.axvline(s.warmup_end_examples, color=color, ls=":", lw=1)
    ax.set_xlabel("examples seen")
    ax.set_ylabel("learning rate")
    ax.set_title(title)
    ax.legend(fontsize=8)


@dataclass(frozen=True)
class LessonSizes:
    """The sizes lesson 04 uses at one scale (see `lesson_sizes`)."""

    batch: int  # BatchNorm experiments: images per full batch
    width: int  # ConvNet channels
    size: int  # image side in pixels
    updates: int  # scheduler experiment: optimizer updates
    warmup: int  # ... of which warmup
    hidden: int  # ResidualMLP width in the scheduler run
    n_eval: int  # held-out examples
    n_amp: int  # mixed-precision batch
    width_amp: int  # ResidualMLP width in the mixed-precision runs
    widget_b_max: int  # BatchNorm widget: largest micro-batch size B
    widget_k_max: int  # ... and largest accumulation steps K


def lesson_sizes(scale: str) -> LessonSizes:
    """Lesson 04's sizes at `scale` ('tiny', 'small', 'medium' or 'full')."""
    def pick(**kw: object) -> object:
        return by_scale(scale, **kw)

    return LessonSizes(
        batch=pick(tiny=16, small=32, medium=128, full=256),
        width=pick(tiny=8, small=16, medium=32, full=64),
        size=pick(tiny=8, small=8, medium=16, full=32),
        updates=pick(tiny=24, small=24, medium=128, full=256),
        warmup=pick(tiny=8, small=8, medium=32, full=64),
        hidden=pick(tiny=16, small=32, medium=128, full=256),
        n_eval=pick(tiny=128, small=128, medium=1024, full=4096),
        n_amp=pick(tiny=32, small=64, medium=1024, full=4096),
        width_amp=pick(tiny=32, small=64, medium=512, full=1024),
        widget_b_max=pick(tiny=16, small=32, medium=64, full=128),
        widget_k_max=pick(tiny=8, small=8, medium=8, full=8),
    )


def predicted_peak_bytes(scale: str) -> int:
    """Predicted peak memory of lesson 04's largest experiment at `scale`, in bytes.

    The candidates, from the lesson's own sizes and the activation formulas
    above (float32, each counted with its model, gradients and two Adam-sized
    states, plus one more activation set for the backward's temporaries):
    the BatchNorm full-batch gradient and the BatchNorm widget's largest
    B x K batch; the scheduler run (ResidualMLP, AdamW); the mixed-precision
    update (counted in float32, an upper bound for float16).
    """
    s = lesson_sizes(scale)
    conv_state = 4 * 4 * convnet_param_count(s.width, 3)
    bn_batch = max(s.batch, s.widget_b_max * s.widget_k_max)
    conv = conv_state + 2 * convnet_activation_bytes(bn_batch, width=s.width, depth=3, size=s.size)
    def mlp(n: int, d_in: int, width: int) -> int:
        params = d_in * width + width + 2 * (8 * width * width + 7 * width) + width + 1
        return 4 * 4 * params + 2 * mlp_activation_bytes(n, d_in=d_in, width=width, depth=2)
    sched = mlp(max(s.n_eval, 8), 16, s.hidden)
    amp = mlp(s.n_amp // 4, 32, s.width_amp)
    return int(max(conv, sched, amp))


def bn_error_by_steps(micro_batch: int, accum_steps: int, norm: str = "batch", *, width: int = 16,
                      depth: int = 3, size: int = 8, seed: int = 0,
                      device: torch.device | str = "cpu") -> dict[int, float]:
    """BatchNorm widget's numbers: {K': L2 relative gradient error} at the effective batch N = B x K.

    The full batch is `micro_batch * accum_steps` images; K' runs over the
    chosen K and the powers of two up to max(K, 8) that divide N, each
    accumulated over micro-batches of N / K' (K' = 1 is the full batch
    itself, error 0). The error is ||g_acc - g_full|| / ||g_full|| (`GradDiff.l2_rel`).
    """
    positive_int("micro_batch", micro_batch)
    positive_int("accum_steps", accum_steps)
    n = micro_batch * accum_steps
    steps = sorted({k for k in (1, 2, 4, 8, 16, 32) if k <= max(accum_steps, 8) and n % k == 0}
                   | {accum_steps})
    curve = norm_error_curve(norm, batch=n, micro_batches=[n // k for k in steps], width=width,
                             depth=depth, size=size, seed=seed, device=device)
    return {k: curve[n // k] for k in steps}


def show_bn_error(micro_batch: int = 4, accum_steps: int = 4, norm: str = "batch", *,
                  width: int = 16, depth: int = 3, size: int = 8,
                  device: torch.device | str = "cpu") -> None:
    """Widget: the L2 relative gradient error for B and K, against other splits of the same batch.

    Prints the effective batch B x K and the error, and draws error against the number of
    accumulation steps at that effective batch (`bn_error_by_steps` gives the numbers).

    Args:
        micro_batch, accum_steps: B and K.
        norm: the ConvNet's norm ("batch", "group", "layer" or "none").
        width, depth, size: the ConvNet's width and depth and the images' side.
        device: where it runs.
    """
    from helpers.core.plots import figure, plain_ticks, show

    errors = bn_error_by_steps(micro_batch, accum_steps, norm, width=width, depth=depth, size=size,
                               device=device)
    n = micro_batch * accum_steps
    fig, [ax] = figure(height=3.0)
    ks = list(errors)
    ax.plot(ks, [max(errors[k], 1e-9) for k in ks], marker="o", color="#4C72B0",
            label=f"norm={norm}, effective batch {n}")
    ax.plot([accum_steps], [max(errors[accum_steps], 1e-9)], marker="o", ms=12, mfc="none",
            color="crimson", label=f"your choice: B={micro_batch}, K={accum_steps}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_ylim(1e-10, 10)
    ax.set(xlabel="accumulation steps K (micro-batch = effective batch / K)",
           ylabel="L2 relative gradient error",
           title=f"accumulated vs full-batch gradient, effective batch {n}")
    ax.text(0.99, 0.02, "points at 1e-9 are exactly 0 (K = 1 is the full batch)",
            transform=ax.transAxes, ha="right", fontsize=8, color="#666")
    ax.legend(fontsize=8, loc="upper left")
    plain_ticks(ax)
    show(fig)
    print(f"micro-batch size (B) = {micro_batch}, accumulation steps (K) = {accum_steps} -> "
          f"effective batch B x K = {n}; norm={norm}: L2 relative gradient error "
          f"{errors[accum_steps]:.2e} against one batch of {n}")


def show_schedule(accum_steps: int = 4, *, micro_batch: int = 8, updates: int = 24,
                  warmup: int = 8) -> None:
    """Widget: the LR per update with the scheduler stepped per update and per micro-step.

    Args:
        accum_steps: K.
        micro_batch, updates, warmup: passed to `lr_schedule`.
    """
    from helpers.core.plots import figure, show

    kw = dict(micro_batch=micro_batch, updates=updates, warmup=warmup)
    right = lr_schedule(accum_steps, per="update", **kw)
    wrong = lr_schedule(accum_steps, per="micro", **kw)
    fig, [ax] = figure(height=3.0)
    plot_lr_schedules(ax, {"per update": right, "per micro-step": wrong},
                      title=f"K = {accum_steps}, effective batch {micro_batch} x {accum_steps}")
    show(fig)
    zero, zero_right = wrong.first_update_at_zero(), right.first_update_at_zero()
    print(f"micro-batch size (B) = {micro_batch}, accumulation steps (K) = {accum_steps} -> effective "
          f"batch B x K = {micro_batch * accum_steps}; stepped per micro-step the LR reaches 0 at "
          f"update {zero or 'never'} of {updates} (per update: update {zero_right or 'never'})")


def widget_latency_cases(scale: str, device: torch.device) -> dict[str, Callable[[], object]]:
    """One zero-argument callable per widget control of lesson 04, each doing one slider move.

    Covers the BatchNorm widget's micro-batch size (B), accumulation steps (K)
    and normalisation, and the schedule widget's K, at the lesson's sizes.
    """
    s = lesson_sizes(scale)
    conv = dict(width=s.width, size=s.size, device=device)
    sched = dict(micro_batch=8, updates=s.updates, warmup=s.warmup)
    return {
        "B=1": lambda: show_bn_error(1, 4, "batch", **conv),
        f"B={s.widget_b_max}": lambda: show_bn_error(s.widget_b_max, 4, "batch", **conv),
        f"K={s.widget_k_max}": lambda: show_bn_error(4, s.widget_k_max, "batch", **conv),
        f"B={s.widget_b_max}, K={s.widget_k_max}":
            lambda: show_bn_error(s.widget_b_max, s.widget_k_max, "batch", **conv),
        "norm group": lambda: show_bn_error(4, 4, "group", **conv),
        "schedule K=16": lambda: show_schedule(16, **sched),
        "schedule K=1": lambda: show_schedule(1, **sched),
    }


def check_exercise_1(gap_that_closes: object) -> str:
    """Exercise 1 (BatchNorm momentum=None): which running statistic's gap closes?

    Answer with 'running_mean' or 'running_var'. Returns (and prints) "Correct: ..."
    or a hint; never raises.
    """
    answer = str(gap_that_closes).strip().lower().replace(" ", "_")
    return verdict(
        answer in ("running_mean", "mean"),
        "with momentum=None the running mean is a plain average, and the average of K equal-sized "
        "micro-batch means is the full batch's mean. The variance gap stays: each micro-batch's "
        "variance is taken around its own mean, so the spread between the micro-batch means is missing.",
        "compare the average of K micro-batch means with the mean of the whole batch, then do the same "
        "for variances (each measured around a different mean).",
    )


def check_exercise_2(micro_batch: object, ghost: int = 4) -> str:
    """Exercise 2: which `micro_batch` of `accumulated_grad` matches ghost BN with `ghost` examples?"""
    ok = isinstance(micro_batch, int) and not isinstance(micro_batch, bool) and micro_batch == ghost
    return verdict(ok, f"ghost batch norm with ghost batches of {ghost} is accumulation with micro-batches "
                    f"of {ghost}: the BatchNorm statistics come from the same {ghost} examples.",
                "the gradient only depends on which examples each BatchNorm normalises together.")


def check_exercise_3(matches: object) -> str:
    """Exercise 3: does the per-micro-step run with a K-times longer schedule match per-update? (bool)"""
    ok = matches is True or str(matches).strip().lower() in ("yes", "true")
    return verdict(ok, "the update at micro-step K*u uses factor(K*u - 1) of the K-times longer schedule, "
                    "which equals factor(u - 1) of the original: the same LR at every update.",
                "work out which LR the u-th optimizer step sees when the scheduler has been stepped "
                "K*u - 1 times on a schedule of warmup*K and updates*K steps.")


def check_exercise_4(skipped: object, next_scale: object) -> str:
    """Exercise 4: with init_scale=2**24, is the first step skipped, and what scale comes next?"""
    ok = skipped is True and isinstance(next_scale, (int, float)) and next_scale == 2.0**23
    return verdict(ok, "the scaled float16 gradients overflow to inf, GradScaler skips optimizer.step() "
                    "and update() halves the scale (backoff_factor 0.5) to 2**23.",
                "look at out.skipped, then call scaler.update() once and read scaler.get_scale(); "
                "GradScaler's backoff_factor is 0.5.")
