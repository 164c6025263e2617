"""helpers.distributed.torchrun (core): a worker script under torchrun, or forked with its environment.

Both ways of starting the workers (`LESSONS_POOL_START`: the real torchrun, and forks) return each
rank's result, report a failing rank with its message, and leave no process behind on failure or
timeout. Tests marked `distributed` start real worker processes (gloo on CPU) under a deadline.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from support.workers import wait_gone

from helpers.distributed import processes, torchrun

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
    assert wait_gone(_worker_pids(script, tmp_path)) == []


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
        assert wait_gone(_worker_pids(script, markers)) == []
        if len(list(markers.glob("started-*"))) == 2:
            break
    assert sorted(p.name for p in markers.glob("started-*")) == ["started-0", "started-1"], (
        "the workers never started, so the timeout killed nothing")
