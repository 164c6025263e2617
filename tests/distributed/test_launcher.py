"""helpers.distributed.launcher (core): the worker pool and the torchrun launcher, with real processes.

Tests marked `distributed` start real worker processes (gloo on CPU). Each has a
deadline (SIGALRM), so a hung collective fails the test instead of hanging CI.
"""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from helpers.distributed import launcher as L
from helpers.distributed import processes, torchrun


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "zombie" in status.read_text())


def _wait_gone(pids: list[int], within_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            return []
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


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
    assert _wait_gone(pids) == []
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
    assert _wait_gone(pids) == []


@pytest.mark.distributed
def test_crashed_worker_is_reported() -> None:
    pool = L.WorkerPool(2, timeout_s=120)
    pids = pool.pids
    with pytest.raises(processes.WorkerError, match="exited with code 3") as info:
        pool.run(_crash)
    assert info.value.rank == 0
    assert _wait_gone(pids) == []


_SCRIPT = """
import os, sys, time
import torch.distributed as dist
from helpers.distributed.torchrun import run_main, save_result

def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if sys.argv[1] == "fail" and rank == 1:
        raise KeyError("rank 1 lost its key")
    with open(os.path.join(sys.argv[2], f"started-{rank}"), "w") as f:  # this worker is up
        f.write(str(os.getpid()))
    if sys.argv[1] == "hang":
        time.sleep(600)
    dist.barrier()
    save_result({"rank": rank, "world": dist.get_world_size(), "arg": sys.argv[1], "parent": os.getppid()})
    dist.destroy_process_group()

if __name__ == "__main__":
    run_main(main)
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "worker.py"
    path.write_text(textwrap.dedent(_SCRIPT))
    return path


def _worker_pids(script: Path, markers: Path) -> list[int]:
    """The workers still running: by command line (torchrun's), or by the pid each one wrote (either)."""
    pids = {int(p.read_text()) for p in markers.glob("started-*") if p.read_text()}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(script).encode() in cmdline.read_bytes():
                pids.add(int(cmdline.parent.name))
        except OSError:
            continue
    return sorted(pids)


@pytest.fixture(params=["spawn", "fork"])
def start(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways run_torchrun starts workers: the real torchrun, and forks with its environment."""
    monkeypatch.setenv(processes.POOL_START_ENV, request.param)
    return request.param


@pytest.mark.distributed
def test_torchrun_results_and_failure(script: Path, tmp_path: Path, start: str) -> None:
    results = torchrun.run_torchrun(script, 2, "ok", str(tmp_path), timeout_s=180)
    parents = {r.pop("parent") for r in results}
    assert results == [{"rank": 0, "world": 2, "arg": "ok"}, {"rank": 1, "world": 2, "arg": "ok"}]
    assert (parents == {os.getpid()}) == (start == "fork")  # forks of this process, or torchrun's children
    with pytest.raises(processes.WorkerError, match="rank 1 lost its key") as info:
        torchrun.run_torchrun(script, 2, "fail", str(tmp_path), timeout_s=180)
    assert info.value.rank == 1
    assert len(list(tmp_path.glob("started-*"))) == 2
    assert _wait_gone(_worker_pids(script, tmp_path)) == []


@pytest.mark.distributed
def test_torchrun_timeout_kills_everything(script: Path, tmp_path: Path, start: str) -> None:
    # Both workers must be up (hanging) when the deadline strikes. They start in about 5 s on an
    # idle 2-core machine; on a loaded one, try again with a longer deadline rather than pass
    # without having killed running workers.
    for timeout_s in (8, 30):
        markers = tmp_path / f"deadline-{timeout_s}"
        markers.mkdir()
        with pytest.raises(TimeoutError, match="did not finish"):
            torchrun.run_torchrun(script, 2, "hang", str(markers), timeout_s=timeout_s)
        assert _wait_gone(_worker_pids(script, markers)) == []
        if len(list(markers.glob("started-*"))) == 2:
            break
    assert sorted(p.name for p in markers.glob("started-*")) == ["started-0", "started-1"], (
        "the workers never started, so the timeout killed nothing")

