"""helpers.core.display: progress that a saved notebook keeps, widgets with a static default, tables."""

from __future__ import annotations

import pytest

from helpers.core import display


def test_progress_outside_a_notebook_yields_every_item_in_order() -> None:
    assert list(display.progress(range(5), "counting")) == [0, 1, 2, 3, 4]
    assert list(display.progress(iter("abc"), "letters", total=3)) == ["a", "b", "c"]


def test_progress_line_reads_as_finished() -> None:
    line = display._line("sweep", 16, 16, 4.2)
    assert line.startswith("sweep: ") and "100% 16/16 in 4.2 s" in line
    assert "0%" in display._line("sweep", 0, 16, 0.0) and "3 done" in display._line("sweep", 3, None, 1.0)


def test_markdown_table_escapes_pipes_and_checks_widths() -> None:
    table = display.markdown_table(["claim", "value"], [["a | b", 1], ["c\nd", 2.5]])
    assert table.splitlines() == ["| claim | value |", "|---|---|", "| a \\| b | 1 |", "| c d | 2.5 |"]
    with pytest.raises(ValueError, match="row 0 has 1 cells for 2 headers"):
        display.markdown_table(["a", "b"], [[1]])
    with pytest.raises(ValueError, match="headers is empty"):
        display.markdown_table([], [])


def test_explore_shows_the_default_state_then_a_widget_with_a_text_fallback(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from ipywidgets import IntSlider

    shown: list[object] = []
    monkeypatch.setattr("IPython.display.display", lambda obj, **kw: shown.append(obj))
    calls: list[int] = []

    def draw(b: int, label: str) -> None:
        calls.append(b)
        print(f"b={b} {label}")

    widget = display.explore(draw, note="micro-batch size", b=IntSlider(value=4, min=1, max=8), label="x")
    out = capsys.readouterr().out
    assert calls[0] == 4 and "b=4 x" in out and "Default state (b=4)" in out
    bundle = shown[-1]
    assert isinstance(bundle, dict) and "micro-batch size" in bundle["text/plain"]
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == widget.model_id
    with pytest.raises(ValueError, match="fn"):
        display.explore("not callable")  # type: ignore[arg-type]


def test_explore_names_a_selection_by_its_label_and_leaves_fixed_values_out(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from ipywidgets import SelectionSlider, fixed

    monkeypatch.setattr("IPython.display.display", lambda obj, **kw: None)
    budget = SelectionSlider(options=[("48.0 MiB", 50331648), ("58.2 MiB", 60992105)], value=60992105)
    display.explore(lambda budget, lab: None, budget=budget, lab=fixed(object()))
    line = next(t for t in capsys.readouterr().out.splitlines() if "Default state" in t)
    assert line.startswith("Default state (budget=58.2 MiB);"), line
    assert "60992105" not in line and "lab=" not in line


def test_text_table_pads_every_column_to_its_widest_cell() -> None:
    text = display.text_table([("a", 1), ("bbb", 22)], ("name", "n"))
    assert text.splitlines() == ["name  n", "----  --", "a     1", "bbb   22"]
    with pytest.raises(ValueError, match="row 1 has 1 cells for 2 headers"):
        display.text_table([("a", 1), ("b",)], ("name", "n"))
    with pytest.raises(ValueError, match="headers is empty"):
        display.text_table([], ())
