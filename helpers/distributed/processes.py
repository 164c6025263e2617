"""The rules every worker process keeps, whichever launcher started it (core).

`helpers.distributed.launcher.WorkerPool` and `helpers.distributed.torchrun.run_torchrun` both build on these:

- `WorkerError(rank, message)`: what the parent raises when a worker fails.
- `_watch_parent(pid)`: a worker exits on its own as soon as its parent is gone (no orphans).
- `_redirect_output(log)`, `_tail(log)`: a worker's stdout and stderr go to a log, shown only
  (its tail) when something fails, so a notebook cell never gets stray stderr.
- `_kill(pid)`: SIGKILL, ignoring a process that is already gone.
- `pick_backend(w)`, `max_workers()`: gloo or NCCL for W workers, and how many the widget offers.

"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import sys
import threading
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from helpers.core.validate import positive_int

__all__ = ["POOL_START_ENV", "WorkerError", "max_workers", "pick_backend"]

# How worker processes start: "spawn" (the default: a fresh interpreter, safe everywhere) or "fork"
# (`make check`, `make mutate`: each worker inherits the torch, and the helpers, its parent has
# imported instead of importing them again). `WorkerPool` reads it, and so does `run_torchrun`.
POOL_START_ENV = "LESSONS_POOL_START"
LOG_TAIL = 3000  # characters of a worker log shown with an error


class WorkerError(RuntimeError):
    """A worker process failed: `rank` (None if unknown) and the worker's `message`."""

    def __init__(self, rank: int | None, message: str) -> None:
        self.rank, self.message = rank, message
        where = f"worker rank {rank}" if rank is not None else "a worker"
        super().__init__(f"{where} failed: {message}")


# -- process plumbing ------------------------------------------------------------------
def _watch_parent(parent_pid: int, cleanup: str | None = None) -> None:
    """Exit this process as soon as its parent is gone (no orphans after a kernel crash).

    `cleanup`: a folder to delete first (the pool's files, which the dead parent cannot remove).
    """

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                if cleanup:
                    shutil.rmtree(cleanup, ignore_errors=True)
                os._exit(1)
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True, name="watch-parent").start()


def _fresh_warning_filters() -> None:
    """In a forked child: the warning filters a fresh interpreter starts with, and warnings printed to
    stderr, in place of what the parent set (a notebook's strict "error", pytest's recorder)."""
    warnings.resetwarnings()
    for category in (ResourceWarning, ImportWarning, PendingDeprecationWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category)
    warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
    spec = importlib.util.find_spec("warnings")  # a fresh copy of the module holds the original printer
    fresh = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(fresh)  # type: ignore[union-attr]
    warnings.showwarning = warnings._showwarning_orig  # type: ignore[attr-defined]
    warnings._showwarnmsg_impl = fresh._showwarnmsg_impl  # type: ignore[attr-defined]


def _redirect_output(log_path: str) -> None:
    """Send this process's stdout and stderr (Python and C level) to `log_path`."""
    log = open(log_path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log


def _tail(path: Path | str, n: int = LOG_TAIL) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return text[-n:]


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def pick_backend(world_size: int) -> str:
    """The `torch.distributed` backend for `world_size` workers on this machine.

    Args:
        world_size: the number of workers (>= 1).

    Returns:
        "nccl" when this machine has at least `world_size` CUDA GPUs and NCCL, else "gloo" (CPU).
    """
    positive_int("world_size", world_size)
    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def max_workers() -> int:
    """The most workers the widget offers.

    Returns:
        The GPUs (at most 4) when there are at least two, else the CPU cores (1 to 4).
    """
    if torch.cuda.is_available() and torch.cuda.device_count() >= 2:
        return min(torch.cuda.device_count(), 4)
    return max(1, min(os.cpu_count() or 1, 4))
