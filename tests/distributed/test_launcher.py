"""helpers.distributed.launcher (core): the worker pool, with real processes.

The torchrun launcher (`helpers.distributed.torchrun`) is tested in `tests/distributed/test_torchrun.py`.

Tests marked `distributed` start real worker processes (gloo on CPU). Each has a
deadline (SIGALRM), so a hung collective fails the test instead of hanging CI.
"""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist
from support.workers import wait_gone

from helpers.distributed import launcher as L
from helpers.distributed import processes, torchrun


# -- worker functions (module level, so the workers can unpickle them) ------------------------
def _rank_and_sum() -> tuple[int, int, float]:
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return dist.get_rank(), dist.get_world_size(), t.item()


def _fail_on_rank_1() -> None:
    if dist.get_rank() == 1:
        raise ValueError("boom from rank 1")
    dist.barrier()  # rank 0 waits for a peer that never comes


def _hang() -> None:
    time.sleep(600)


def _crash() -> None:
    if dist.get_rank() == 0:
        os._exit(3)

def test_argument_checks() -> None:
    with pytest.raises(TypeError):
        L.WorkerPool(True)
    with pytest.raises(ValueError):
        L.WorkerPool(0)
    with pytest.raises(ValueError, match="does not exist"):
        torchrun.run_torchrun("/nonexistent/worker.py", 2)


def test_pool_start_method_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(processes.POOL_START_ENV, "threads")
    with pytest.raises(ValueError, match=r"^LESSONS_POOL_START='threads' is not allowed.*'spawn', 'fork'"):
        L.WorkerPool(2)


# -- the launchers (real processes) --------------------------------------------------------------
@pytest.mark.distributed
def test_launch_returns_every_rank_result() -> None:
    results = L.launch(_rank_and_sum, 2, timeout_s=120)
    assert results == [(0, 2, 3.0), (1, 2, 3.0)]


@pytest.mark.distributed
def test_failing_worker_raises_promptly_with_rank_and_message_and_leaves_no_process() -> None:
    pool = L.WorkerPool(2, timeout_s=120)
    pids = pool.pids
    start = time.monotonic()
    with pytest.raises(processes.WorkerError, match="boom from rank 1") as info:
        pool.run(_fail_on_rank_1)
    assert time.monotonic() - start < 15, "the parent must not wait for the timeout"
    assert info.value.rank == 1
    assert pool.closed
    assert wait_gone(pids) == []
    with pytest.raises(RuntimeError, match="closed"):
        pool.run(_rank_and_sum)


@pytest.mark.distributed
def test_hanging_worker_times_out_and_is_killed() -> None:
    pool = L.WorkerPool(2, timeout_s=120)
    pids = pool.pids
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="within 2 s"):
        pool.run(_hang, timeout_s=2)
    assert time.monotonic() - start < 10
    assert wait_gone(pids) == []


@pytest.mark.distributed
def test_crashed_worker_is_reported() -> None:
    pool = L.WorkerPool(2, timeout_s=120)
    pids = pool.pids
    with pytest.raises(processes.WorkerError, match="exited with code 3") as info:
        pool.run(_crash)
    assert info.value.rank == 0
    assert wait_gone(pids) == []


