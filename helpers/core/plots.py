"""One house style for every lesson's plots, and byte axes (core, lessons 01-08).

`use_style()` applies the lessons' matplotlib style (`STYLE`); `helpers.lessons.setup.setup_lesson`
calls it, and importing this module changes nothing. Figures are shown with
`show(fig)`, which displays and then closes them, so a rerun cell neither leaks
figures nor warns under a non-interactive backend (`MPLBACKEND=Agg`). Whether a figure reads
well (`layout_problems`, `MIN_FONT_PT`) is checked by `helpers.core.plot_layout`. Sizes as text
(`format_bytes`, `format_flops`) are in `helpers.core.units`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import matplotlib
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from helpers.core.plot_layout import layout_problems
from helpers.core.units import UNITS
from helpers.core.validate import positive_int

if TYPE_CHECKING:
    pass

__all__ = [
    "COLORS", "PHASE_SHADES", "STYLE", "byte_column", "byte_unit", "figure", "phase_runs", "plain_ticks",
    "show", "stacked_bars", "timeline", "use_style",
]

STYLE = {
    "figure.figsize": (7.5, 3.6),
    "figure.dpi": 90,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.titlesize": 11,
    "axes.titleweight": "bold",
    "legend.frameon": False,
    "font.size": 10,
}


def use_style() -> None:
    """Apply the lessons' plot style (`STYLE`) to matplotlib's rcParams, for the whole process.

    `setup_lesson` calls it once per notebook; for a temporary style, use
    `matplotlib.rc_context(STYLE)` instead.
    """
    matplotlib.rcParams.update(STYLE)


COLORS = {
    "parameters": "#4C72B0",
    "gradients": "#55A868",
    "optimizer_state": "#8172B2",
    "activations": "#DD8452",
    "other": "#999999",
}


def byte_unit(max_bytes: float) -> tuple[str, int]:
    """The unit that suits an axis whose largest value is `max_bytes`.

    Args:
        max_bytes: the largest value on the axis, in bytes.

    Returns:
        (name, size in bytes), e.g. ("MiB", 2**20).
    """
    for unit, size in UNITS:
        if max_bytes >= size:
            return unit, size
    return "B", 1


def byte_column(values: Sequence[float], *, unit_of: float | None = None) -> list[str]:
    """One table column of byte counts, all in one unit: the one that suits the largest value.

    So a column never shows "1.0 MiB" beside "1003.8 KiB". Values under 100 of that unit keep
    three significant digits ("0.259 MiB", "12.5 KiB"), larger ones one decimal ("1003.8 KiB").

    Args:
        values: the column's byte counts (at least one).
        unit_of: take the unit that suits this many bytes instead (e.g. the largest of the
            whole table, so that every column reads in one unit).

    Returns:
        One text per value, in order.

    Raises:
        ValueError: if `values` is empty.
    """
    if not values:
        raise ValueError("values is empty: give at least one byte count")
    unit, size = byte_unit(max(abs(v) for v in values) if unit_of is None else abs(unit_of))

    def text(v: float) -> str:
        x = v / size
        if size == 1:
            return f"{int(v)} B"
        return f"{x:.1f} {unit}" if abs(x) >= 100 else f"{x:.3g} {unit}"

    return [text(v) for v in values]


def figure(ncols: int = 1, *, width: float = 7.5, height: float = 3.6) -> tuple[Figure, list[Axes]]:
    """A new figure with `ncols` axes side by side.

    Args:
        ncols: the number of axes (>= 1).
        width, height: the figure's size in inches.

    Returns:
        (figure, list of its axes), a list even for one.
    """
    positive_int("ncols", ncols)
    fig, axes = plt.subplots(1, ncols, figsize=(width, height), squeeze=False)
    return fig, list(axes[0])


def plain_ticks(ax: Axes, axis: str = "both") -> None:
    """Label `ax`'s log-scaled axes with plain numbers ("1, 2, 4, 8", "0.01, 0.1, 1"), not powers.

    Matplotlib writes log ticks as powers (2^3, 10^-2, 6x10^0), which read badly to most learners.
    Call this after plotting: it puts major ticks at the powers of the axis' base (plus 2 and 5
    times them on a base-10 axis spanning at most two decades), labels them with "%g", and drops
    the minor labels. Linear axes are left as they are.

    Args:
        ax: the axes.
        axis: "x", "y" or "both".

    Raises:
        ValueError: for another `axis`.
    """
    import math

    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    if axis not in ("x", "y", "both"):
        raise ValueError(f"axis must be 'x', 'y' or 'both', got {axis!r}")
    for name in ("x", "y") if axis == "both" else (axis,):
        target = ax.xaxis if name == "x" else ax.yaxis
        if target.get_scale() != "log":
            continue
        base = float(getattr(target.get_transform(), "base", 10.0))
        low, high = sorted(ax.get_xlim() if name == "x" else ax.get_ylim())
        decades = math.log10(high / low) if low > 0 else 99.0
        subs = (1.0, 2.0, 5.0) if base == 10.0 and decades <= 2 else (1.0,)
        step = max(1, math.ceil(math.log(high / low, base) / 8)) if low > 0 else 1
        target.set_major_locator(LogLocator(base=base ** step, subs=subs))
        target.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        target.set_minor_formatter(NullFormatter())


def show(fig: Figure) -> None:
    """Display `fig` as a PNG in the notebook, then close it.

    Rendering to PNG ourselves works the same under any backend, including
    `MPLBACKEND=Agg` in CI; closing keeps reruns from piling up figures.

    Args:
        fig: the figure.

    Raises:
        ValueError: under `LESSONS_STRICT=1` (CI), for a figure with `layout_problems`, so a
            clipped title or a legend over the bars cannot land unnoticed.
    """
    import io
    import os

    from IPython.display import Image, display

    try:
        fig.tight_layout()
        if os.environ.get("LESSONS_STRICT") == "1":
            problems = layout_problems(fig)
            if problems:
                raise ValueError("this figure reads badly: " + "; ".join(problems))
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        display(Image(data=buf.getvalue(), format="png"))
    finally:
        plt.close(fig)


def stacked_bars(
    ax: Axes,
    breakdowns: Mapping[str, Mapping[str, float]],
    *,
    budget: float | None = None,
    budget_label: str = "budget",
    title: str = "",
) -> float:
    """One stacked bar per entry of `breakdowns`, in a byte unit that suits the tallest.

    Args:
        ax: the axes.
        breakdowns: {label: {category: bytes}}.
        budget: bytes at which to draw a dashed budget line, if any.
        budget_label: that line's label.
        title: the axes title.

    Returns:
        The bytes in one unit of the y axis, to draw more lines in it.

    Raises:
        ValueError: if `breakdowns` is empty.
    """
    if not breakdowns:
        raise ValueError("breakdowns is empty: give at least one {label: {category: bytes}}")
    peak = max(sum(b.values()) for b in breakdowns.values())
    unit, size = byte_unit(max(peak, budget or 0))
    labels = list(breakdowns)
    bottoms = [0.0] * len(labels)
    categories = list(dict.fromkeys(c for b in breakdowns.values() for c in b))
    for cat in categories:
        values = [breakdowns[label].get(cat, 0) / size for label in labels]
        ax.bar(labels, values, bottom=bottoms, label=cat, color=COLORS.get(cat))
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    if budget is not None:
        ax.axhline(budget / size, color="crimson", ls="--", lw=1.2)
        ax.annotate(budget_label, (1.0, budget / size), xycoords=("axes fraction", "data"),
                    ha="right", va="bottom", color="crimson", fontsize=9)
    ax.set_ylabel(unit)
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return size


PHASE_SHADES = {"forward": "#e4eef8", "backward": "#f6e4e4", "optimizer": "#ebe6f6", "recompute": "#f5f0dc"}


def phase_runs(phases: Sequence[str], min_ops: int = 3) -> list[tuple[int, int, str]]:
    """Contiguous runs (first op, last op, phase) of a timeline's phases.

    A run shorter than `min_ops` ops (e.g. the one profiler-marker op that
    `optimizer.step()` runs before its hooks fire) is merged into the run before it.
    """
    runs: list[list] = []
    for i, phase in enumerate(phases):
        if runs and (runs[-1][2] == phase):
            runs[-1][1] = i
        else:
            runs.append([i, i, phase])
    merged: list[list] = []
    for run in runs:
        if merged and (run[1] - run[0] + 1 < min_ops or run[2] == merged[-1][2]):
            merged[-1][1] = run[1]
        else:
            merged.append(run)
    return [(a, b, p) for a, b, p in merged]


def timeline(ax: Axes, series: Mapping[str, Sequence[float]], phases: Sequence[str] = (),
             *, title: str = "") -> None:
    """Stacked area of live bytes per category against op index, with labelled phase bands.

    Args:
        ax: the axes.
        series: {category: live bytes after each op}, e.g. `Timeline.series`.
        phases: the phase of each op; forward, backward, optimizer and recompute are shaded
            and named at the top of the axes.
        title: the axes title.
    """
    totals = [sum(v) for v in zip(*series.values(), strict=True)]
    unit, size = byte_unit(max(totals) if totals else 0)
    xs = range(len(totals))
    ax.stackplot(xs, *[[v / size for v in vals] for vals in series.values()],
                 labels=list(series), colors=[COLORS.get(k) for k in series], alpha=0.85)
    if totals:
        ax.set_ylim(0, 1.15 * max(totals) / size)  # room for the phase names above the peak
    for first, last, phase in phase_runs(phases, min_ops=max(3, len(phases) // 200)):
        if phase in PHASE_SHADES:
            ax.axvspan(first - 0.5, last + 0.5, color=PHASE_SHADES[phase], zorder=0, lw=0)
            ax.text((first + last) / 2, 0.985, phase, transform=ax.get_xaxis_transform(),
                    ha="center", va="top", fontsize=8, color="#444", fontweight="bold")
    ax.set_xlabel("op index (aten ops, in execution order)")
    ax.set_ylabel(f"live {unit}")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))


