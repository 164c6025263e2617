"""Whether worker processes are gone: the launcher's and torchrun's tests check that none is left."""

from __future__ import annotations

import os
import time
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "zombie" in status.read_text())


def wait_gone(pids: list[int], within_s: float = 10.0) -> list[int]:
    """The processes of `pids` still alive after up to `within_s` seconds (none, once they are gone)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        running = [p for p in pids if alive(p)]
        if not running:
            return []
        time.sleep(0.1)
    return [p for p in pids if alive(p)]
