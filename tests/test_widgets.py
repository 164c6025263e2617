"""Every lesson widget answers a slider move in at most 1 s at the CPU (`small`) scale.

Lesson helper modules define `widget_latency_cases(scale, device)`, which returns one
zero-argument callable per control value ("B=2", "K=8", "checkpoint on", ...). Each
case is called once to warm up, then a second call is timed (see scripts/widget_latency.py).
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import matplotlib
import pytest
import torch

from helpers.device import seed_everything

matplotlib.use("Agg")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import widget_latency as widgets  # noqa: E402 - the latency harness lives in scripts/, not in the package

# How many helper modules must provide widget_latency_cases (the lessons 01-05 ones:
# budget, checkpointing, accumulation_lab, pitfalls, tokens). Raise it as lessons are added.
MIN_WIDGET_MODULES = 5
SCALE = "small"
CPU = torch.device("cpu")


def _collect() -> list[tuple[str, str, Callable[[], object] | Exception]]:
    """(module, case, callable) for every case; a module whose builder raises gives one error entry."""
    entries: list[tuple[str, str, Callable[[], object] | Exception]] = []
    for module, builder in widgets.discover_widget_cases().items():
        seed_everything(0)
        try:
            cases = widgets.build_cases(builder, SCALE, CPU)
        except Exception as exc:  # noqa: BLE001 - reported by the test, not at collection
            entries.append((module, "<build>", exc))
            continue
        entries.extend((module, case, fn) for case, fn in cases.items())
    return entries


CASES = _collect()


def test_enough_lessons_provide_widget_cases() -> None:
    found = sorted(widgets.discover_widget_cases())
    assert len(found) >= MIN_WIDGET_MODULES, (
        f"only {len(found)} helper module(s) define widgets.{widgets.PROTOCOL}(scale, device): {found}; "
        f"at least {MIN_WIDGET_MODULES} must (every lesson's helper module, see COMMON protocol)"
    )


@pytest.mark.parametrize(("module", "case", "fn"), CASES, ids=[f"{m}:{c}" for m, c, _ in CASES])
def test_widget_move_is_fast(module: str, case: str, fn: Callable[[], object] | Exception) -> None:
    if isinstance(fn, Exception):
        raise AssertionError(f"{module}.{widgets.PROTOCOL}({SCALE!r}, cpu) raised: {fn!r}") from fn
    seconds = widgets.time_case(fn, CPU, retries=2)  # best of up to 3 timed moves: one slow call can be noise
    assert seconds <= widgets.LIMIT_S, (
        f"{module}:{case} took {seconds:.2f} s for one move at scale {SCALE!r} on CPU "
        f"(limit {widgets.LIMIT_S} s; best of the timed calls after one warm-up)"
    )


# --- the discovery and timing machinery itself, on a fake package -------------------------------


@pytest.fixture()
def fake_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    pkg = tmp_path / "fakelessons"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "with_cases.py").write_text(textwrap.dedent('''
        """A lesson module with two widget cases."""
        import matplotlib.pyplot as plt
        from IPython.display import display

        CALLS = []

        def widget_latency_cases(scale, device):
            def draw():
                CALLS.append(scale)
                fig, ax = plt.subplots()
                ax.plot([1, 2])
                display("drawn")
                print("printed")
            return {"B=2": draw, "K=8": lambda: CALLS.append("K")}
    '''))
    (pkg / "without_cases.py").write_text("X = 1\n")
    (pkg / "broken.py").write_text("def widget_latency_cases(scale, device):\n    return {}\n")
    (pkg / "_private.py").write_text("def widget_latency_cases(scale, device):\n    return {'a': print}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "fakelessons"
    for name in [n for n in sys.modules if n == "fakelessons" or n.startswith("fakelessons.")]:
        del sys.modules[name]


def test_discovery_finds_only_modules_with_the_protocol(fake_package: str) -> None:
    found = widgets.discover_widget_cases(fake_package)
    assert sorted(found) == ["broken", "with_cases"]
    cases = widgets.build_cases(found["with_cases"], "small", CPU)
    assert sorted(cases) == ["B=2", "K=8"]
    with pytest.raises(ValueError, match="non-empty dict"):
        widgets.build_cases(found["broken"], "small", CPU)
    with pytest.raises(ValueError, match="not a scale"):
        widgets.build_cases(found["with_cases"], "huge", CPU)


def test_timing_warms_up_captures_output_and_closes_figures(
    fake_package: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import matplotlib.pyplot as plt

    module = importlib.import_module(f"{fake_package}.with_cases")
    fn = widgets.build_cases(module.widget_latency_cases, "small", CPU)["B=2"]
    seconds = widgets.time_case(fn, CPU)
    assert 0 <= seconds < widgets.LIMIT_S
    assert module.CALLS == ["small", "small"]  # one warm-up, one timed call
    assert plt.get_fignums() == []
    assert "printed" not in capsys.readouterr().out


def test_time_all_cases_reports_failures_and_the_slowest(fake_package: str) -> None:
    timings = widgets.time_all_cases("small", CPU, package=fake_package)
    names = {t.name: t for t in timings}
    assert set(names) == {"broken:<build>", "with_cases:B=2", "with_cases:K=8"}
    assert names["broken:<build>"].seconds is None and "non-empty dict" in names["broken:<build>"].error
    table = widgets.latency_table(timings)
    assert "slowest widget: with_cases:" in table and "FAILED" in table
    assert "no helper module" in widgets.latency_table([])


def test_discovery_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="non-empty module name"):
        widgets.discover_widget_cases("")
    with pytest.raises(ValueError, match="is a module, not a package"):
        widgets.discover_widget_cases("helpers.device")
    with pytest.raises(TypeError, match="callable"):
        widgets.time_case(42, CPU)  # type: ignore[arg-type]


# --- issue 10 part 4: without a browser (nbval, nbconvert), a widget renders once and never waits ---------


def test_widgets_render_once_without_a_frontend(tmp_path: Path) -> None:
    """A kernel with no frontend attached runs interact() once with the defaults and returns at once.

    This is the situation under nbval in `make test`: nothing answers the widget comms, so a widget
    that waited for the frontend would hang the cell (nbval's cell timeout would then fail it).
    """
    import nbformat
    from nbclient import NotebookClient

    code = textwrap.dedent('''
        from ipywidgets import Checkbox, Dropdown, FloatSlider, IntSlider, SelectionSlider, interact

        def move(micro_batch, steps, spread, optimizer, checkpoint):
            print(f"effective batch B x K = {micro_batch * steps}", spread, optimizer, checkpoint)

        interact(move,
                 micro_batch=IntSlider(4, 1, 32, continuous_update=False, description="micro-batch size (B)",
                                       style={"description_width": "initial"}),
                 steps=SelectionSlider(options=[1, 2, 4, 8], value=8, continuous_update=False,
                                       description="accumulation steps (K)"),
                 spread=FloatSlider(0.5, min=0.0, max=1.0, continuous_update=False),
                 optimizer=Dropdown(options=["adam", "sgd"], value="sgd"),
                 checkpoint=Checkbox(True));
    ''')
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    client = NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = list(nb.cells[0].outputs)
    # What the function printed went to the interact's Output widget, recorded in the widget state.
    states = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    for model in states.get("state", {}).values():
        outputs += model.get("state", {}).get("outputs", [])
    texts = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert texts.count("effective batch B x K = 32") == 1, outputs
    assert not [o for o in outputs if o.get("output_type") == "error" or o.get("name") == "stderr"], outputs
    views = [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert len(views) == 1, "interact() displays one widget view"
