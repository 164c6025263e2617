"""What a notebook shows, so that a saved notebook reads as well as a live one (core, all lessons).

A saved notebook (GitHub, an exported HTML) has no kernel and no widget state. Three things
otherwise read badly there, and each has one helper here:

- `progress(iterable, desc)`: a progress bar that leaves its final state in the saved output.
  In a notebook it is a text line updated in place through a display handle (`100% 16/16 in
  4.2 s`), never a widget frozen at "0%"; in a terminal it is a plain tqdm bar on stderr.
- `explore(fn, note=..., **controls)`: an `ipywidgets.interactive` widget whose plain-text
  fallback says what it is, after one static call of `fn` with the controls' default values,
  so the saved notebook shows the default state as a figure or table beside the widget.
- `markdown_table(headers, rows)`: a table as Markdown, which wraps, instead of cut text;
  `text_table(rows, header)`: a plain-text table for `print`, its columns padded to their widest cell.

Works with ipywidgets 7.7 (Colab) and 8, and without a browser (nothing waits for a frontend).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

from helpers.core.validate import callable_arg

__all__ = ["explore", "in_notebook", "markdown_table", "progress", "text_table", "widget_bundle"]

T = TypeVar("T")
BAR_WIDTH = 20


def in_notebook() -> bool:
    """True when running in a Jupyter kernel (IPython with a kernel attached)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and getattr(shell, "kernel", None) is not None


def _line(desc: str, done: int, total: int | None, seconds: float) -> str:
    if total:
        filled = round(BAR_WIDTH * done / total)
        bar = "█" * filled + "·" * (BAR_WIDTH - filled)
        return f"{desc}: {bar} {100 * done / total:3.0f}% {done}/{total} in {seconds:.1f} s"
    return f"{desc}: {done} done in {seconds:.1f} s"


def progress(iterable: Iterable[T], desc: str, total: int | None = None) -> Iterator[T]:
    """Iterate over `iterable` with a progress line that a saved notebook keeps in its final state.

    Args:
        iterable: what to iterate over.
        desc: what is being done, e.g. "phase sweep".
        total: the number of items, when `len(iterable)` does not give it.

    Yields:
        The items of `iterable`, in order.
    """
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    if not in_notebook():
        from tqdm.auto import tqdm

        yield from tqdm(iterable, desc=desc, total=total)
        return
    from IPython.display import display

    start = time.perf_counter()
    handle = display({"text/plain": _line(desc, 0, total, 0.0)}, raw=True, display_id=True)
    last, done = start, 0
    for item in iterable:
        yield item
        done += 1
        now = time.perf_counter()
        if now - last >= 0.2 or done == total:  # a few updates a second at most
            handle.update({"text/plain": _line(desc, done, total, now - start)}, raw=True)
            last = now
    handle.update({"text/plain": _line(desc, done, total or done, time.perf_counter() - start)}, raw=True)


def widget_bundle(widget: object, note: str) -> dict[str, object]:
    """The display bundle of `widget` with `note` as its plain-text fallback (ipywidgets 7 and 8)."""
    return {
        "text/plain": note,
        "application/vnd.jupyter.widget-view+json": {
            "version_major": 2, "version_minor": 0, "model_id": widget.model_id},  # type: ignore[attr-defined]
    }


def _shown_value(control: object) -> str:
    """A control's value as the default-state line prints it: a selection's label ("58.2 MiB") when
    it differs from the value (a raw byte count), else the value's repr."""
    value = getattr(control, "value", control)
    label = getattr(control, "label", None)
    if isinstance(label, str) and label != str(value):
        return label
    return repr(value)


def explore(fn: Callable[..., object], /, *, note: str = "", static: bool = True,
            **controls: object) -> object:
    """Show `fn`'s default state, then an interactive widget over `controls`.

    Args:
        fn: the pure function behind the widget (it prints and draws).
        note: what the widget does, for its plain-text fallback (a saved notebook shows this
            line where the live widget would be).
        static: call `fn` once with the controls' default values first, so the saved notebook
            shows that state as an ordinary output. The line above it names each control's
            default (a selection by its label, e.g. "58.2 MiB"); `fixed` values are not controls
            and are left out.
        **controls: the ipywidgets controls (or fixed values), as for `ipywidgets.interactive`.

    Returns:
        The `ipywidgets.interactive` widget.
    """
    callable_arg("fn", fn, "the widget's function")
    from IPython.display import display
    from ipywidgets import fixed, interactive

    widget = interactive(fn, **controls)
    if static:
        defaults = {name: getattr(control, "value", control) for name, control in controls.items()}
        shown = ", ".join(f"{name}={_shown_value(control)}" for name, control in controls.items()
                          if hasattr(control, "value") and not isinstance(control, fixed))
        print(f"Default state ({shown}); the controls below redraw it when you run the notebook:")
        fn(**{name: getattr(value, "value", value) for name, value in defaults.items()})
    text = note or "interactive controls"
    fallback = f"[{text}: run the notebook to use them; the default state is shown above]"
    display(widget_bundle(widget, fallback), raw=True)
    return widget


def _check_cells(headers: Sequence[object], rows: Sequence[Sequence[object]]) -> None:
    if not headers:
        raise ValueError("headers is empty: give one name per column")
    for i, row in enumerate(rows):
        if len(row) != len(headers):
            raise ValueError(f"row {i} has {len(row)} cells for {len(headers)} headers")


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table (pipes in cells escaped) that wraps in a notebook, on GitHub and in HTML.

    Args:
        headers: one name per column.
        rows: one sequence of cells per row, as many as `headers`.

    Returns:
        The table's Markdown text.

    Raises:
        ValueError: if `headers` is empty or a row has the wrong number of cells.
    """
    _check_cells(headers, rows)

    def cell(v: object) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def text_table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    """A plain-text table that reads in a saved notebook: columns padded to their widest cell.

    Args:
        rows: the rows' cells.
        header: the column names.

    Returns:
        The table's text.

    Raises:
        ValueError: if `header` is empty or a row has the wrong number of cells.
    """
    _check_cells(header, rows)
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
