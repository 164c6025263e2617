"""`make check`'s notebook runner (conftest.py, --forked-notebooks) fails where nbval fails: a cell that
raises, a cell that writes to stderr (a print, a warning, a child process), a kernel that dies; and
it runs each notebook in a kernel (`get_ipython().kernel`) in the notebook's folder, with a fresh
interpreter's warning filters, not pytest's."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent

NOTEBOOKS = {
    "passes": ["x = 1\nprint('to stdout is fine')",
               "from helpers.core.display import in_notebook\nimport os\nassert in_notebook() and x == 1\n"
               "assert os.getcwd() == {folder!r}\n%time y = 2"],
    # A kernel's default filters hide a library's DeprecationWarning; pytest's "error" must not leak in.
    "library_deprecation": ["import warnings\n"
                            "warnings.warn_explicit('old', DeprecationWarning, 'lib.py', 1, 'lib')"],
    "raises": ["x = 1", "assert x == 2, 'x is not 2'"],
    "prints_to_stderr": ["import sys\nprint('oops', file=sys.stderr)"],
    "warns": ["import warnings\nwarnings.warn('careful')"],
    "child_writes_to_stderr": ["import os\nos.system('echo from-a-child 1>&2')"],
    "dies": ["import os\nos._exit(3)"],
}


def _notebook(cells: list[str]) -> dict:
    code = [{"cell_type": "code", "metadata": {}, "source": c, "outputs": [], "execution_count": None}
            for c in cells]
    return {"cells": code, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def _runner() -> ModuleType:
    """The repository's conftest.py, loaded as a plain module (its hooks are not registered again)."""
    spec = importlib.util.spec_from_file_location("notebook_runner", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_the_forked_runner_fails_what_nbval_fails(tmp_path: Path) -> None:
    runner = _runner()
    reports = {}
    for name, cells in NOTEBOOKS.items():
        path = tmp_path / f"{name}.ipynb"
        path.write_text(json.dumps(_notebook([c.replace("{folder!r}", repr(str(tmp_path))) for c in cells])))
        reports[name] = runner.run_forked(path, runner.code_cells(path), 120)
    for name in ("passes", "library_deprecation"):
        assert reports.pop(name) == {"ok": True, "message": ""}, name
    expected = {"raises": "AssertionError: x is not 2", "prints_to_stderr": "oops",
                "warns": "UserWarning: careful", "child_writes_to_stderr": "from-a-child",
                "dies": "the forked kernel died"}
    for name, report in reports.items():
        assert not report["ok"] and expected[name] in report["message"], (name, report["message"][-1500:])
