"""Lesson 07 (notebooks/07_data_parallel.ipynb): sizes, the data-parallel widget, figures, exercises."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from helpers.core.validate import choice, positive_int
from helpers.distributed.ddp import (
    D_IN,
    D_OUT,
    DEPTH,
    BatchSizes,
    check_batch_sizes,
    ddp_accumulated_grad,
    lesson_data,
    mse_loss,
    replica_model,
)
from helpers.distributed.fsdp import FSDPStepMemory
from helpers.distributed.launcher import WorkerPool, shared_pool
from helpers.distributed.processes import max_workers

__all__ = [
    "DataParallelReport", "LessonSizes", "check_exercise_1", "check_exercise_2", "check_exercise_3",
    "data_parallel_report",
    "NO_SYNC_KINDS", "draw_fsdp_memory", "draw_no_sync_bars", "draw_report", "lesson_sizes", "no_sync_kind",
    "predicted_peak_bytes", "show_data_parallel",
    "widget_latency_cases",
]


SIZES = {  # scale -> model width; the lesson is about communication, so models stay small everywhere
    "tiny": 32, "small": 64, "medium": 128, "full": 256,
}


@dataclass(frozen=True)
class LessonSizes:
    """The sizes lesson 07 uses at one scale (see `lesson_sizes`).

    `micro_batch` (B), `steps` (K) and `workers` (W: 2, or every GPU under NCCL) are the
    widget's defaults; `width` is the model width of every run.
    """

    micro_batch: int
    steps: int
    workers: int
    width: int


def lesson_sizes(scale: str) -> LessonSizes:
    """The lesson's default B, K, W and model width at `scale` (W: 2, or the GPUs under NCCL)."""
    from helpers.core.device import by_scale

    bk = by_scale(scale, tiny=(2, 2), small=(4, 4), medium=(8, 4), full=(8, 4))
    return LessonSizes(micro_batch=bk[0], steps=bk[1],
                       workers=min(2, max_workers()) if max_workers() < 4 else max_workers(),
                       width=SIZES[scale])


@dataclass(frozen=True)
class DataParallelReport:
    """One widget answer: the sizes, all-reduces per update both ways, and the gradient match."""

    sizes: BatchSizes
    calls_no_sync: int
    calls_every_step: int
    diff: object  # helpers.accumulation.GradDiff against one process on the full batch
    ranks_agree: bool


def data_parallel_report(micro_batch: int, accumulation_steps: int, world_size: int, *, width: int = 64,
                         pool: WorkerPool | None = None, seed: int = 0) -> DataParallelReport:
    """Run one update of B x K x W on real DDP workers, with and without no_sync; compare to one process."""
    import functools

    from helpers.techniques.accumulation import compare_grads, full_batch_grad

    sizes = check_batch_sizes(None, micro_batch, accumulation_steps, world_size)
    x, y = lesson_data(sizes.train_batch, seed=seed)
    model_fn = functools.partial(replica_model, width)
    ref = full_batch_grad(model_fn(), mse_loss, x, y)
    kw = dict(micro_batch=micro_batch, accumulation_steps=accumulation_steps, world_size=world_size,
              pool=pool)
    quiet = ddp_accumulated_grad(model_fn, mse_loss, x, y, no_sync=True, **kw)
    loud = ddp_accumulated_grad(model_fn, mse_loss, x, y, no_sync=False, **kw)
    return DataParallelReport(sizes, quiet.allreduce_calls, loud.allreduce_calls,
                              compare_grads(ref, quiet.grad), quiet.ranks_agree and loud.ranks_agree)


def draw_report(report: DataParallelReport) -> object:
    """Left: who computes which examples (W ranks x K micro-steps of B). Right: all-reduces per update."""
    from matplotlib.patches import Rectangle

    from helpers.core import plots

    s = report.sizes
    fig, (left, right) = plots.figure(2, width=9.0, height=3.2)
    colors = ["#4C72B0", "#DD8452", "#55A868", "#8172B2"]
    for r in range(s.world_size):
        for k in range(s.accumulation_steps):
            alpha = 0.3 + 0.6 * (k + 1) / s.accumulation_steps
            color = colors[r % len(colors)]
            left.add_patch(Rectangle((k + 0.05, r + 0.05), 0.9, 0.9, color=color, alpha=alpha))
            if s.accumulation_steps <= 8:
                left.text(k + 0.5, r + 0.5, f"B={s.micro_batch}", ha="center", va="center", fontsize=8)
    left.set_xlim(0, s.accumulation_steps)
    left.set_ylim(s.world_size, 0)
    left.set_xticks([k + 0.5 for k in range(s.accumulation_steps)],  # one tick per micro-step, in its middle
                    [str(k + 1) for k in range(s.accumulation_steps)])
    left.set_yticks([r + 0.5 for r in range(s.world_size)], [f"rank {r}" for r in range(s.world_size)])
    left.set_xlabel(f"micro-step (K = {s.accumulation_steps})")
    left.set_ylabel(f"worker (W = {s.world_size})")
    left.set_title(f"B x K x W = {s.micro_batch} x {s.accumulation_steps} x {s.world_size} = {s.train_batch}")
    left.grid(False)
    labels = ["no_sync on K-1\nmicro-steps", "sync every\nmicro-step"]
    values = [report.calls_no_sync, report.calls_every_step]
    kinds = [no_sync_kind(c, 0.0, report.diff.max_rel) for c in values]  # the colours of section 4's bars
    right.bar(labels, values, color=[NO_SYNC_KINDS[k][0] for k in kinds], edgecolor="#333")
    for i, v in enumerate(values):
        right.annotate(str(v), (i, v), ha="center", va="bottom")
    right.set_ylabel("gradient all-reduces per update")
    right.set_ylim(0, max(values) * 1.25 + 0.5)
    right.set_title(f"vs one process: max_rel {report.diff.max_rel:.1e}")
    return fig


def show_data_parallel(micro_batch: int = 4, accumulation_steps: int = 4, world_size: int = 2,
                       *, width: int = 64) -> None:
    """The widget's work: measure with `data_parallel_report` on the shared pool, print and draw it.

    Args:
        micro_batch, accumulation_steps, world_size: B, K and W.
        width: the lesson model's width.
    """
    from helpers.core import plots

    report = data_parallel_report(micro_batch, accumulation_steps, world_size, width=width)
    s = report.sizes
    match = "matches" if report.diff.max_rel <= 1e-5 else "does NOT match"
    print(f"effective batch B x K x W = {s.micro_batch} x {s.accumulation_steps} x {s.world_size} = "
          f"{s.train_batch} | all-reduces per update: {report.calls_no_sync} with no_sync, "
          f"{report.calls_every_step} without | gradient {match} one process on {s.train_batch} examples "
          f"(max_rel {report.diff.max_rel:.1e}) | ranks agree: {report.ranks_agree}")
    plots.show(draw_report(report))


NO_SYNC_KINDS = {  # what a loop's measurement says, and how its bar is drawn: (colour, hatch)
    "right gradient, 1 all-reduce": ("#55A868", ""),
    "right gradient, but K all-reduces": ("#9AA5B1", ""),
    "BUG: the ranks' gradients differ": ("#C44E52", "//"),
}


def no_sync_kind(calls: int, spread: float, max_rel: float, tolerance: float = 1e-5) -> str:
    """Which of `NO_SYNC_KINDS` a loop is, from what was measured: its all-reduces per update, how far
    the ranks' gradients are apart (`spread`), and its error against one process (`max_rel`)."""
    if spread > tolerance or max_rel > tolerance:
        return "BUG: the ranks' gradients differ"
    return "right gradient, 1 all-reduce" if calls == 1 else "right gradient, but K all-reduces"


def draw_no_sync_bars(rows: dict[str, dict[str, object]], steps: int) -> object:
    """All-reduces per update for each way of writing the micro-step, coloured by what was measured.

    A loop whose ranks disagree is red and hatched, whatever its count, so the buggy
    one-all-reduce bar never reads like the right one.

    Args:
        rows: {mode: {"calls", "spread", "max_rel", ...}} (lesson 07 §4).
        steps: K.

    Returns:
        The figure (not shown).
    """
    from matplotlib.patches import Patch

    from helpers.core import plots

    k = positive_int("steps", steps)
    fig, (ax,) = plots.figure(1, width=10.0, height=3.2)
    modes = list(rows)
    for i, mode in enumerate(modes):
        r = rows[mode]
        color, hatch = NO_SYNC_KINDS[no_sync_kind(int(r["calls"]), float(r["spread"]), float(r["max_rel"]))]
        ax.bar(i, int(r["calls"]), color=color, hatch=hatch, edgecolor="#333", width=0.6)
    ax.set_xticks(range(len(modes)), [m.replace("_", " ") for m in modes], fontsize=9)
    ax.axhline(k, color="#555", ls=":", lw=1)
    ax.set_ylim(0, k * 1.15 + 0.5)
    ax.set_ylabel(f"all-reduces per update (K = {k})", fontsize=9)
    ax.set_title("Gradient all-reduces per update, counted by a DDP communication hook")
    handles = [Patch(facecolor=c, hatch=h, edgecolor="#333", label=name)
               for name, (c, h) in NO_SYNC_KINDS.items()]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)
    return fig


PEAK_COLORS = {"sharded_state": "#A6B4CF", "gathered_parameters": "#C44E52",
               "unsharded_gradients": "#CCB974", "activations": "#DD8452", "other": "#999999"}


def draw_fsdp_memory(state: dict[str, int], persistent: dict[str, int], peak: FSDPStepMemory,
                     held: dict[str, list[int]], world_size: int) -> object:
    """Left: per rank, DDP's state, FSDP's persistent state and FSDP's peak, with the 1/W line.

    Right: gradient bytes kept after each micro-step, with sync every micro-step and with sync off.

    Args:
        state, persistent: bytes by category (parameters, gradients, optimizer_state), under
            DDP and under FSDP.
        peak: rank 0's `fsdp_step_memory`.
        held: {"sync_every_step": [...], "sync_off": [...]} gradient bytes after each micro-step.
        world_size: W.

    Returns:
        The figure (not shown).
    """
    from helpers.core import plots

    w = positive_int("world_size", world_size)
    fig, (left, right) = plots.figure(2, width=12.0, height=3.8)
    unit, size = plots.byte_unit(max(sum(state.values()), peak.peak_bytes))
    bars = [(0, state, plots.COLORS, ""), (1, persistent, plots.COLORS, ""),
            (2, peak.breakdown, PEAK_COLORS, "peak: ")]
    for x, parts, colors, prefix in bars:
        bottom = 0.0
        for name, value in parts.items():
            if value:
                label = f"{prefix}{name.replace('_', ' ')}" if x != 1 else None
                left.bar(x, value / size, bottom=bottom, color=colors.get(name), label=label, width=0.6)
                bottom += value / size
    left.axhline(sum(state.values()) / w / size, color="black", ls="--", lw=1.2, label=f"1/{w} of the state")
    left.set_xticks([0, 1, 2], ["DDP:\nstate", "FSDP:\npersistent", "FSDP:\npeak"])
    left.set_ylabel(unit)
    left.set_title(f"Per rank (rank 0 of {w})")
    left.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)  # in the gap, beside the bars
    labels = {"sync_every_step": "sync every micro-step", "sync_off": "sync off until the last"}
    g_unit, g_size = plots.byte_unit(max((b for v in held.values() for b in v), default=1))
    for mode, values in held.items():
        right.plot(range(1, len(values) + 1), [b / g_size for b in values], marker="o",
                   label=labels.get(mode, mode))
    right.set_xticks(range(1, max(map(len, held.values()), default=0) + 1))  # whole micro-steps only
    right.set_ylim(bottom=0)  # from zero: the gap between the lines is W-fold, not exaggerated
    right.set_xlabel("after micro-step")
    right.set_ylabel(f"gradient {g_unit} held (rank 0)")
    right.set_title("Gradients kept between micro-steps")
    right.legend(loc="lower center")  # below both lines: the synced one sits at 1/W of the other
    return fig


def _mlp_params(width: int) -> int:
    per_block = 2 * width + (width * 4 * width + 4 * width) + (4 * width * width + width)
    return (D_IN * width + width) + DEPTH * per_block + (width * D_OUT + D_OUT)


def predicted_peak_bytes(scale: str) -> int:
    """Predicted peak of the lesson's largest experiment at `scale`, summed over the W processes.

    Per process: the fp32 model with gradients and Adam's two moments (16 bytes
    per parameter, the figure lesson 01 measures) plus the activations of one
    micro-batch (4 bytes x depth x 11 x width per example: LayerNorm, fc1, GELU
    and fc2 outputs of each block). The experiments are small at every scale:
    this lesson is about communication, not memory.
    """
    from helpers.core.device import SCALES

    sizes = lesson_sizes(choice("scale", scale, SCALES))
    w = sizes.width
    per_process = 16 * _mlp_params(w) + 4 * sizes.micro_batch * DEPTH * 11 * w
    return sizes.workers * per_process


def widget_latency_cases(scale: str, device: torch.device) -> dict[str, Callable[[], object]]:
    """One callable per slider move of the lesson's widget (B, K and W), on the shared worker pool.

    The target for this lesson is 2 s per move, not 1 s: every move runs two
    real DDP updates (with and without `no_sync`) across worker processes.
    Building the cases starts the pool (process start-up is paid once, here).
    """
    sizes = lesson_sizes(scale)
    b, k, w, width = sizes.micro_batch, sizes.steps, sizes.workers, sizes.width
    shared_pool(max(w, max_workers()))

    def move(bb: int, kk: int, ww: int) -> Callable[[], object]:
        return lambda: show_data_parallel(bb, kk, ww, width=width)

    return {
        f"B={b * 2}": move(b * 2, k, w), "B=1": move(1, k, w),
        "K=1": move(b, 1, w), f"K={k * 2}": move(b, k * 2, w),
        "W=1": move(b, k, 1), f"W={max_workers()}": move(b, k, max_workers()),
    }


def check_exercise_1(answer: object) -> str:
    """Exercise 1: train batch 1024 on 16 GPUs with micro-batch 8: how many accumulation steps?"""
    right = check_batch_sizes(1024, 8, None, 16).accumulation_steps
    if answer == right:
        return f"Correct: 1024 / (8 x 16) = {right} accumulation steps."
    return ("Not yet: the train batch is B x K x W. Divide 1024 by the micro-batch and by the number "
            "of GPUs (check_batch_sizes(1024, 8, None, 16) does it for you).")


def check_exercise_2(answer: object) -> str:
    """Exercise 2: flag set after the forward, K = 8: (all-reduces per update, micro-step that syncs)?"""
    if isinstance(answer, tuple) and len(answer) == 2 and tuple(answer) == (1, 0):
        return ("Correct: one all-reduce, on micro-step 0 (its forward ran while the flag was still True "
                "from the previous update); micro-steps 1-7 stay local, so the ranks disagree.")
    return ("Not yet: answer a tuple (count, micro_step). DDP decides at the *forward* whether the next "
            "backward all-reduces. Which forwards run while require_backward_grad_sync is True?")


def check_exercise_3(answer: object) -> str:
    """Exercise 3: 1 GB of fp32 weights, Adam, FSDP over W=4: GB of persistent state per rank?"""
    if isinstance(answer, int | float) and not isinstance(answer, bool) and abs(answer - 1.0) <= 0.05:
        return ("Correct: weights 1 + gradients 1 + Adam's two moments 2 = 4 GB, and FSDP keeps a quarter "
                "of each on each of 4 ranks: 1 GB between steps. That is not the peak: during a step a rank "
                "also holds the root's weights, the gathered unit (and the next one) and a unit's full "
                "gradients before the reduce-scatter. Accumulating with sync off adds the unsharded "
                "gradients (1 GB more) between micro-steps.")
    return ("Not yet: count weights, gradients and Adam's two moments (each the size of the weights), "
            "then divide by the number of ranks, as the FSDP section measured.")
