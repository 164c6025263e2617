"""Worker processes a notebook can trust: the persistent pool, and the one import for both launchers (core).

The process plumbing behind lesson 07 (and any lesson that starts real workers). It
runs on PyTorch's own distributed engine: gloo between CPU processes, NCCL between
GPUs when there are at least as many GPUs as workers. Nothing is simulated.

- `WorkerPool(world_size)`: W spawned processes that join one process group
  through a *file* rendezvous (no port to race for) and stay alive, so a widget
  can run a new experiment without paying process start-up again.
  `pool.run(fn, *args)` runs the module-level `fn` on every rank and returns the
  W results in rank order. `launch(fn, world_size, *args)` is the one-shot form;
  `shared_pool(w)` starts one pool per size and reuses it (closed at exit).
- `run_torchrun(script, world_size, *args)` (from `helpers.distributed.torchrun`): runs a worker *script* with
  `python -m torch.distributed.run --nproc_per_node=W` on a free loopback port,
  the way people launch it on a cluster. Inside the script, `save_result(obj)`
  hands a result back and `run_main(main)` reports an exception with its rank.
- `pick_backend(w)`, `max_workers()` (from `helpers.distributed.processes`), `group_for(w)`, `free_port()`.

Both launchers guarantee: when a worker raises, the parent raises `WorkerError`
promptly with that worker's rank and message (the first failure, not the echoes it
causes on the other ranks); every worker is killed; no process outlives a
`timeout_s`; workers also exit on their own if their parent disappears. Worker
stdout/stderr go to a log that is shown only when something fails, so a
notebook cell never gets stray stderr.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import queue
import shutil
import tempfile
import time
import traceback
import weakref
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from helpers.core.validate import callable_arg, choice, positive_int, positive_number
from helpers.distributed.processes import (
    POOL_START_ENV,
    WorkerError,
    _redirect_output,
    _tail,
    _watch_parent,
    max_workers,
    pick_backend,
)

__all__ = ["WorkerPool", "group_for", "launch", "shared_pool"]



# -- a persistent pool -----------------------------------------------------------------
_GROUPS: dict[int, object] = {}  # in a worker: world size w -> process group of ranks 0..w-1


def group_for(world_size: int) -> object:
    """Inside a pool worker: the process group of ranks 0..world_size-1."""
    if world_size not in _GROUPS:
        raise ValueError(f"no group of {world_size} ranks here; this pool has {sorted(_GROUPS)}")
    return _GROUPS[world_size]


def _pool_worker(rank: int, world_size: int, init_file: str, backend: str, tasks: object,
                 results: object, log_path: str, parent_pid: int) -> None:
    _redirect_output(log_path)
    _watch_parent(parent_pid, cleanup=os.path.dirname(log_path) if rank == 0 else None)
    torch.set_num_threads(1)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank,
                                world_size=world_size)
        for w in range(1, world_size + 1):  # new_group is collective: every rank creates every group
            _GROUPS[w] = dist.group.WORLD if w == world_size else dist.new_group(list(range(w)))
        results.put((rank, "ready", b""))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        results.put((rank, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
        return
    while True:
        task = tasks.get()
        if task is None:
            break
        fn, args, kwargs = task
        try:
            buf = io.BytesIO()
            torch.save(fn(*args, **kwargs), buf)
            results.put((rank, "ok", buf.getvalue()))
        except BaseException as exc:  # noqa: BLE001
            results.put((rank, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


def _shutdown(procs: list, task_queues: list, workdir: str) -> None:
    for q in task_queues:
        with contextlib.suppress(Exception):
            q.put(None)
    procs = [p for p in procs if p.pid is not None]  # a failed start leaves some unstarted
    deadline = time.monotonic() + 3.0
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(2.0)
    shutil.rmtree(workdir, ignore_errors=True)


class WorkerPool:
    """W worker processes in one process group, kept alive between `run` calls.

    `run(fn, *args, **kwargs)` sends the module-level callable `fn` to every
    rank, runs it there and returns the W results in rank order. Inside `fn`,
    `torch.distributed` is initialised (file rendezvous, `backend` from
    `pick_backend`), and `group_for(w)` gives the group of ranks 0..w-1, so one
    pool serves every W up to its size. A failure on any rank raises
    `WorkerError(rank, message)` in the parent and closes the pool (its peers
    may be stuck in a collective); a run longer than `timeout_s` raises
    `TimeoutError` and closes it too. Use it as a context manager, or call
    `close()`; it is also closed at interpreter exit.
    """

    def __init__(self, world_size: int, *, timeout_s: float = 120.0, backend: str | None = None) -> None:
        self.world_size = positive_int("world_size", world_size)
        self.timeout_s = positive_number("timeout_s", timeout_s)
        self.backend = backend or pick_backend(world_size)
        self._workdir = tempfile.mkdtemp(prefix="lesson07-pool-")
        start = choice(POOL_START_ENV, os.environ.get(POOL_START_ENV, "spawn"),
                       ("spawn", "fork", "forkserver"))
        if self.backend == "nccl":  # a forked child cannot re-initialise the CUDA its parent already set up
            start = "spawn"
        ctx = mp.get_context(start)
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(world_size)]
        self._logs = [os.path.join(self._workdir, f"rank{r}.log") for r in range(world_size)]
        init_file = os.path.join(self._workdir, "rendezvous")
        self._procs = [
            ctx.Process(target=_pool_worker, daemon=True, name=f"lesson07-rank{r}",
                        args=(r, world_size, init_file, self.backend, self._tasks[r], self._results,
                              self._logs[r], os.getpid()))
            for r in range(world_size)
        ]
        self._finalizer = weakref.finalize(self, _shutdown, self._procs, self._tasks, self._workdir)
        for p in self._procs:
            p.start()
        self._collect(expect="ready", timeout_s=self.timeout_s)

    @property
    def closed(self) -> bool:
        """True once the pool has been closed (explicitly, after a failure, or a timeout)."""
        return not self._finalizer.alive

    @property
    def pids(self) -> list[int]:
        """The workers' process ids."""
        return [p.pid for p in self._procs]

    def close(self) -> None:
        """Stop every worker (politely, then by force) and delete the pool's files."""
        self._finalizer()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fail(self, error: Exception) -> None:
        logs = {r: _tail(p) for r, p in enumerate(self._logs)}
        for p in self._procs:
            if p.is_alive():
                p.kill()
        self.close()
        if isinstance(error, WorkerError) and error.rank is not None and logs.get(error.rank):
            error.add_note(f"rank {error.rank} log (tail):\n{logs[error.rank]}")
        raise error

    def _collect(self, *, expect: str, timeout_s: float) -> list[object]:
        out: dict[int, object] = {}
        deadline = time.monotonic() + timeout_s
        while len(out) < self.world_size:
            try:
                rank, status, payload = self._results.get(timeout=0.05)
            except queue.Empty:
                for r, p in enumerate(self._procs):
                    if not p.is_alive():
                        self._fail(WorkerError(r, f"process exited with code {p.exitcode} without a result"))
                if time.monotonic() > deadline:
                    self._fail(TimeoutError(
                        f"the {self.world_size} workers did not all finish within {timeout_s:g} s "
                        f"(finished: ranks {sorted(out)}); every worker was killed"))
                continue
            if status == "error":
                # A peer that died first is the root cause; this error may only be its echo.
                dead = [r for r, p in enumerate(self._procs) if r != rank and not p.is_alive()]
                if dead:
                    error = WorkerError(dead[0], f"process exited with code {self._procs[dead[0]].exitcode}")
                    error.add_note(f"rank {rank} then failed: {payload.splitlines()[0]}")
                    self._fail(error)
                self._fail(WorkerError(rank, payload))
            out[rank] = (torch.load(io.BytesIO(payload), weights_only=False)
                         if expect == "ok" else payload)
        return [out[r] for r in range(self.world_size)]

    def run(self, fn: Callable[..., object], *args: object, timeout_s: float | None = None,
            **kwargs: object) -> list[object]:
        """Run `fn(*args, **kwargs)` on every rank; return the results in rank order."""
        callable_arg("fn", fn, "a module-level function (it is pickled to the workers)")
        if self.closed:
            raise RuntimeError("this WorkerPool is closed (after close(), a failure or a timeout); "
                               "start a new one")
        for q in self._tasks:
            q.put((fn, args, kwargs))
        return self._collect(expect="ok", timeout_s=timeout_s or self.timeout_s)


def launch(fn: Callable[..., object], world_size: int, *args: object, timeout_s: float = 120.0,
           **kwargs: object) -> list[object]:
    """Start `world_size` workers, run `fn(*args, **kwargs)` on each, stop them, return the results."""
    with WorkerPool(world_size, timeout_s=timeout_s) as pool:
        return pool.run(fn, *args, **kwargs)


_SHARED: dict[int, WorkerPool] = {}  # world size -> the pool `shared_pool` started (filled on first use)


def _close_shared_pools() -> None:
    for pool in list(_SHARED.values()):
        pool.close()


def shared_pool(world_size: int | None = None) -> WorkerPool:
    """A pool of `world_size` workers, started once per process and reused.

    The first call also registers closing every shared pool at interpreter exit.

    Args:
        world_size: the pool's size (default `max_workers()`).

    Returns:
        The running `WorkerPool` of that size (a new one if the last was closed).
    """
    w = max_workers() if world_size is None else positive_int("world_size", world_size)
    pool = _SHARED.get(w)
    if pool is None or pool.closed:
        if not _SHARED:
            atexit.unregister(_close_shared_pools)  # at most one registration, however often this runs
            atexit.register(_close_shared_pools)
        pool = _SHARED[w] = WorkerPool(w)
    return pool
