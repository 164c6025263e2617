"""Find and time every lesson's widgets: the latency harness of `make bench` and tests/test_widgets.py.

It lives in scripts/, not in the `helpers` package: learners never need it. The times are
benchmark figures (`make bench` prints them against the 1 s target); the test only checks that
every move answers, with a limit that only a hang passes.

A lesson module (helpers/lessons/lessonNN.py) defines
`widget_latency_cases(scale, device) -> {name: zero-argument callable}`; each
callable does the work of one slider move (compute, draw, close the figure).
`discover_widget_cases()` finds those modules, `time_case()` times one move
(one warm-up call, then a timed call, with its output captured), and
`time_all_cases()` / `latency_table()` produce the table `make bench` prints.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from helpers.core.device import SCALES
from helpers.techniques.costs import interleaved_times

PROTOCOL = "widget_latency_cases"
LIMIT_S = 1.0  # the target for one slider move at the `small` scale (idle 2-core CPU): a figure, not a test

CaseBuilder = Callable[[str, torch.device], dict[str, Callable[[], object]]]


@dataclass(frozen=True)
class CaseTiming:
    """One widget case: `module:case`, seconds of the timed call (None when it raised), the error."""

    module: str
    case: str
    seconds: float | None
    error: str = ""

    @property
    def name(self) -> str:
        """`module:case`, the id tests and the bench table use."""
        return f"{self.module}:{self.case}"


def discover_widget_cases(package: str = "helpers.lessons") -> dict[str, CaseBuilder]:
    """Map each module of `package` that defines `widget_latency_cases` to that function.

    Keys are the short module names (e.g. "lesson01"), sorted. Only modules whose
    source mentions the protocol are imported, so discovery stays cheap.
    """
    if not isinstance(package, str) or not package:
        raise ValueError(f"package must be a non-empty module name, got {package!r}")
    pkg = importlib.import_module(package)
    paths = getattr(pkg, "__path__", None)
    if paths is None:
        raise ValueError(f"{package!r} is a module, not a package: nothing to discover in it")
    found: dict[str, CaseBuilder] = {}
    for info in sorted(pkgutil.iter_modules(paths), key=lambda m: m.name):
        if info.ispkg or info.name.startswith("_"):
            continue
        source = Path(info.module_finder.path) / f"{info.name}.py"  # type: ignore[union-attr]
        if source.is_file() and f"def {PROTOCOL}" not in source.read_text(encoding="utf-8"):
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        builder = getattr(module, PROTOCOL, None)
        if callable(builder):
            found[info.name] = builder
    return found


def build_cases(builder: CaseBuilder, scale: str, device: torch.device) -> dict[str, Callable[[], object]]:
    """Call one module's `widget_latency_cases` and check what it returned."""
    if scale not in SCALES:
        raise ValueError(f"scale={scale!r} is not a scale; choose one of {SCALES}")
    if not isinstance(device, torch.device):
        raise TypeError(f"device must be a torch.device, got {type(device).__name__}")
    cases = builder(scale, device)
    if not isinstance(cases, dict) or not cases:
        raise ValueError(f"{PROTOCOL} must return a non-empty dict of name -> callable, got {cases!r}")
    bad = [name for name, fn in cases.items() if not isinstance(name, str) or not callable(fn)]
    if bad:
        raise ValueError(f"{PROTOCOL} returned entries that are not (str name, callable): {bad}")
    return cases


def _one_call(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds of one call of `fn`, its display and print output swallowed, figures closed after.

    Timed by the project's timing helper, `helpers.techniques.costs.interleaved_times` (one run, no warm-up).
    """
    import matplotlib.pyplot as plt
    from IPython.utils.capture import capture_output

    try:
        with capture_output(), contextlib.redirect_stdout(io.StringIO()):
            return interleaved_times({"move": fn}, device=device, repeats=1, warmup=0)["move"].median
    finally:
        plt.close("all")


def time_case(fn: Callable[[], object], device: torch.device, *, retries: int = 1,
              limit_s: float = LIMIT_S, warmup: bool = True) -> float:
    """Seconds of one slider move: call `fn` once to warm up, then time a second call.

    On a shared machine one slow call can be noise, so a call over `limit_s` is
    timed again, up to `retries` more times, and the fastest is returned.
    `warmup=False` times the first call (the hang guard: one call per move is enough).
    Figures left open are closed after each call; print and display output is swallowed.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        raise ValueError(f"retries must be an int >= 0, got {retries!r}")
    if warmup:
        _one_call(fn, device)
    best = _one_call(fn, device)
    for _ in range(retries):
        if best <= limit_s:
            break
        best = min(best, _one_call(fn, device))
    return best


def time_all_cases(scale: str, device: torch.device, package: str = "helpers.lessons", *, retries: int = 0,
                   progress: Callable[[str], object] | None = None) -> list[CaseTiming]:
    """Time every case of every discovered module; a case or module that raises is recorded, not raised.

    `retries` is passed to `time_case`; `progress(module_name)` is called before each module.
    """
    from helpers.core.device import seed_everything

    timings: list[CaseTiming] = []
    for module, builder in discover_widget_cases(package).items():
        if progress is not None:
            progress(module)
        seed_everything(0)
        try:
            cases = build_cases(builder, scale, device)
        except Exception as exc:  # noqa: BLE001 - report every module, whatever fails
            timings.append(CaseTiming(module, "<build>", None, f"{type(exc).__name__}: {exc}"))
            continue
        for case, fn in cases.items():
            try:
                timings.append(CaseTiming(module, case, time_case(fn, device, retries=retries)))
            except Exception as exc:  # noqa: BLE001
                timings.append(CaseTiming(module, case, None, f"{type(exc).__name__}: {exc}"))
    return timings


def latency_table(timings: list[CaseTiming], limit_s: float = LIMIT_S) -> str:
    """A text table of the timings, slowest first, with the slowest case named at the end."""
    if not timings:
        return f"no helper module defines {PROTOCOL}(scale, device) yet"
    rows = sorted(timings, key=lambda t: -(t.seconds if t.seconds is not None else float("inf")))
    width = max(len(t.name) for t in rows) + 2
    lines = [f"{'widget case':<{width}}{'seconds':>9}"]
    for t in rows:
        if t.seconds is None:
            lines.append(f"{t.name:<{width}}   FAILED  {t.error[:120]}")
        else:
            flag = f"  (over the {limit_s:g} s target)" if t.seconds > limit_s else ""
            lines.append(f"{t.name:<{width}}{t.seconds:>8.3f}s{flag}")
    timed = [t for t in rows if t.seconds is not None]
    if timed:
        lines.append(f"slowest widget: {timed[0].name} ({timed[0].seconds:.3f} s)")
    return "\n".join(lines)
