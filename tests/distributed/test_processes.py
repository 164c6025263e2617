"""helpers.distributed.processes (core): the backend and worker count for this machine, and the plumbing
every launcher's workers share (the error a failed worker raises, its log's tail, the kill).

The machine is stood in for where the rule needs hardware this one may not have (GPUs, NCCL, a
core count): each rule is checked against its statement, case by case. No worker pool starts here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from helpers.distributed import processes


def _machine(monkeypatch: pytest.MonkeyPatch, gpus: int, cores: int | None = 2, nccl: bool = True) -> None:
    """This process sees `gpus` CUDA devices, `cores` CPU cores and NCCL if `nccl`."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: nccl)
    monkeypatch.setattr(processes.os, "cpu_count", lambda: cores)


@pytest.mark.parametrize(("gpus", "nccl", "world_size", "backend"), [
    (0, False, 1, "gloo"),  # a CPU machine
    (0, True, 2, "gloo"),
    (2, True, 2, "nccl"),  # one GPU per worker, and NCCL
    (2, True, 1, "nccl"),
    (2, True, 3, "gloo"),  # more workers than GPUs: the CPU
    (4, False, 2, "gloo"),  # GPUs without NCCL
])
def test_pick_backend_takes_nccl_only_with_a_gpu_per_worker(monkeypatch: pytest.MonkeyPatch, gpus: int,
                                                           nccl: bool, world_size: int, backend: str) -> None:
    _machine(monkeypatch, gpus, nccl=nccl)
    assert processes.pick_backend(world_size) == backend


def test_pick_backend_refuses_a_world_without_workers() -> None:
    with pytest.raises(ValueError, match="^world_size must"):
        processes.pick_backend(0)
    with pytest.raises(TypeError, match="world_size"):
        processes.pick_backend(True)


@pytest.mark.parametrize(("gpus", "cores", "workers"), [
    (0, 1, 1), (0, 2, 2), (0, 3, 3), (0, 64, 4),  # the CPU cores, at most 4
    (0, None, 1),  # os.cpu_count() may not know: one worker
    (1, 16, 4),  # one GPU is not enough for data parallelism on GPUs: the CPU's
    (2, 16, 2), (3, 1, 3), (8, 1, 4),  # the GPUs, at most 4
])
def test_max_workers_offers_the_gpus_or_else_the_cores(monkeypatch: pytest.MonkeyPatch, gpus: int,
                                                       cores: int | None, workers: int) -> None:
    _machine(monkeypatch, gpus, cores)
    assert processes.max_workers() == workers


def test_a_worker_error_names_its_rank() -> None:
    err = processes.WorkerError(1, "ValueError: boom")
    assert isinstance(err, RuntimeError) and (err.rank, err.message) == (1, "ValueError: boom")
    assert str(err) == "worker rank 1 failed: ValueError: boom"
    assert str(processes.WorkerError(None, "exited")) == "a worker failed: exited"


def test_the_tail_of_a_log_is_its_last_characters(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    text = "".join(f"line {i}\n" for i in range(1000))  # 8,890 characters
    log.write_text(text)
    assert processes._tail(log) == text[-processes.LOG_TAIL:] and len(processes._tail(log)) == 3000
    assert processes._tail(str(log), 7) == "ne 999\n"
    assert processes._tail(log, 10**6) == text  # a short log whole
    assert processes._tail(tmp_path / "never-written.log") == ""  # a worker that died before writing


def test_kill_ends_a_process_and_ignores_one_that_is_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        processes._kill(child.pid)
        assert child.wait(timeout=10) == -9  # SIGKILL
    finally:
        child.kill()
        child.wait()
    no_such_pid = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # above every pid Linux gives
    processes._kill(no_such_pid)  # a process already gone: no error
