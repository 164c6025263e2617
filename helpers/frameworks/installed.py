"""The training frameworks of lesson 10, found, imported quietly and timed (instrument).

Transformers, Accelerate and Lightning are optional: they are the `frameworks` extra
(`pip install -e '.[frameworks]'`). This module never imports them at import time.

- `FRAMEWORKS`: the import name of each framework and what to install for it.
- `versions()`, `not_installed(*names)`: what is installed here; `missing(*names)`: what cannot
  be used here (not installed, or `unusable`); `versions_table()`: the versions
  and the seconds each import took in this kernel, as a plain-text table.
- `unusable(name)`: why an installed framework cannot run here (it imports it the way the
  lessons do), or None: Transformers 5.20 and later refuse torch older than 2.6.
- `ready(*names)`: True when every framework named is installed and imports. When one is
  missing or unusable it prints what to do and returns False, so a lesson section can skip
  its checks with a clear message; under `CI=true` it raises instead, so CI never skips.
- `timed_import(name)`: import a framework (offline, logging silenced) and record the
  seconds it took; `IMPORT_SECONDS` holds them.
- `offline()`: the environment that keeps Hugging Face libraries off the network.
- `silence_logs()`: the framework loggers that write to stderr, set to errors only.
- `caught_warnings()`: record the warnings a block raises (they are shown, not leaked);
  `describe_warnings(records)`: one line per distinct message.

Everything here is plumbing; the framework calls a lesson teaches are in its cells.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import logging
import os
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from helpers.core.display import text_table
from helpers.core.validate import choice

__all__ = [
    "EXTRA",
    "FRAMEWORKS",
    "IMPORT_SECONDS",
    "Framework",
    "caught_warnings",
    "describe_warnings",
    "install_hint",
    "missing",
    "not_installed",
    "offline",
    "ready",
    "silence_logs",
    "timed_import",
    "unusable",
    "versions",
    "versions_table",
]


@dataclass(frozen=True)
class Framework:
    """One optional framework: the modules a lesson imports and the distribution pip installs.

    `modules[0]` is the package; the rest are the submodules the lesson uses that the
    package imports lazily (Transformers loads its Trainer only when asked), so that
    `timed_import` times what the lesson really pays.
    """

    modules: tuple[str, ...]
    distribution: str

    @property
    def module(self) -> str:
        """The package itself (what `find_spec` looks for)."""
        return self.modules[0].split(".")[0]


FRAMEWORKS = {
    "transformers": Framework(("transformers", "transformers.trainer"), "transformers"),
    "accelerate": Framework(("accelerate",), "accelerate"),
    "lightning": Framework(("lightning.pytorch",), "lightning"),
}
EXTRA = "frameworks"  # the optional extra in pyproject.toml that installs all three
# Loggers that write INFO or WARNING lines to stderr on import or during a run.
_LOGGERS = ("transformers", "accelerate", "lightning", "lightning.pytorch", "lightning.fabric",
            "pytorch_lightning", "torch._dynamo", "torch._inductor")
_OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
IMPORT_SECONDS: dict[str, float] = {}  # framework -> seconds its first import took in this process


def _checked(names: Sequence[str]) -> list[str]:
    return [choice("framework", n, tuple(FRAMEWORKS)) for n in names] or list(FRAMEWORKS)


def versions() -> dict[str, str | None]:
    """Installed version of each framework.

    Returns:
        {framework: its version, or None when it is not installed}.
    """
    out: dict[str, str | None] = {}
    for name, fw in FRAMEWORKS.items():
        try:
            out[name] = importlib.metadata.version(fw.distribution)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def not_installed(*names: str) -> list[str]:
    """The frameworks among `names` (default: all) that are not installed here (looked up, not imported)."""
    return [n for n in _checked(names) if importlib.util.find_spec(FRAMEWORKS[n].module) is None]


def missing(*names: str) -> list[str]:
    """The frameworks among `names` (default: all) that cannot be used here.

    Not installed, or installed but unable to run with this torch (`unusable`: an installed one is
    imported to find out). The lessons and the tests skip a section that needs one of these.
    """
    absent = not_installed(*names)
    return [n for n in _checked(names) if n in absent or unusable(n) is not None]


def install_hint(names: Sequence[str]) -> str:
    """The pip command that installs `names` (the lesson's extra, or the packages by name)."""
    packages = " ".join(FRAMEWORKS[n].distribution for n in _checked(names))
    return f"pip install 'ckpt-vs-accum[{EXTRA}]' (or: pip install {packages})"


_UNUSABLE: dict[str, str | None] = {}  # framework -> why it cannot run here (None: it can), once a process


def unusable(name: str) -> str | None:
    """Why framework `name`, installed, cannot run in this environment; None when it can.

    Imports it as the lessons do (`timed_import`, the first time only). A framework can be
    installed and still refuse this torch: Transformers 5.20 and later disable their PyTorch
    models below torch 2.6 (5.19 imports `torch.accelerator`, new in 2.6), and a package index
    may still hand such a release to an older torch.

    Args:
        name: a key of `FRAMEWORKS` that is installed (see `missing`).

    Returns:
        One line naming the framework's version, this torch and the cause, or None.
    """
    (name,) = _checked([name])
    if name not in _UNUSABLE:
        _UNUSABLE[name] = _why_unusable(name)
    return _UNUSABLE[name]


def _why_unusable(name: str) -> str | None:
    import torch

    version = versions()[name]
    try:
        with _quiet_stderr_logs():
            if name == "transformers":  # its own verdict on this torch first: the Trainer fails obscurely
                checks = importlib.import_module("transformers.utils.import_utils")
                if not checks.is_torch_available():
                    raise ImportError("it disabled its PyTorch models, because this torch is older than "
                                      "it requires")
            timed_import(name)
    except Exception as exc:  # noqa: BLE001 - any failure to import means it cannot run here
        cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return (f"{name} {version} is installed but does not run with torch {torch.__version__} "
                f"({type(exc).__name__}: {cause}); upgrade torch, or install a {name} release that "
                "supports this torch")
    return None


@contextlib.contextmanager
def _quiet_stderr_logs() -> Iterator[None]:
    """Transformers reports a refused torch as two WARNING log lines at import: keep them off stderr."""
    saved = os.environ.get("TRANSFORMERS_VERBOSITY")
    os.environ["TRANSFORMERS_VERBOSITY"] = "error"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TRANSFORMERS_VERBOSITY", None)
        else:
            os.environ["TRANSFORMERS_VERBOSITY"] = saved


def ready(*names: str) -> bool:
    """True when every framework in `names` is installed and runs here; else say what to do.

    Args:
        *names: framework keys of `FRAMEWORKS` (none: all of them).

    Returns:
        True when all import and run with this torch (`unusable`). Otherwise prints one line
        naming the missing ones and the pip command (or why an installed one cannot run), and
        returns False; with the environment variable `CI=true` it raises `RuntimeError` instead
        (CI must run every section).
    """
    absent = not_installed(*names)
    broken = [why for n in _checked(names) if n not in absent and (why := unusable(n)) is not None]
    if not absent and not broken:
        return True
    if absent:
        message = (f"{', '.join(absent)} not installed here: the checks that need "
                   f"{'them' if len(absent) > 1 else 'it'} are skipped. To run them: {install_hint(absent)}, "
                   "then restart the kernel.")
    else:
        message = f"{'; '.join(broken)}: the checks that need it are skipped."
    if os.environ.get("CI", "").lower() == "true":
        raise RuntimeError(f"CI=true, so every section must run, but {message}")
    print(f"Skipped: {message}")
    return False


def offline() -> None:
    """Set the environment that keeps Hugging Face libraries from touching the network.

    The lessons build every model from a config written in code, so nothing is ever
    downloaded; these variables make any accidental hub call fail fast instead.
    """
    for key, value in _OFFLINE.items():
        os.environ.setdefault(key, value)


def silence_logs() -> None:
    """Set the frameworks' loggers to errors only (their INFO/WARNING lines go to stderr).

    Lightning logs "GPU available: False ..." at INFO and Transformers warns about
    configs through `logging`; lessons print what matters themselves.
    """
    for name in _LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    transformers = sys.modules.get("transformers")
    if transformers is not None:  # imported by us or by another framework (Lightning's metrics)
        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()


def timed_import(name: str) -> object:
    """Import framework `name` (offline, logs silenced), recording the seconds it took.

    Args:
        name: a key of `FRAMEWORKS`.

    Returns:
        The imported package. The first import's wall time (the package and the
        submodules in `FRAMEWORKS[name].modules`) is stored in `IMPORT_SECONDS[name]`;
        later calls are free and do not change it.
    """
    (name,) = _checked([name])
    offline()
    start = time.perf_counter()
    with caught_warnings():  # import-time deprecation notices are not the lesson's
        modules = [importlib.import_module(m) for m in FRAMEWORKS[name].modules]
    module = modules[0]
    IMPORT_SECONDS.setdefault(name, time.perf_counter() - start)
    silence_logs()
    return module


@contextlib.contextmanager
def caught_warnings() -> Iterator[list[warnings.WarningMessage]]:
    """Record every warning raised inside the block instead of printing (or raising) it.

    Under `LESSONS_STRICT=1` warnings are errors, so a section that provokes one on
    purpose must catch it here.

    Yields:
        The list of `warnings.WarningMessage` records; show them with `describe_warnings`.
    """
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        yield records


def describe_warnings(records: Sequence[warnings.WarningMessage], width: int = 160) -> list[str]:
    """One line per distinct warning: its category, how often it was raised, the message.

    Args:
        records: from `caught_warnings`.
        width: the longest message kept (longer ones are cut with "...").

    Returns:
        The lines.
    """
    counts: dict[tuple[str, str], int] = {}
    for r in records:
        text = " ".join(str(r.message).split())
        key = (r.category.__name__, text if len(text) <= width else text[: width - 3] + "...")
        counts[key] = counts.get(key, 0) + 1
    return [f"caught {cat} (x{n}): {msg}" for (cat, msg), n in counts.items()]


def versions_table() -> str:
    """Each framework's installed version and the seconds its import took in this kernel.

    Returns:
        The plain-text table.
    """
    rows = []
    for name, version in versions().items():
        seconds = IMPORT_SECONDS.get(name)
        rows.append((name, version or "not installed",
                     "-" if seconds is None else f"{seconds:.1f} s"))
    return text_table(rows, ("framework", "version", "import here, in this order (shared parts count once)"))
