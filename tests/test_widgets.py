"""Every lesson widget answers every slider move at the CPU (`small`) scale, and none hangs.

Lesson modules (`helpers/lessons/lessonNN.py`) define `widget_latency_cases(scale, device)`, which
returns one zero-argument callable per control value ("B=2", "K=8", "checkpoint on", ...). Each
case is called once here, with a generous limit that only a hang would pass: how long a move takes
is a benchmark figure (`make bench`, scripts/widget_latency.py), not a test, because timed asserts
go red under load on a shared machine. The cases are built inside the tests, never at collection,
so `pytest -m cuda` and friends do not pay for them.
"""

from __future__ import annotations

import contextlib
import importlib
import signal
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import matplotlib
import pytest
import torch

from helpers.core.device import seed_everything

matplotlib.use("Agg")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import widget_latency as widgets  # noqa: E402 - the latency harness lives in scripts/, not in the package

SCALE = "small"
CPU = torch.device("cpu")
HANG_S = 30.0  # one move at `small` takes about a second on an idle 2-core CPU; 30 s is a hang
# Every lesson module backs widgets: the expected set is every helpers/lessons/lessonNN.py (glob, no import).
LESSONS = sorted(p.stem for p in (ROOT / "helpers" / "lessons").glob("lesson[0-9][0-9].py"))


def test_every_lesson_module_provides_widget_cases() -> None:
    assert LESSONS, "no helpers/lessons/lessonNN.py found"
    found = sorted(widgets.discover_widget_cases())
    missing, extra = sorted(set(LESSONS) - set(found)), sorted(set(found) - set(LESSONS))
    assert found == LESSONS, f"lesson modules without {widgets.PROTOCOL}: {missing}; found in others: {extra}"


@pytest.mark.slow  # about a minute at `small`: `make test`; the lessons' own tests move every slider at tiny
@pytest.mark.parametrize("lesson", LESSONS)
def test_every_widget_move_answers_without_hanging(lesson: str) -> None:
    seed_everything(0)
    builder = getattr(importlib.import_module(f"helpers.lessons.{lesson}"), widgets.PROTOCOL)
    cases = widgets.build_cases(builder, SCALE, CPU)
    for case, fn in cases.items():
        with _deadline(HANG_S, f"{lesson}:{case} at scale {SCALE!r} on CPU"):
            widgets.time_case(fn, CPU, warmup=False)


@contextlib.contextmanager
def _deadline(seconds: float, what: str) -> Iterator[None]:
    """Raise TimeoutError in the block if it runs past `seconds` (SIGALRM: the main thread only)."""
    def expired(*_: object) -> None:
        raise TimeoutError(f"{what} did not answer within {seconds:g} s: the widget hangs")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_the_deadline_stops_a_hang() -> None:
    with pytest.raises(TimeoutError, match="hangs"), _deadline(0.2, "a sleeping move"):
        time.sleep(5)


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
    found = widgets.discover_widget_cases(fake_package)  # any package: the default is helpers.lessons
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
    widgets.time_case(fn, CPU, warmup=False)
    assert module.CALLS == ["small"] * 3  # the hang guard's single call
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


@pytest.mark.slow  # executes every widget cell in a kernel (6 s): make test
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
