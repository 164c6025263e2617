"""Every lesson in a real browser: JupyterLab + headless Chromium, driven by Playwright.

JupyterLab loads once, in one page; each notebook in notebooks/ (copies in a temporary folder,
so that autosave never touches the repository) is opened from the file browser and gets a fresh
kernel (a fork of a process that imported what the lessons import, tests/forked_kernels.py;
BROWSER_FRESH_KERNELS=1 starts fresh processes instead), Run All from the Run menu, and is
closed with its changes discarded. Checked: no error output, a micro-batch size (B) and an
accumulation steps (K) control, and every slider moved with the keyboard redraws its widget's
output. The lessons run at the `tiny` scale
(LESSONS_SCALE overrides): this test checks the frontend; nbval checks the claims at the CPU
scale. A screenshot per lesson goes to browser-shots/ (git-ignored; BROWSER_SHOTS_DIR
overrides), with the timings in browser-shots/timings.json.

Needs Debian's Chromium (`apt-get install chromium`, /usr/bin/chromium; CHROMIUM_PATH
overrides) and Playwright for Python (the `dev` extra); Playwright's own browser download
is not used. Without them the tests skip, except under CI=true, where they fail.
Run only these: `pytest -m browser tests/test_browser.py`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
CHROMIUM = Path(os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium"))
SHOTS = Path(os.environ.get("BROWSER_SHOTS_DIR", ROOT / "browser-shots"))
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
CONTROLS = ("micro-batch size (B)", "accumulation steps (K)")
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"
RUN_ALL_TIMEOUT_S = 600     # one lesson, kernel start included (the target is 60 s on an idle CPU)
REDRAW_TIMEOUT_S = 60       # one slider move (the target is 1 s on an idle CPU)

# Snapshot of a widget's output: every image's src and the text, so any redraw shows.
_OUTPUT_JS = """box => {
    const out = box.querySelector('.widget-output');
    if (!out) return null;
    const imgs = Array.from(out.querySelectorAll('img')).map(i => i.src);
    return imgs.join('|') + '\\n' + out.innerText;
}"""
# The widget's box: the interact() container, else the nearest box that has an Output.
_BOX_JS = """el => {
    let box = el.closest('.widget-interact');
    for (let p = el.parentElement; !box && p; p = p.parentElement) {
        if (p.classList.contains('jp-OutputArea')) break;
        if (p.querySelector('.widget-output')) box = p;
    }
    return box;
}"""


def _missing_tools() -> str:
    """Why the browser tests cannot run here ("" when they can)."""
    missing = []
    if not CHROMIUM.exists():
        missing.append(f"Chromium at {CHROMIUM} (apt-get install -y chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("Playwright for Python (pip install -e '.[dev]')")
    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        missing.append("JupyterLab (pip install -e '.[lab]')")
    return "; ".join(missing)


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true, so the browser tests must run, but they cannot: {reason}")
    pytest.skip(f"browser tests need {reason}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Lab:
    """A running JupyterLab: its base URL, token and the folder it serves."""

    base: str
    token: str
    root: Path
    kernel_env: dict[str, str] = field(default_factory=dict)  # JUPYTER_PATH and the zygote, if forked

    def api(self, path: str, method: str = "GET") -> object:
        req = urllib.request.Request(f"{self.base}{path}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
        return json.loads(body) if body else None

    def wait_for_kernel(self, path: str, timeout_s: float) -> None:
        """Wait until the notebook at `path` has a session whose kernel is idle."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = [(s.get("kernel") or {}).get("execution_state")
                      for s in self.api("/api/sessions") if s.get("path") == path]  # type: ignore[union-attr]
            if "idle" in states:
                return
            time.sleep(0.5)
        raise TimeoutError(f"no idle kernel for {path} within {timeout_s:.0f} s")

    def delete_sessions(self) -> None:
        for session in self.api("/api/sessions"):  # type: ignore[union-attr]
            self.api(f"/api/sessions/{session['id']}", method="DELETE")


def _head_tail(text: str, head: int = 500, tail: int = 1200) -> str:
    """The start and the end of a long traceback (its last line names the error)."""
    return text if len(text) <= head + tail else f"{text[:head]}\n[...]\n{text[-tail:]}"


def _write_settings(folder: Path) -> None:
    """User settings for the test server: every cell in the page, no news or update checks."""
    tracker = folder / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True, exist_ok=True)
    tracker.write_text(json.dumps({"windowingMode": "none"}))
    notes = folder / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notes.parent.mkdir(parents=True, exist_ok=True)
    notes.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    missing = _missing_tools()
    if missing:
        _skip_or_fail(missing)
    tmp = tmp_path_factory.mktemp("browser-lab")
    served = tmp / "notebooks"
    served.mkdir()
    for nb in NOTEBOOKS:
        shutil.copy2(nb, served / nb.name)
    _write_settings(tmp / "settings")
    port, token = _free_port(), uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k not in ("LESSONS_STRICT", "MPLBACKEND")}
    env.setdefault("LESSONS_DEVICE", "cpu")
    # This test checks the frontend (rendering, controls, every slider answering), not the claims,
    # which nbval checks at the CPU scale: so the lessons run at `tiny` unless LESSONS_SCALE says otherwise.
    env.setdefault("LESSONS_SCALE", "tiny")
    # For the same reason lesson 07's and 10's workers are forks of the kernel (`make check`'s
    # LESSONS_POOL_START=fork), not fresh interpreters that each import torch.
    env.setdefault("LESSONS_POOL_START", "fork")
    env.update(
        PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        JUPYTER_CONFIG_DIR=str(tmp / "config"), JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(tmp / "settings"), JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"),
    )
    zygote, zygote_log = None, None
    if os.environ.get("BROWSER_FRESH_KERNELS") != "1":
        # Each lesson's kernel is forked from a process that imported what the lessons import
        # (tests/forked_kernels.py): fresh state, without 3 CPU-s of imports a lesson. Set
        # BROWSER_FRESH_KERNELS=1 for the kernels a learner gets (nbval's run uses those).
        socket_path = str(tmp / "zygote.sock")
        kernel = tmp / "data" / "kernels" / "python3"
        kernel.mkdir(parents=True)
        (kernel / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, str(ROOT / "tests" / "forked_kernels.py"), "client", "-f",
                     "{connection_file}"],
            "display_name": "Python 3 (ipykernel)", "language": "python", "metadata": {"debugger": False}}))
        env.update(JUPYTER_PATH=str(tmp / "data"), LESSONS_KERNEL_ZYGOTE=socket_path)
        zygote_log = (tmp / "zygote.log").open("w")
        zygote = subprocess.Popen([sys.executable, str(ROOT / "tests" / "forked_kernels.py"), "zygote",
                                   socket_path], cwd=ROOT, env=env, stdout=zygote_log,
                                  stderr=subprocess.STDOUT)
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root", "--ip=127.0.0.1",
           f"--port={port}", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={served}",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    log = (tmp / "jupyter.log").open("w")
    proc = subprocess.Popen(cmd, cwd=served, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = Lab(f"http://127.0.0.1:{port}", token, served,
                 {k: env[k] for k in ("JUPYTER_PATH", "LESSONS_KERNEL_ZYGOTE") if k in env})
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                server.api("/api/status")
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not start:\n{(tmp / 'jupyter.log').read_text()[-3000:]}")
                time.sleep(0.5)
        yield server
    finally:
        for process in filter(None, (proc, zygote)):
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        log.close()
        if zygote_log is not None:
            zygote_log.close()


@pytest.fixture(scope="module")
def browser(lab: Lab) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@dataclass
class LessonRun:
    """What one lesson did in the browser."""

    notebook: str
    seconds: float = 0.0
    run_all_seconds: float = 0.0
    code_cells: int = 0
    unexecuted: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    controls: list[str] = field(default_factory=list)
    widget_text: str = ""
    sliders: list[dict] = field(default_factory=list)
    screenshot: str = ""
    failure: str = ""


def _wait_idle(page: object, timeout_s: float) -> None:
    """Wait until the kernel is idle and no cell shows a [*] prompt."""
    page.wait_for_function(  # type: ignore[attr-defined]
        """panel => {
            const p = document.querySelector(panel);
            if (!p || !p.querySelector(".jp-Notebook-ExecutionIndicator[data-status='idle']")) return false;
            return !Array.from(p.querySelectorAll('.jp-InputArea-prompt'))
                .some(e => e.textContent.includes('[*]'));
        }""", arg=PANEL, timeout=timeout_s * 1000, polling=250)


class LabPage:
    """One JupyterLab page for the lessons, as a learner keeps one tab open: the app loads once (about
    3.5 s a load), each lesson is opened from the file browser, and closed with its changes discarded
    before the next. A lesson that broke off takes the page with it: the next one loads a fresh page."""

    def __init__(self, browser: object, lab: Lab) -> None:
        self.browser, self.lab = browser, lab
        self.page: object | None = None

    def open(self, name: str) -> object:
        """The page with the notebook `name` opening in it (its first cell may not be there yet)."""
        if self.page is None:
            self.page = self.browser.new_page(viewport={"width": 1400, "height": 1000})  # type: ignore[attr-defined]
            self.page.goto(  # type: ignore[attr-defined]
                f"{self.lab.base}/lab/workspaces/{uuid.uuid4().hex[:12]}/tree/{name}?reset&token={self.lab.token}")
        else:
            item = self.page.locator(".jp-DirListing-item", has_text=name)  # type: ignore[attr-defined]
            item.first.dblclick(timeout=30_000)
        return self.page

    def close_lesson(self) -> None:
        """Close the open notebook's tab and discard its changes, as the "Save your work" dialog offers."""
        page = self.page
        page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabCloseIcon").click()  # type: ignore[attr-defined]
        page.wait_for_function(  # type: ignore[attr-defined]
            "panel => document.querySelector('.jp-Dialog') || !document.querySelector(panel)",
            arg=PANEL, timeout=30_000)
        discard = page.locator(".jp-Dialog .jp-Dialog-button", has_text="Discard")  # type: ignore[attr-defined]
        if discard.count():
            discard.first.click()
        page.locator(PANEL).wait_for(state="detached", timeout=30_000)  # type: ignore[attr-defined]

    def drop(self) -> None:
        """Close the page (after a failure): the next lesson loads a fresh one."""
        if self.page is not None:
            with contextlib.suppress(Exception):
                self.page.close()  # type: ignore[attr-defined]
        self.page = None


def _run_lesson(pages: LabPage, name: str) -> LessonRun:
    lab, run = pages.lab, LessonRun(name)
    start = time.perf_counter()
    lab.delete_sessions()  # a fresh kernel: no session of an earlier lesson is reused
    page = None
    try:
        page = pages.open(name)
        panel = page.locator(PANEL)
        panel.locator(".jp-Cell").first.wait_for(timeout=120_000)
        lab.wait_for_kernel(name, timeout_s=180)  # the indicator says idle before a kernel exists
        _wait_idle(page, 60)
        toast = page.locator(".jp-toast-button", has_text="No")
        if toast.count():
            toast.first.click()
        run.code_cells = panel.locator(".jp-CodeCell").count()

        t0 = time.perf_counter()
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator(".lm-Menu-item:not(.lm-mod-disabled) .lm-Menu-itemLabel",
                     has_text="Run All Cells").first.click()
        page.wait_for_function(  # the first prompt leaves its empty state: the run has started
            "panel => { const e = document.querySelector(panel + ' .jp-CodeCell .jp-InputArea-prompt');"
            " return e && e.textContent.trim() !== '[ ]:' && e.textContent.trim() !== ''; }",
            arg=PANEL, timeout=120_000)
        _wait_idle(page, RUN_ALL_TIMEOUT_S)
        run.run_all_seconds = time.perf_counter() - t0
        # A learner opens a collapsed "Going deeper" heading to use what is under it: do the same.
        hidden = panel.locator(".jp-showHiddenCellsButton")
        for _ in range(20):
            if not hidden.count():
                break
            hidden.first.click()
            page.wait_for_timeout(300)

        prompts = panel.locator(".jp-CodeCell .jp-InputArea-prompt").all_inner_texts()
        run.unexecuted = [i for i, p in enumerate(prompts) if not any(ch.isdigit() for ch in p)]
        errors = panel.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr'], "
                               ".jp-OutputArea-output .jp-RenderedText[data-mime-type*='stderr']")
        run.errors = [_head_tail(t.strip()) for t in errors.all_inner_texts()]
        run.controls = [t.strip() for t in panel.locator(".jp-OutputArea .widget-label").all_inner_texts()]
        run.widget_text = "\n".join(panel.locator(".jp-OutputArea .widget-output").all_inner_texts())

        sliders = panel.locator(".jp-OutputArea .widget-slider")
        for i in range(sliders.count()):
            run.sliders.append(_move_slider(page, sliders.nth(i)))
        SHOTS.mkdir(parents=True, exist_ok=True)
        if run.errors:  # show the first error rather than the last widget
            errors.first.evaluate(_SCROLL_JS)
        shot = SHOTS / f"{Path(name).stem}.png"
        page.screenshot(path=str(shot))
        run.screenshot = str(shot)
        pages.close_lesson()
    except Exception as exc:  # noqa: BLE001 - every check reports it
        run.failure = f"{type(exc).__name__}: {exc}"[:3000]
        SHOTS.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(Exception):
            page.screenshot(path=str(SHOTS / f"{Path(name).stem}-failed.png"))  # type: ignore[union-attr]
        pages.drop()
    finally:
        lab.delete_sessions()  # stop this lesson's kernel before the next one starts
        run.seconds = time.perf_counter() - start
    return run


# Scroll without Playwright's wait for a stable box: outputs above the slider may still be growing.
_SCROLL_JS = "e => e.scrollIntoView({block: 'center', inline: 'nearest'})"


def _move_slider(page: object, slider: object) -> dict:
    """Press ArrowRight (ArrowLeft at the maximum) on a slider; report whether its output changed."""
    label = slider.locator(".widget-label").first.inner_text().strip()  # type: ignore[attr-defined]
    handle = slider.locator(".noUi-handle").first  # type: ignore[attr-defined]
    box = slider.evaluate_handle(_BOX_JS)  # type: ignore[attr-defined]
    result = {"label": label, "changed": False, "seconds": None, "detail": ""}
    if not box.evaluate("b => !!b"):
        result["detail"] = "no widget box with an Output around this slider"
        return result
    before = box.evaluate(_OUTPUT_JS)
    at_max = handle.get_attribute("aria-valuenow") == handle.get_attribute("aria-valuemax")
    handle.evaluate(_SCROLL_JS)  # not scroll_into_view_if_needed: it waits for a layout that
    handle.focus()                # a loaded machine keeps moving (lesson 08 timed out there at 30 s)
    start = time.perf_counter()
    handle.press("ArrowLeft" if at_max else "ArrowRight")
    try:
        page.wait_for_function(  # type: ignore[attr-defined]
            """([box, before, panel, js]) => {
                const now = eval(js)(box);
                const p = document.querySelector(panel);
                const idle = p && p.querySelector(".jp-Notebook-ExecutionIndicator[data-status='idle']");
                return idle && now !== null && now.trim() !== '' && now !== before;
            }""", arg=[box, before, PANEL, _OUTPUT_JS], timeout=REDRAW_TIMEOUT_S * 1000, polling=100)
        result["changed"] = True
        result["seconds"] = round(time.perf_counter() - start, 2)
    except Exception as exc:  # noqa: BLE001 - reported by the test
        result["detail"] = f"output did not change within {REDRAW_TIMEOUT_S} s ({type(exc).__name__})"
    return result


@pytest.fixture(scope="module")
def runs(browser: object, lab: Lab, request: pytest.FixtureRequest) -> Iterator[dict[str, LessonRun]]:
    pages = LabPage(browser, lab)

    class Runs(dict):
        def __missing__(self, name: str) -> LessonRun:
            self[name] = _run_lesson(pages, name)
            return self[name]

    cache = Runs()
    yield cache
    pages.drop()
    total = sum(r.seconds for r in cache.values())
    SHOTS.mkdir(parents=True, exist_ok=True)
    summary = {"total_seconds": round(total, 1),
               "lessons": {n: {"seconds": round(r.seconds, 1), "run_all_seconds": round(r.run_all_seconds, 1),
                               "sliders": r.sliders, "controls": r.controls, "errors": r.errors,
                               "unexecuted": r.unexecuted, "failure": r.failure}
                           for n, r in cache.items()}}
    (SHOTS / "timings.json").write_text(json.dumps(summary, indent=2) + "\n")
    line = (f"browser: {len(cache)} lessons in {total:.0f} s in all (kernel starts included); "
            f"screenshots and timings in {SHOTS}")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:  # shown even under -q, where a print would be captured
        reporter.write_line(f"\n{line}")


def _lesson(runs: dict[str, LessonRun], path: Path) -> LessonRun:
    run = runs[path.name]
    if run.failure:
        pytest.fail(f"{path.name}: the browser run broke off: {run.failure}")
    return run


def _halves(paths: list[Path]) -> list[object]:
    """The lessons as parameters, even and odd ones in two `xdist_group`s. Under `--dist loadgroup`
    each group could get its own worker and JupyterLab; `make test` runs `--dist loadfile` (one
    worker): one trial with loadgroup put both groups on one worker and gained nothing, and a second
    (2026-12-04) did not keep the groups together at all, so lessons ran on both workers."""
    return [pytest.param(p, marks=pytest.mark.xdist_group(f"browser-{int(p.name[:2]) % 2}"), id=p.stem[:2])
            for p in paths]


# Lesson 00 ("start here") reads and decides: it has no B and K widgets to drive.
LESSONS_WITH_WIDGETS = [p for p in NOTEBOOKS if not p.name.startswith("00_")]


def test_lessons_are_numbered_without_gaps() -> None:
    numbers = [int(p.name[:2]) for p in NOTEBOOKS]
    first = 0 if numbers and numbers[0] == 0 else 1  # 00 is the optional "start here" page
    assert numbers == list(range(first, first + len(numbers))), f"lessons 00/01..NN expected, found {numbers}"


@pytest.mark.parametrize("path", _halves(NOTEBOOKS))
def test_lesson_runs_clean(runs: dict[str, LessonRun], path: Path) -> None:
    run = _lesson(runs, path)
    assert run.code_cells > 0
    assert not run.errors, f"{path.name}: error output in the browser:\n" + "\n---\n".join(run.errors)
    assert not run.unexecuted, f"{path.name}: Run All left code cells {run.unexecuted} unexecuted"


@pytest.mark.parametrize("path", _halves(LESSONS_WITH_WIDGETS))
def test_lesson_offers_micro_batch_and_steps_controls(runs: dict[str, LessonRun], path: Path) -> None:
    run = _lesson(runs, path)
    missing = [c for c in CONTROLS if not any(c in label for label in run.controls)]
    assert not missing, f"{path.name}: no control labelled {missing}; its controls: {run.controls}"


@pytest.mark.parametrize("path", _halves(LESSONS_WITH_WIDGETS))
def test_lesson_shows_the_effective_batch(runs: dict[str, LessonRun], path: Path) -> None:
    run = _lesson(runs, path)
    assert re.search(r"B\s*x\s*K(\s*x\s*W)?\s*=\s*\d", run.widget_text), (  # lesson 07 adds W
        f"{path.name}: no widget output shows the effective batch as text "
        f"('effective batch B x K = N'; a figure title cannot be read here)")


@pytest.mark.parametrize("path", _halves(LESSONS_WITH_WIDGETS))
def test_every_slider_redraws_its_output(runs: dict[str, LessonRun], path: Path) -> None:
    run = _lesson(runs, path)
    assert run.sliders, f"{path.name}: no slider in any widget output"
    stuck = [s for s in run.sliders if not s["changed"]]
    assert not stuck, f"{path.name}: sliders whose output did not change: {stuck}"


def test_a_forked_kernel_is_a_kernel_that_goes_with_its_client(lab: Lab,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The lessons' kernels here are forks of a warm process (tests/forked_kernels.py). One must show
    a warning on stderr, as a fresh kernel does, stop a cell when interrupted, and exit when Jupyter
    kills its client, so that no kernel outlives its session."""
    if not lab.kernel_env:
        pytest.skip("BROWSER_FRESH_KERNELS=1: the kernels are fresh processes")
    from jupyter_client import KernelManager

    for name, value in lab.kernel_env.items():
        monkeypatch.setenv(name, value)
    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(lab.root))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        out = _execute(kc, "import os, sys, warnings\nwarnings.warn('from a forked kernel')\n"
                           "print(os.getpid(), os.getcwd(), sys.modules['torch'].__name__)")
        assert "from a forked kernel" in out["stderr"], out
        pid, cwd, torch_name = out["stdout"].split()
        assert (cwd, torch_name) == (str(lab.root), "torch"), out  # the client's folder; torch came preloaded
        # stop_on_error=False: after a failed cell ipykernel aborts what reaches it within a short
        # window, and on a loaded machine the next cell landed in it ('aborted', no output)
        sleeping = kc.execute("import time\ntime.sleep(60)", stop_on_error=False)
        time.sleep(1)
        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=30)  # within 30 s, not the cell's 60
        while reply["parent_header"]["msg_id"] != sleeping:  # the replies to the cells before it
            reply = kc.get_shell_msg(timeout=30)
        assert reply["content"].get("ename") == "KeyboardInterrupt", reply["content"]
        assert _execute(kc, "print('still here')")["stdout"].strip() == "still here"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)  # kills the client
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists(), "the forked kernel outlived its client"


def _execute(kc: object, code: str, timeout_s: float = 60) -> dict[str, str]:
    """Run `code` in the kernel; return what it wrote to stdout and stderr."""
    msg_id = kc.execute(code)  # type: ignore[attr-defined]
    streams = {"stdout": "", "stderr": ""}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        msg = kc.get_iopub_msg(timeout=timeout_s)  # type: ignore[attr-defined]
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            streams[msg["content"]["name"]] += msg["content"]["text"]
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return streams
    raise TimeoutError(f"no answer to {code!r} within {timeout_s:.0f} s")
