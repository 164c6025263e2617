"""How pytest runs the notebooks in notebooks/.

Two ways, each with the same guard: a cell that raises fails, and so does a cell that writes to
stderr (a warning, a stray log): lessons run clean.

- Under nbval (`--nbval-lax`, `make test` and `make notebooks`): each notebook in its own Jupyter
  kernel, a fresh process, as a learner runs it.
- With `--forked-notebooks` (`make check`): at session start each pytest worker forks a zygote, a
  clean copy of itself that never runs a test. For each notebook the zygote imports what the
  notebook imports (torch, torch's compiler stack, the helpers, matplotlib, the frameworks), then
  forks a child that runs the notebook's code cells in order in an in-process IPython kernel
  (`ipykernel.inprocess`: code sees a kernel, as in Jupyter), in the notebook's folder, with a
  fresh interpreter's warning filters. Each import is paid once per worker, not once per notebook
  (a fresh kernel costs about 7 CPU-s); nothing a notebook sets (seeds, warning filters, torch
  flags) reaches a test or the next notebook, and no test's state reaches a notebook. One test per
  notebook; a failure names the cell and shows its traceback and output. One difference from
  nbval: a warning raised while a module is first imported is not seen here (the zygote imported
  it quietly); `make test`'s nbval run sees it.
"""

from __future__ import annotations

import ast
import importlib
import io
import json
import multiprocessing
import os
import select
import signal
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Generator, Iterable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

NOTEBOOK_TIMEOUT_S = 600.0


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    """nbval's guard: a cell that wrote to stderr fails."""
    result = yield
    outputs = getattr(item, "test_outputs", None) or []
    errs = [o.get("text", "") for o in outputs
            if o.get("output_type") == "stream" and o.get("name") == "stderr"]
    if errs:
        pytest.fail("cell wrote to stderr (lessons must run without warnings):\n" + "".join(errs)[:2000])
    return result


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--forked-notebooks", action="store_true",
                     help="run each notebook in a fork of the worker, in an in-process IPython kernel")


# What every notebook's kernel imports and the tests import too: the worker imports it before it forks
# the zygote, so the two share one copy. Imports only: nothing runs that a notebook could see.
# (Not ipykernel: importing it changes where tqdm writes in the worker; the zygote imports it.)
COMMON_IMPORTS = ("torch._dynamo", "matplotlib.pyplot", "ipywidgets", "helpers.core.device",
                  "helpers.core.display", "helpers.core.plots")


def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    if not config.getoption("--forked-notebooks"):
        return
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return  # pytest-xdist's controller: its workers run the tests
    _import_quietly(COMMON_IMPORTS)
    config.stash[ZYGOTE] = Zygote()


def pytest_sessionfinish(session: pytest.Session) -> None:
    zygote = session.config.stash.get(ZYGOTE, None)
    if zygote is not None:
        zygote.close()


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.suffix == ".ipynb" and parent.config.getoption("--forked-notebooks"):
        return ForkedNotebook.from_parent(parent, path=file_path)
    return None


def code_cells(path: Path) -> list[str]:
    """The source of each code cell of the notebook at `path`, in order."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


def imported_modules(cells: list[str]) -> list[str]:
    """The absolute imports anywhere in the cells (`import a.b`, `from a.b import c`)."""
    names: list[str] = []
    for source in cells:
        try:
            tree = ast.parse(source)
        except SyntaxError:  # a cell magic (%%writefile): not Python
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.append(node.module)
    return list(dict.fromkeys(names))


def preload(cells: list[str]) -> None:
    """Import, in this process, what a kernel would import to run the cells."""
    _import_quietly(("ipykernel.inprocess.ipkernel", *COMMON_IMPORTS, *imported_modules(cells)))


def _import_quietly(names: Iterable[str]) -> None:
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # ipykernel's debugger note on stderr
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in names:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001, S112  (the cell itself will raise it, where it belongs)
                continue


class Zygote:
    """A process forked from the pytest worker at session start, before any test has run, that forks
    each notebook's kernel. It imports what each notebook imports before forking that notebook's
    kernel, so later notebooks find it imported; it never runs a test, so no test's state (a library's
    singleton, a seed, a flag) reaches a notebook."""

    def __init__(self) -> None:
        ours, theirs = multiprocessing.Pipe()
        pid = os.fork()
        if pid == 0:  # the zygote: serves until the worker closes its end, never returns into pytest
            ours.close()
            code = 0
            try:
                _serve(theirs)
            except BaseException:  # noqa: BLE001
                code = 1
            finally:
                os._exit(code)
        theirs.close()
        self.pid, self.conn, self.owner = pid, ours, os.getpid()

    def run(self, path: Path, cells: list[str], timeout_s: float) -> dict:
        """Run `cells` in a fresh fork of the zygote; return {"ok", "message"}."""
        self.conn.send((str(path), cells, timeout_s))
        if not self.conn.poll(timeout_s + 120):  # the kernel's own deadline is timeout_s
            return {"ok": False, "message": f"{path.name}: the zygote did not answer"}
        return self.conn.recv()

    def close(self) -> None:
        """End the zygote (it exits when its pipe closes)."""
        if os.getpid() == self.owner:
            self.conn.close()
            os.waitpid(self.pid, 0)


def _serve(conn: Connection) -> None:
    while True:
        try:
            path, cells, timeout_s = conn.recv()
        except EOFError:
            return
        try:
            preload(cells)
            result = run_forked(Path(path), cells, timeout_s)
        except Exception:  # noqa: BLE001
            result = {"ok": False, "message": traceback.format_exc()}
        conn.send(result)


ZYGOTE = pytest.StashKey[Zygote]()


class ForkedNotebook(pytest.File):
    """A notebook, collected as one test."""

    def collect(self) -> Iterator[pytest.Item]:
        yield NotebookRun.from_parent(self, name="all cells")


class CellFailed(Exception):
    """A notebook's cell raised or wrote to stderr."""


class NotebookRun(pytest.Item):
    """Every code cell of one notebook, in order, in a forked in-process kernel."""

    def runtest(self) -> None:
        cells = code_cells(self.path)
        result = self.config.stash[ZYGOTE].run(self.path, cells, NOTEBOOK_TIMEOUT_S)
        if not result["ok"]:
            raise CellFailed(result["message"])

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: object = None) -> str:
        if isinstance(excinfo.value, CellFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, f"{self.path.name} (forked kernel)"


def run_forked(path: Path, cells: list[str], timeout_s: float) -> dict:
    """Run `cells` in a child process forked from this one; return {"ok", "message"}."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(read_end)
        code = 1
        try:
            report = _run_cells(path, cells)
            os.write(write_end, json.dumps(report).encode())
            code = 0
        except BaseException:  # noqa: BLE001
            os.write(write_end, json.dumps({"ok": False, "message": traceback.format_exc()}).encode())
        finally:
            os._exit(code)
    os.close(write_end)
    data, deadline = b"", time.monotonic() + timeout_s
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_end], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                return {"ok": False, "message": f"{path.name} ran past {timeout_s:.0f} s"}
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
    if not data:
        return {"ok": False, "message": f"{path.name}: the forked kernel died (status {status})"}
    return json.loads(data)


def _run_cells(path: Path, cells: list[str]) -> dict:
    """In the child: a kernel's surroundings, then each cell, stopping at the first that fails."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    from helpers.distributed.processes import _fresh_warning_filters

    _fresh_warning_filters()
    sys.argv = ["ipykernel_launcher"]
    os.chdir(path.parent)  # nbval's kernels start in the notebook's folder too
    from ipykernel.inprocess.ipkernel import InProcessKernel

    shell = InProcessKernel().shell
    # pytest's capture replaced sys.stdout and sys.stderr with its own files: write to fds 1 and 2,
    # as a kernel's output streams do, so that the guard below sees Python's writes and C's alike.
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(open(1, "wb", closefd=False), line_buffering=True)  # noqa: SIM115
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(open(2, "wb", closefd=False), line_buffering=True)  # noqa: SIM115
    with tempfile.TemporaryFile() as out:
        os.dup2(out.fileno(), 1)
        for index, source in enumerate(cells):
            error, stderr = _run_cell(shell, source)
            if error is not None or stderr:
                out.seek(0)
                stdout = out.read().decode(errors="replace")[-3000:]
                what = ("".join(traceback.format_exception(error)) if error is not None else
                        "the cell wrote to stderr (lessons must run without warnings):\n" + stderr[-2000:])
                return {"ok": False, "message": f"{path.name}, code cell {index + 1} of {len(cells)}:\n"
                        f"{source[:1500]}\n---- output (last lines) ----\n{stdout}\n---- error ----\n{what}"}
    return {"ok": True, "message": ""}


def _run_cell(shell: object, source: str) -> tuple[BaseException | None, str]:
    """Run one cell; return what it raised (or None) and what it wrote to stderr."""
    with tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)
        try:
            result = shell.run_cell(source, store_history=True, silent=False)  # type: ignore[attr-defined]
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        return result.error_before_exec or result.error_in_exec, err.read().decode(errors="replace")
