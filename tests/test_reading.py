"""Every lesson has a short core path and folds the rest under one collapsed "Going deeper" heading.

Issue 24: a careful reader gets through a lesson's core path in 20 minutes, which bounds its
markdown at `MAX_CORE_WORDS`. The core path is every markdown cell except the "Going deeper" part:
the markdown cell whose heading is "## Going deeper" and every cell after it up to the next "## "
heading (its subsections are "###" headings). That cell carries JupyterLab's
`jp-MarkdownHeadingCollapsed` metadata, so the part opens folded. Run with `-s` to see the counts.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))
MAX_CORE_WORDS = 1800
GOING_DEEPER = "## Going deeper"
COLLAPSED = "jp-MarkdownHeadingCollapsed"
_WORD = re.compile(r"\S*[A-Za-z0-9]\S*")  # a whitespace-separated token with a letter or digit


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _source(cell: dict) -> str:
    return "".join(cell["source"])


def _h2(cell: dict) -> str | None:
    """The first level-2 heading line of a markdown cell, or None."""
    if cell["cell_type"] != "markdown":
        return None
    return next((line.strip() for line in _source(cell).splitlines() if line.startswith("## ")), None)


def words(text: str) -> int:
    """Words of `text`: whitespace-separated tokens holding a letter or digit (table rules and
    bullets are not words; inline code and numbers are)."""
    return len(_WORD.findall(text))


def split_path(cells: list[dict]) -> tuple[list[dict], list[dict]]:
    """(core markdown cells, Going deeper cells of any type), in order."""
    core: list[dict] = []
    deeper: list[dict] = []
    inside = False
    for cell in cells:
        heading = _h2(cell)
        if heading is not None:
            inside = heading.startswith(GOING_DEEPER)
        if inside:
            deeper.append(cell)
        elif cell["cell_type"] == "markdown":
            core.append(cell)
    return core, deeper


def core_words(path: Path) -> int:
    """Markdown words of `path`'s core path."""
    core, _ = split_path(_cells(path))
    return sum(words(_source(c)) for c in core)


def lesson_number(path: Path) -> int:
    return int(path.name[:2])


def test_the_counter_reads_a_going_deeper_part_and_what_follows_it() -> None:
    def md(text: str, **meta: object) -> dict:
        return {"cell_type": "markdown", "source": [text], "metadata": meta}

    cells = [md("# 01 · Title\n\nfive words in this cell"), md("## Going deeper", **{COLLAPSED: True}),
             md("### 7. Folded\n\nnot counted here"), {"cell_type": "code", "source": ["x = 1"]},
             md("## Summary\n\n| a | b |\n|---|---|\n| 1 | 2 |")]
    core, deeper = split_path(cells)
    assert [_source(c)[:4] for c in core] == ["# 01", "## S"]
    assert len(deeper) == 3 and words("| a | b |\n|---|---|\n- `x` 8 x 4") == 6
    # "01 Title five words in this cell", then "Summary a b 1 2"
    assert sum(words(_source(c)) for c in core) == 7 + 5


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_core_path_reads_in_twenty_minutes(path: Path) -> None:
    core = core_words(path)
    total = sum(words(_source(c)) for c in _cells(path) if c["cell_type"] == "markdown")
    print(f"\n{path.stem}: core path {core} words of markdown ({total} in all)")
    assert core <= MAX_CORE_WORDS, (
        f"{path.name}: the core path holds {core} words of markdown, over {MAX_CORE_WORDS}: "
        f"fold sections under '{GOING_DEEPER}'")


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if lesson_number(p) >= 1],
                         ids=[p.stem for p in NOTEBOOKS if lesson_number(p) >= 1])
def test_going_deeper_is_one_collapsed_heading_with_subsections(path: Path) -> None:
    cells = _cells(path)
    heads = [c for c in cells if (_h2(c) or "").startswith(GOING_DEEPER)]
    assert len(heads) == 1, f"{path.name}: expected one '{GOING_DEEPER}' markdown cell, found {len(heads)}"
    head = heads[0]
    assert head.get("metadata", {}).get(COLLAPSED) is True, (
        f"{path.name}: the '{GOING_DEEPER}' cell needs metadata {{\"{COLLAPSED}\": true}} to open folded")
    _, deeper = split_path(cells)
    subsections = [c for c in deeper if any(line.startswith("### ") for line in _source(c).splitlines())]
    assert subsections, f"{path.name}: '{GOING_DEEPER}' has no '### ' subsection"
    assert any(c["cell_type"] == "code" for c in deeper), (
        f"{path.name}: '{GOING_DEEPER}' runs no code; its claims stay executed and asserted")
    after = cells[cells.index(head) + len(deeper):]
    assert any(_h2(c) for c in after), (
        f"{path.name}: no '## ' section (e.g. '## Summary') follows '{GOING_DEEPER}'")
