"""Repository hygiene: clean notebooks, matching environments, CI wiring, README map."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _code_cells(path: Path) -> list[dict]:
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def _src(cell: dict) -> str:
    return "".join(cell["source"])


def test_there_are_notebooks() -> None:
    assert NOTEBOOKS, "no lesson notebooks found"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_committed_without_outputs(path: Path) -> None:
    dirty = [i for i, c in enumerate(_code_cells(path)) if c.get("outputs") or c.get("execution_count")]
    assert not dirty, f"{path.name}: code cells {dirty} have outputs; clear them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_anatomy(path: Path) -> None:
    cells = _code_cells(path)
    setup = _src(cells[0])
    assert '"google.colab" in sys.modules' in setup and "setup_lesson(" in setup, "first cell is the setup"
    checks = [c for c in cells if re.search(r"^\s*assert ", _src(c), re.M)]
    assert len(checks) >= 2, "each claim needs a check cell with an assertion"
    for c in checks:
        assert "Check passed" in _src(c), f"check cell must print 'Check passed: ...':\n{_src(c)[:200]}"
    text = "\n".join(_src(c) for c in cells)
    assert "plt.show(" not in text, "use helpers.plots.show(fig), which also closes the figure"
    assert "use_reentrant=True" not in text
    assert "interact" in text, "each lesson has an Explore widget"


def _call_args(text: str, start: int) -> str:
    """The argument text of the call whose '(' ends just before `start`."""
    depth = 1
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i]
    return text[start:]


def test_every_checkpoint_call_is_non_reentrant() -> None:
    sources = [p.read_text() for p in (ROOT / "helpers").glob("*.py")]
    sources += ["\n".join(_src(c) for c in _code_cells(nb)) for nb in NOTEBOOKS]
    for text in sources:
        for call in re.finditer(r"(?<!def )\bcheckpoint(?:_sequential)?\(", text):
            args = _call_args(text, call.end())
            if args.strip():
                assert "use_reentrant=False" in args or "**" in args, f"needs use_reentrant=False: {args}"


def _names(reqs: list[str]) -> dict[str, str]:
    return {re.split(r"[<>=!~ ]", r, maxsplit=1)[0].lower(): r.replace(" ", "") for r in reqs}


def test_environment_yml_matches_pyproject() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = _names(project["dependencies"] + project["optional-dependencies"]["dev"])
    env = (ROOT / "environment.yml").read_text()
    pip_section = env.split("- pip:", 1)[1]
    listed = _names(re.findall(r"^\s+- ([A-Za-z][^\s#]*)\s*$", pip_section, re.M))
    assert listed == wanted
    assert "- -e .[dev]" in env


def test_ci_calls_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "make lab" in readme and "make test" in readme
    assert re.search(r"^make test$", (ROOT / ".ci" / "run").read_text(), re.M)


def test_torch_is_a_range_and_ci_pins_the_cpu_wheel() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "torch>=2.4" in deps
    assert re.search(r"^torch==\d", (ROOT / "constraints" / "cpu.txt").read_text(), re.M)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_readme_lesson_map_lists_notebook(path: Path) -> None:
    assert f"notebooks/{path.name}" in (ROOT / "README.md").read_text()
