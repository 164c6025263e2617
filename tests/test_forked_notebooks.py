"""`make check`'s notebook runner (conftest.py, --forked-notebooks) fails where nbval fails: a cell that
raises, a cell that writes to stderr (a print, a warning, a child process), a kernel that dies, and
it runs each notebook in a kernel (`get_ipython().kernel`) in the notebook's folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

NOTEBOOKS = {
    "passes": ["x = 1\nprint('to stdout is fine')",
               "from helpers.display import in_notebook\nimport os\nassert in_notebook() and x == 1\n"
               "assert os.getcwd() == {folder!r}\n%time y = 2"],
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


def test_the_forked_runner_fails_what_nbval_fails(tmp_path: Path) -> None:
    for name, cells in NOTEBOOKS.items():
        cells = [c.replace("{folder!r}", repr(str(tmp_path))) for c in cells]
        (tmp_path / f"{name}.ipynb").write_text(json.dumps(_notebook(cells)))
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:nbval",
                          "-p", "no:xdist", "-p", "conftest", "--forked-notebooks", "-rf", str(tmp_path)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300).stdout
    assert "5 failed, 1 passed" in out, out[-3000:]
    for name, expected in [("raises", "AssertionError: x is not 2"), ("prints_to_stderr", "oops"),
                           ("warns", "UserWarning: careful"), ("child_writes_to_stderr", "from-a-child"),
                           ("dies", "the forked kernel died")]:
        section = out.split(f"{name}.ipynb (forked kernel)")[1][:2500]
        assert expected in section, (name, section)
