"""Run a worker script the way a cluster does: `python -m torch.distributed.run` (core).

- `run_torchrun(script, world_size, *args)`: runs `script` with `--nproc_per_node=W` on a free
  loopback port and returns each rank's result, or raises `WorkerError` / `TimeoutError` with
  every process gone.
- Inside the script: `save_result(obj)` hands a result back, and `run_main(main)` reports an
  exception with its rank.
- `free_port()`: a loopback TCP port nothing listens on.

With `LESSONS_POOL_START=fork` (`make check`, `make mutate`; never a learner's default) and gloo,
`run_torchrun` forks its W workers from this process and gives each the environment torchrun
gives (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...) instead of starting
`python -m torch.distributed.run`: the script, its rendezvous and its results are the same, without
importing torch W + 1 times. The real torchrun runs under `make test` and for learners.

The rules the workers keep (no orphans, logs shown on failure) are in `helpers.distributed.processes`.
"""

from __future__ import annotations

import contextlib
import io
import os
import runpy
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from helpers.core.validate import positive_int, positive_number
from helpers.distributed.processes import (
    POOL_START_ENV,
    WorkerError,
    _fresh_warning_filters,
    _kill,
    _redirect_output,
    _tail,
    _watch_parent,
    pick_backend,
)

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
                           "helpers.distributed.torchrun.run_torchrun")
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
    raises, the launcher and every worker are gone. With `LESSONS_POOL_START=fork`
    and gloo, the workers are forks of this process with torchrun's environment
    (see the module's docstring).

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
    port = free_port()
    log_path = out / "torchrun.log"
    forked = os.environ.get(POOL_START_ENV) == "fork" and pick_backend(world_size) == "gloo"
    try:
        with open(log_path, "w") as log:
            if forked:
                code = _forked_ranks(script, world_size, script_args, env, port, log, timeout_s)
            else:
                code = _torchrun(script, world_size, script_args, env, port, log, timeout_s)
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


def _torchrun(script: Path, world_size: int, script_args: tuple, env: dict, port: int, log: io.TextIOBase,
              timeout_s: float) -> int | None:
    """`python -m torch.distributed.run`; its exit code, or None after `timeout_s` (all killed)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={world_size}",
           "--nnodes=1", "--master_addr=127.0.0.1", f"--master_port={port}",
           "--monitor_interval=0.1", str(script), *map(str, script_args)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env, start_new_session=True)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None
    finally:
        _stop_group(proc)
        for pid_file in Path(env[RESULTS_ENV]).glob("rank*.pid"):
            _kill(int(pid_file.read_text()))


def _forked_ranks(script: Path, world_size: int, script_args: tuple, env: dict, port: int, log: io.TextIOBase,
                  timeout_s: float) -> int | None:
    """W forks of this process, each running `script` as torchrun's worker of that rank would.

    Returns the first non-zero exit code (the other ranks are then killed, as torchrun does), 0, or
    None after `timeout_s` (all killed).
    """
    pids = []
    for rank in range(world_size):
        rank_env = {"RANK": rank, "LOCAL_RANK": rank, "GROUP_RANK": 0, "ROLE_RANK": rank,
                    "WORLD_SIZE": world_size, "LOCAL_WORLD_SIZE": world_size, "ROLE_WORLD_SIZE": world_size,
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "TORCHELASTIC_RESTART_COUNT": 0,
                    "TORCHELASTIC_MAX_RESTARTS": 0, "TORCHELASTIC_RUN_ID": "none",
                    "TORCHELASTIC_USE_AGENT_STORE": "False"}
        rank_env = {**env, **{k: str(v) for k, v in rank_env.items()}}
        pid = os.fork()
        if pid == 0:  # a worker: never returns to the caller
            os._exit(_forked_rank(script, script_args, rank_env, log))
        pids.append(pid)
    codes: dict[int, int] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(codes) < len(pids) and time.monotonic() < deadline:
            for pid in pids:
                if pid not in codes:
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if done:
                        codes[pid] = os.waitstatus_to_exitcode(status)
            failed = [c for c in codes.values() if c != 0]
            if failed:
                return failed[0]
            time.sleep(0.02)
        return 0 if len(codes) == len(pids) else None
    finally:
        for pid in pids:
            if pid not in codes:
                _kill(pid)
                os.waitpid(pid, 0)


def _forked_rank(script: Path, script_args: tuple, env: dict, log: io.TextIOBase) -> int:
    """In a forked worker: torchrun's environment and command line, then the script as __main__."""
    code = 1
    try:
        os.environ.clear()
        os.environ.update(env)
        _fresh_warning_filters()  # a fresh interpreter's, not the notebook's (strict: errors)
        _redirect_output(log.name)
        sys.argv = [str(script), *map(str, script_args)]
        sys.path.insert(0, str(script.parent))  # as `python script.py` does
        runpy.run_path(str(script), run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported in the log, which an error shows
        traceback.print_exc()
    finally:
        sys.stdout.flush()
    return code


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
