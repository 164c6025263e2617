"""Whether a figure reads well, as it will be saved (core, every lesson's figures).

`layout_problems(fig)` names, one plain sentence each, what reads badly: text cut by the
canvas edge, tick labels that run into each other or are written as powers, text smaller than
`MIN_FONT_PT`, a legend drawn over bars or points. `helpers.core.plots.show` raises on any of them
under `LESSONS_STRICT=1` (CI), so a clipped title cannot land unnoticed.
"""

from __future__ import annotations

from matplotlib.axes import Axes
from matplotlib.figure import Figure

__all__ = ["MIN_FONT_PT", "layout_problems"]

MIN_FONT_PT = 8.0  # smaller text does not read at the lessons' figure size (90 dpi, 7.5 in wide)


def _texts(fig: Figure) -> list[tuple[str, object]]:
    """Every visible, non-empty text of `fig` with a name saying where it is."""
    found: list[tuple[str, object]] = [("figure text", t) for t in fig.texts]
    if fig._suptitle is not None:  # noqa: SLF001 - matplotlib keeps the suptitle here
        found.append(("suptitle", fig._suptitle))  # noqa: SLF001
    for i, ax in enumerate(fig.axes):
        where = f"axes {i}"
        found += [(f"{where} title", t) for t in (ax.title, ax._left_title, ax._right_title)]  # noqa: SLF001
        found += [(f"{where} x label", ax.xaxis.label), (f"{where} y label", ax.yaxis.label)]
        found += [(f"{where} x tick", t) for t in _drawn_ticks(ax.xaxis)]
        found += [(f"{where} y tick", t) for t in _drawn_ticks(ax.yaxis)]
        found += [(f"{where} text", t) for t in ax.texts]
        legend = ax.get_legend()
        if legend is not None:
            found += [(f"{where} legend", t) for t in legend.get_texts()]
    return [(name, t) for name, t in found if t.get_visible() and t.get_text().strip()]  # type: ignore[attr-defined]


def _drawn_ticks(axis: object) -> list[object]:
    """The major tick labels of `axis` that matplotlib draws (inside the view limits)."""
    low, high = sorted(axis.get_view_interval())  # type: ignore[attr-defined]
    span = (high - low) * 1e-9
    labels = axis.get_ticklabels()  # type: ignore[attr-defined]
    locs = axis.get_ticklocs()  # type: ignore[attr-defined]
    return [t for t, loc in zip(labels, locs, strict=False) if low - span <= loc <= high + span]


def _in_view(ax: Axes, x: float, y: float) -> bool:
    x0, x1 = sorted(ax.get_xlim())
    y0, y1 = sorted(ax.get_ylim())
    return x0 <= x <= x1 and y0 <= y <= y1


def _legend_covers_data(ax: Axes, renderer: object) -> bool:
    """True when `ax`'s legend, drawn inside the axes, lies over a bar or a plotted point."""
    from matplotlib.patches import Rectangle

    legend = ax.get_legend()
    if legend is None or not legend.get_visible():
        return False
    box = legend.get_window_extent(renderer).shrunk(0.96, 0.96)  # type: ignore[arg-type]
    if not box.overlaps(ax.bbox):
        return False  # placed outside the axes
    for patch in ax.patches:
        drawn = isinstance(patch, Rectangle) and patch.get_visible() and patch.get_height() != 0
        if drawn and box.overlaps(patch.get_window_extent(renderer)):  # type: ignore[arg-type]
            return True
    for line in ax.get_lines():
        if not line.get_visible() or line.get_label().startswith("_"):
            continue
        xs, ys = line.get_xdata(), line.get_ydata()
        points = [(float(x), float(y)) for x, y in zip(xs, ys, strict=False)  # type: ignore[arg-type]
                  if _in_view(ax, float(x), float(y))]
        for px, py in ax.transData.transform(points) if points else []:
            if box.contains(px, py):
                return True
    return False


def layout_problems(fig: Figure) -> list[str]:
    """What reads badly in `fig` as it will be saved: one plain sentence per problem.

    Looks for text cut by the canvas edge (titles, labels, tick labels, legends), tick labels
    that run into each other, tick labels written as powers (``2^{3}``, ``6x10^{0}``), text
    smaller than `MIN_FONT_PT`, and a legend drawn over bars or plotted points.

    Args:
        fig: a figure, laid out as it will be saved (`show` calls `tight_layout` first).

    Returns:
        The problems found; empty when the figure reads well.
    """
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    canvas = fig.bbox
    problems: list[str] = []
    for name, text in _texts(fig):
        label = text.get_text()  # type: ignore[attr-defined]
        box = text.get_window_extent(renderer)  # type: ignore[attr-defined]
        if not canvas.padded(1).contains(box.x0, box.y0) or not canvas.padded(1).contains(box.x1, box.y1):
            problems.append(f"{name} {label!r} is cut by the figure's edge")
        if text.get_fontsize() < MIN_FONT_PT:  # type: ignore[attr-defined]
            problems.append(f"{name} {label!r} is {text.get_fontsize():.0f} pt (under {MIN_FONT_PT:.0f} pt)")  # type: ignore[attr-defined]
        if "tick" in name and "^{" in label:
            problems.append(f"{name} {label!r} is written as a power: use plain numbers")
    for i, ax in enumerate(fig.axes):
        for axis_name, ticks in (("x", _drawn_ticks(ax.xaxis)), ("y", _drawn_ticks(ax.yaxis))):
            boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in ticks
                     if t.get_visible() and t.get_text().strip()]
            for (a, box_a), (b, box_b) in zip(boxes, boxes[1:], strict=False):
                if box_a.shrunk(0.98, 0.98).overlaps(box_b.shrunk(0.98, 0.98)):
                    problems.append(f"axes {i} {axis_name} tick labels {a!r} and {b!r} overlap")
        if _legend_covers_data(ax, renderer):
            problems.append(f"axes {i} legend covers bars or points: move it outside or to a free corner")
    return problems
