"""One private temp folder per lesson kernel (or test session), removed when it ends, or by the next run.

Lessons 01, 07 and 10 write files (a memory snapshot, worker scripts and rank logs, the Trainer's
output folder), and so do the processes they start: torchrun's agent (`torchelastic_*`) and every
multiprocessing worker (`pymp-*`). `private_tmpdir()` points `tempfile` and `TMPDIR` (which child
processes inherit) at `<system temp>/ckpt-vs-accum-<pid>`, so all of that lands in one folder that
the owning process removes at exit. A kernel killed outright runs no exit code; the next call in any
process removes the folders of owners that no longer exist, so nothing outlives the next run.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from multiprocessing import util as mp_util
from pathlib import Path

__all__ = ["PREFIX", "private_tmpdir", "remove_orphans"]

PREFIX = "ckpt-vs-accum-"
_OWNED: dict[int, Path] = {}  # pid -> its private folder (a forked child keeps its parent's entry)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        pass
    return True


def _owner(path: Path) -> int | None:
    """The pid in a `ckpt-vs-accum-<pid>` folder's name (None for any other name)."""
    match = re.fullmatch(rf"{PREFIX}(\d+)", path.name)
    return int(match.group(1)) if match else None


def remove_orphans(root: str | os.PathLike | None = None) -> list[Path]:
    """Remove every `ckpt-vs-accum-<pid>` folder in `root` whose process no longer runs.

    Args:
        root: the folder to sweep; None is the system temp folder (`TMPDIR`, else /tmp).

    Returns:
        The folders removed.
    """
    base = Path(root) if root is not None else Path(_system_tmp())
    if not base.is_dir():
        raise ValueError(f"root={str(base)!r} is not a folder")
    removed = []
    for path in base.glob(f"{PREFIX}*"):
        owner = _owner(path)
        if owner is not None and path.is_dir() and not _alive(owner):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _system_tmp() -> str:
    """The temp folder this process had before `private_tmpdir` (its parent's private one, if any)."""
    return os.environ.get("CKPT_VS_ACCUM_SYSTEM_TMP") or tempfile.gettempdir()


def _remove(pid: int, path: Path) -> None:
    if os.getpid() == pid:  # a forked child that exits normally must not remove its parent's folder
        shutil.rmtree(path, ignore_errors=True)


def private_tmpdir() -> Path:
    """This process's private temp folder, made on the first call; later calls return the same one.

    Sets `tempfile.tempdir` and `TMPDIR` to it (so worker processes write there too), removes it at
    exit, and first removes the folders that killed runs left behind (`remove_orphans`). A process
    started (or forked) by one that has such a folder uses its parent's folder, which the parent
    removes.

    Returns:
        The folder, `<system temp>/ckpt-vs-accum-<pid>`.
    """
    pid = os.getpid()
    if pid in _OWNED and _OWNED[pid].is_dir():
        return _OWNED[pid]
    inherited = Path(tempfile.gettempdir())
    owner = _owner(inherited)
    if owner is not None and inherited.is_dir() and _alive(owner):
        # a forked kernel or a child process: its parent owns this folder and removes it
        os.environ["TMPDIR"] = str(inherited)
        return inherited
    system = _system_tmp()
    os.environ["CKPT_VS_ACCUM_SYSTEM_TMP"] = system
    remove_orphans(system)
    path = Path(system) / f"{PREFIX}{pid}"
    path.mkdir(mode=0o700, exist_ok=True)
    _OWNED[pid] = path
    tempfile.tempdir = str(path)
    os.environ["TMPDIR"] = str(path)
    # At exit, after multiprocessing has removed its own pymp-* folder inside this one (priority
    # -100): removed first, that cleanup raised FileNotFoundError on the way out.
    mp_util.Finalize(None, _remove, args=(pid, path), exitpriority=-101)
    return path
