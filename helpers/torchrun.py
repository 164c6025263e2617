"""Run a worker script the way a cluster does: `python -m torch.distributed.run` (core).

- `run_torchrun(script, world_size, *args)`: runs `script` with `--nproc_per_node=W` on a free
  loopback port and returns each rank's result, or raises `WorkerError` / `TimeoutError` with
  every process gone.
- Inside the script: `save_result(obj)` hands a result back, and `run_main(main)` reports an
  exception with its rank.
- `free_port()`: a loopback TCP port nothing listens on.

The rules the workers keep (no orphans, logs shown on failure) are in `helpers.processes`;
`helpers.launcher` re-exports the public names.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from helpers.processes import WorkerError, _kill, _tail, _watch_parent
from helpers.validate import positive_int, positive_number

__all__ = ["RESULTS_ENV", "free_port", "run_main", "run_torchrun", "save_result"]

RESULTS_ENV = "LESSONS_RESULTS_DIR"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _results_dir() -> Path:
    path = os.environ.get(RESULTS_ENV)
    if not path:
        raise RuntimeError(f"{RESULTS_ENV} is not set: start this script with "
                           "helpers.launcher.run_torchrun")
    return Path(path)


def save_result(obj: object) -> None:
    """In a worker script: hand `obj` back to `run_torchrun` (one result per rank).

    Args:
        obj: anything `torch.save` can write; `run_torchrun` returns it at this rank's place.
    """
    torch.save(obj, _results_dir() / f"rank{int(os.environ['RANK'])}.pt")


def run_main(main: Callable[[], object]) -> None:
    """In a worker script: run `main()`; on an exception, record rank + message and exit 1.

    Also records the process id (so the parent can make sure it is gone) and
    exits if the launcher that started this process disappears.

    Args:
        main: the script's work, called with no arguments.
    """
    rank, out = int(os.environ.get("RANK", "0")), _results_dir()
    (out / f"rank{rank}.pid").write_text(str(os.getpid()))
    _watch_parent(os.getppid())
    try:
        main()
    except BaseException as exc:  # noqa: BLE001 - recorded, then the process exits non-zero
        (out / f"rank{rank}.error").write_text(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        sys.stderr.write(traceback.format_exc())
        sys.stderr.flush()
        os._exit(1)  # do not wait for collectives that will never finish


def _first_error(out: Path) -> WorkerError | None:
    errors = sorted(out.glob("rank*.error"), key=lambda p: p.stat().st_mtime_ns)
    if not errors:
        return None
    rank = int(errors[0].stem.removeprefix("rank"))
    return WorkerError(rank, errors[0].read_text())


def run_torchrun(script: str | os.PathLike, world_size: int, *script_args: str,
                 timeout_s: float = 180.0) -> list[object]:
    """Run `script` under `python -m torch.distributed.run --nproc_per_node=world_size`.

    Rendezvous on 127.0.0.1 at a free port; `OMP_NUM_THREADS=1`; the repository
    root on `PYTHONPATH` so the script can import `helpers`. The launcher's and
    workers' output goes to a log that is attached to any error. When it returns or
    raises, the launcher and every worker are gone.

    Args:
        script: the worker script; it calls `save_result(obj)` on each rank (inside `run_main(main)`).
        world_size: workers to start (>= 1).
        *script_args: passed to the script on its command line.
        timeout_s: the most seconds the whole run may take.

    Returns:
        Each rank's saved result, in rank order.

    Raises:
        ValueError: if `script` is not a file.
        WorkerError: rank and message of the first failure, when a worker raised or a rank saved nothing.
        TimeoutError: after `timeout_s`.
    """
    script = Path(script)
    if not script.is_file():
        raise ValueError(f"script {str(script)!r} does not exist")
    positive_int("world_size", world_size)
    positive_number("timeout_s", timeout_s)
    out = Path(tempfile.mkdtemp(prefix="lesson07-torchrun-"))
    root = str(Path(__file__).resolve().parent.parent)
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, **{RESULTS_ENV: str(out), "OMP_NUM_THREADS": "1", "PYTHONPATH": path})
    env.pop("LESSONS_STRICT", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={world_size}",
           "--nnodes=1", "--master_addr=127.0.0.1", f"--master_port={free_port()}",
           "--monitor_interval=0.1", str(script), *map(str, script_args)]
    log_path = out / "torchrun.log"
    try:
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, start_new_session=True)
            try:
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                code = None
            finally:
                _stop_group(proc)
                for pid_file in out.glob("rank*.pid"):
                    _kill(int(pid_file.read_text()))
        if code is None:
            raise TimeoutError(f"{script.name} did not finish within {timeout_s:g} s; the launcher and "
                               f"every worker were killed. Log tail:\n{_tail(log_path)}")
        error = _first_error(out)
        if error is not None:
            raise error
        if code != 0:
            raise WorkerError(None, f"torchrun exited with code {code}. Log tail:\n{_tail(log_path)}")
        missing = [r for r in range(world_size) if not (out / f"rank{r}.pt").exists()]
        if missing:
            raise WorkerError(missing[0], f"ranks {missing} finished without calling save_result(...)")
        return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the launcher's process group (torchrun then stops its workers), then SIGKILL."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
