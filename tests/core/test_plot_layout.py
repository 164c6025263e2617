"""helpers.core.plot_layout (core): what reads badly in a figure, found before it is shown."""

from __future__ import annotations

import matplotlib.pyplot as plt

from helpers.core import plots
from helpers.core.plot_layout import layout_problems


def _fig(width: float = 7.5, height: float = 3.6) -> tuple[plt.Figure, plt.Axes]:
    plots.use_style()
    fig, ax = plt.subplots(figsize=(width, height))
    return fig, ax


def test_layout_problems_finds_a_clipped_title_and_passes_a_clean_figure() -> None:
    fig, ax = _fig(3, 2)
    ax.plot([0, 1], [0, 1])
    ax.set_title("a title far too long to fit inside a figure three inches wide")
    fig.tight_layout()
    problems = layout_problems(fig)
    plt.close(fig)
    assert any("title" in p and "cut" in p for p in problems), problems
    fig, ax = _fig()
    ax.plot([0, 1], [0, 1], label="line")
    ax.set_title("fits")
    ax.legend(loc="upper left")
    fig.tight_layout()
    assert layout_problems(fig) == []
    plt.close(fig)


def test_layout_problems_finds_a_legend_over_bars_powers_small_text_and_overlapping_ticks() -> None:
    fig, ax = _fig()
    ax.bar(range(5), [5] * 5, label="bars")
    ax.legend(loc="center")
    fig.tight_layout()
    assert any("legend covers" in p for p in layout_problems(fig))
    plt.close(fig)
    fig, ax = _fig()
    ax.plot([1, 2, 4, 8], [1, 2, 3, 4])
    ax.set_xscale("log", base=2)
    ax.set_ylabel("tiny", fontsize=6)
    fig.tight_layout()
    problems = layout_problems(fig)
    plt.close(fig)
    assert any("power" in p for p in problems) and any("6 pt" in p for p in problems), problems
    fig, ax = _fig(3, 2)
    ax.plot([1, 2, 3], [1, 2, 3])
    ax.set_xticks([1, 2, 3], ["a long label one", "a long label two", "a long label three"])
    problems = layout_problems(fig)
    plt.close(fig)
    assert any("overlap" in p for p in problems), problems
