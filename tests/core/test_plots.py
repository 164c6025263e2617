"""helpers.core.plots (core): the style is applied on request only, byte units, phase runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import pytest

from helpers.core import plot_layout, plots, units

ROOT = Path(__file__).resolve().parents[2]

# Imports every helpers module in a fresh interpreter; prints what changed in matplotlib's
# rcParams and whether torch's global RNG moved.
_PROBE = """
import importlib, json, pkgutil, sys
import matplotlib, matplotlib.pyplot, torch
import helpers
before = dict(matplotlib.rcParams)
rng = torch.random.get_rng_state()
names = sorted(m.name for m in pkgutil.walk_packages(helpers.__path__, "helpers."))
for name in names:
    importlib.import_module(name)
changed = sorted(k for k, v in matplotlib.rcParams.items() if before.get(k) != v)
print(json.dumps({"modules": names, "changed": changed,
                  "rng_moved": not torch.equal(rng, torch.random.get_rng_state())}))
"""


def test_importing_helpers_changes_no_global_state() -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True,
                         check=True, env={**os.environ, "MPLBACKEND": "Agg"})
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert "helpers.core.plots" in result["modules"] and "helpers.lessons.lesson01" in result["modules"]
    assert result["changed"] == [], f"importing helpers changed rcParams: {result['changed']}"
    assert not result["rng_moved"], "importing helpers moved torch's global RNG"


def test_use_style_applies_the_house_style() -> None:
    with matplotlib.rc_context():  # restores rcParams after the test
        plots.use_style()
        for key, value in plots.STYLE.items():
            expected = list(value) if isinstance(value, tuple) else value
            assert matplotlib.rcParams[key] == expected, key


def test_format_bytes_and_units() -> None:
    assert units.format_bytes(512) == "512 B"
    assert units.format_bytes(3 * 2**20) == "3.0 MiB"
    assert units.format_bytes(-2**30) == "-1.0 GiB"
    assert plots.byte_unit(5 * 2**10) == ("KiB", 2**10)
    assert plots.byte_unit(10) == ("B", 1)
    # one unit per column, the largest value's: never "1.0 MiB" beside "1003.8 KiB"
    assert plots.byte_column([264.8 * 2**10, 1059 * 2**10]) == ["0.259 MiB", "1.03 MiB"]
    assert plots.byte_column([1003.8 * 2**10, 12.5 * 2**10, 0]) == ["1003.8 KiB", "12.5 KiB", "0 KiB"]
    assert plots.byte_column([1000, 8]) == ["1000 B", "8 B"]
    assert plots.byte_column([132.4 * 2**10], unit_of=2**20) == ["0.129 MiB"]
    with pytest.raises(ValueError, match="empty"):
        plots.byte_column([])
    assert units.format_flops(469_762_048) == "469.76 MFLOP" and units.format_flops(3.69e9) == "3.69 GFLOP"
    assert units.format_flops(12) == "12 FLOP" and units.format_flops(-2e12) == "-2.00 TFLOP"


def test_phase_runs_merge_stray_ops() -> None:
    phases = ["start"] + ["forward"] * 5 + ["backward"] * 6 + ["forward"] + ["optimizer"] * 4 + ["forward"]
    expected = [(0, 0, "start"), (1, 5, "forward"), (6, 12, "backward"), (13, 17, "optimizer")]
    assert plots.phase_runs(phases) == expected
    assert plots.phase_runs([]) == []


def test_stacked_bars_and_timeline_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    fig, (left, right) = plots.figure(2)
    plots.stacked_bars(left, {"a": {"parameters": 2**20, "activations": 2**21}}, budget=2**22)
    assert left.get_ylabel() == "MiB"
    plots.timeline(right, {"activations": [0, 2**10, 0]}, ["forward", "forward", "backward"])
    assert right.get_ylabel() == "live KiB"
    with pytest.raises(ValueError, match="breakdowns is empty"):
        plots.stacked_bars(left, {})
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj))
    plots.show(fig)
    assert len(shown) == 1 and not plt.fignum_exists(fig.number)  # displayed once, then closed


def _fig(width: float = 7.5, height: float = 3.6) -> tuple[plt.Figure, plt.Axes]:
    plots.use_style()
    fig, ax = plt.subplots(figsize=(width, height))
    return fig, ax


def test_show_raises_on_a_clipped_figure_only_under_strict(monkeypatch: pytest.MonkeyPatch) -> None:
    def clipped() -> plt.Figure:
        fig, ax = _fig(2, 1.5)
        ax.set_title("a title far too long for a figure two inches wide")
        return fig

    monkeypatch.setenv("LESSONS_STRICT", "1")
    with pytest.raises(ValueError, match="reads badly"):
        plots.show(clipped())
    monkeypatch.delenv("LESSONS_STRICT")
    fig = clipped()
    plots.show(fig)  # outside CI the learner still sees the figure
    assert not plt.fignum_exists(fig.number)


def test_plain_ticks_writes_log_ticks_as_plain_numbers() -> None:
    fig, (ax, lin) = plots.figure(2)
    ax.plot([1, 2, 4, 8, 16, 32], [1e-3, 1e-2, 0.1, 1, 10, 100], "o")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    lin.plot([1, 2], [1, 2])
    assert any("power" in p for p in plot_layout.layout_problems(fig))  # matplotlib's default: 2^{n}, 10^{n}
    plots.plain_ticks(ax)
    plots.plain_ticks(lin)  # a linear axis is left alone
    fig.tight_layout()
    assert not [p for p in plot_layout.layout_problems(fig) if "power" in p]
    assert [t.get_text() for t in plot_layout._drawn_ticks(ax.xaxis)] == ["1", "2", "4", "8", "16", "32"]  # noqa: SLF001
    assert "0.01" in [t.get_text() for t in plot_layout._drawn_ticks(ax.yaxis)]  # noqa: SLF001
    with pytest.raises(ValueError, match="axis"):
        plots.plain_ticks(ax, "z")
    plt.close(fig)
