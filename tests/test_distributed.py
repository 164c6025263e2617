"""Tests for helpers.distributed (lesson 07): the launchers, DDP gradients, batch bookkeeping.

Tests marked `distributed` start real worker processes (gloo on CPU). Each has a
deadline (SIGALRM), so a hung collective fails the test instead of hanging CI.
"""

from __future__ import annotations

import os
import signal
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from helpers import distributed as D
from helpers.accumulation import compare_grads, full_batch_grad

DEADLINE_S = 240


@pytest.fixture(autouse=True)
def _deadline(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("distributed") is None:
        yield
        return

    def expired(*_: object) -> None:
        raise TimeoutError(f"test ran past its {DEADLINE_S} s deadline")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(DEADLINE_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


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
    dist.barrier()


# -- batch bookkeeping ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "field", "value"),
    [
        ((None, 4, 8, 2), "train_batch", 64),
        ((64, None, 8, 2), "micro_batch", 4),
        ((64, 4, None, 2), "accumulation_steps", 8),
        ((64, 4, 8, None), "world_size", 2),
        ((64, 4, 8, 2), "world_size", 2),
    ],
)
def test_check_batch_sizes_infers_the_fourth(args: tuple, field: str, value: int) -> None:
    sizes = D.check_batch_sizes(*args)
    assert getattr(sizes, field) == value
    assert sizes.train_batch == sizes.micro_batch * sizes.accumulation_steps * sizes.world_size
    assert "4 (B) x 8 (K) x 2 (W) = 64" in str(sizes)


def test_check_batch_sizes_inconsistent_shows_every_number() -> None:
    with pytest.raises(ValueError, match="train_batch") as info:
        D.check_batch_sizes(512, 16, 4, 4)
    for number in ("512", "16", "4", "256"):
        assert number in str(info.value)


def test_check_batch_sizes_non_integer_and_missing() -> None:
    with pytest.raises(ValueError, match=r"100 / 3 x 2 = 16\.67"):
        D.check_batch_sizes(100, 3, None, 2)
    with pytest.raises(ValueError, match="at least three"):
        D.check_batch_sizes(64, None, None, 2)
    with pytest.raises(TypeError):
        D.check_batch_sizes(64.0, 4, 8, None)
    with pytest.raises(TypeError):
        D.check_batch_sizes(None, True, 8, 2)
    with pytest.raises(ValueError):
        D.check_batch_sizes(None, 0, 8, 2)


def test_rank_shards_use_every_example_once() -> None:
    shards = D.rank_shards(24, 3, 4, 2)
    flat = [i for rank in shards for step in rank for i in step]
    assert sorted(flat) == list(range(24))
    assert len(shards) == 2 and all(len(rank) == 4 for rank in shards)
    assert all(len(step) == 3 for rank in shards for step in rank)


def test_exercise_checkers() -> None:
    assert D.check_exercise_1(8).startswith("Correct")
    assert not D.check_exercise_1(4).startswith("Correct")
    assert D.check_exercise_2((1, 0)).startswith("Correct")
    assert not D.check_exercise_2((8, 7)).startswith("Correct")
    assert not D.check_exercise_2("one").startswith("Correct")
    assert D.check_exercise_3(1.0).startswith("Correct")
    assert not D.check_exercise_3(4).startswith("Correct")
    assert not D.check_exercise_3(True).startswith("Correct")


def test_predicted_peak_fits_the_scale_budgets() -> None:
    assert D.predicted_peak_bytes("medium") <= 0.7 * 12e9
    assert D.predicted_peak_bytes("full") <= 0.7 * 40e9
    assert D.predicted_peak_bytes("tiny") < D.predicted_peak_bytes("small") < D.predicted_peak_bytes("full")
    with pytest.raises(ValueError, match="scale"):
        D.predicted_peak_bytes("huge")


def test_argument_checks() -> None:
    with pytest.raises(TypeError):
        D.count_allreduces(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError):
        D.WorkerPool(True)
    with pytest.raises(ValueError):
        D.WorkerPool(0)
    x, y = D.lesson_data(8)
    with pytest.raises(ValueError, match="not equal"):
        D.ddp_accumulated_grad(D.lesson_model, D.mse_loss, x, y, micro_batch=2, accumulation_steps=2,
                               world_size=3)
    with pytest.raises(ValueError, match="does not exist"):
        D.run_torchrun("/nonexistent/worker.py", 2)


# -- the launchers (real processes) --------------------------------------------------------------
@pytest.mark.distributed
def test_launch_returns_every_rank_result() -> None:
    results = D.launch(_rank_and_sum, 2, timeout_s=120)
    assert results == [(0, 2, 3.0), (1, 2, 3.0)]


@pytest.mark.distributed
def test_failing_worker_raises_promptly_with_rank_and_message_and_leaves_no_process() -> None:
    pool = D.WorkerPool(2, timeout_s=120)
    pids = pool.pids
    start = time.monotonic()
    with pytest.raises(D.WorkerError, match="boom from rank 1") as info:
        pool.run(_fail_on_rank_1)
    assert time.monotonic() - start < 15, "the parent must not wait for the timeout"
    assert info.value.rank == 1
    assert pool.closed
    assert _wait_gone(pids) == []
    with pytest.raises(RuntimeError, match="closed"):
        pool.run(_rank_and_sum)


@pytest.mark.distributed
def test_hanging_worker_times_out_and_is_killed() -> None:
    pool = D.WorkerPool(2, timeout_s=120)
    pids = pool.pids
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="within 2 s"):
        pool.run(_hang, timeout_s=2)
    assert time.monotonic() - start < 10
    assert _wait_gone(pids) == []


@pytest.mark.distributed
def test_crashed_worker_is_reported() -> None:
    pool = D.WorkerPool(2, timeout_s=120)
    pids = pool.pids
    with pytest.raises(D.WorkerError, match="exited with code 3") as info:
        pool.run(_crash)
    assert info.value.rank == 0
    assert _wait_gone(pids) == []


_SCRIPT = """
import os, sys, time
import torch.distributed as dist
from helpers.distributed import run_main, save_result

def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if sys.argv[1] == "fail" and rank == 1:
        raise KeyError("rank 1 lost its key")
    if sys.argv[1] == "hang":
        time.sleep(600)
    dist.barrier()
    save_result({"rank": rank, "world": dist.get_world_size(), "arg": sys.argv[1]})
    dist.destroy_process_group()

if __name__ == "__main__":
    run_main(main)
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "worker.py"
    path.write_text(textwrap.dedent(_SCRIPT))
    return path


def _worker_pids(script: Path) -> list[int]:
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(script).encode() in cmdline.read_bytes():
                pids.append(int(cmdline.parent.name))
        except OSError:
            continue
    return pids


@pytest.mark.distributed
def test_torchrun_results_and_failure(script: Path) -> None:
    assert D.run_torchrun(script, 2, "ok", timeout_s=180) == [
        {"rank": 0, "world": 2, "arg": "ok"}, {"rank": 1, "world": 2, "arg": "ok"}]
    with pytest.raises(D.WorkerError, match="rank 1 lost its key") as info:
        D.run_torchrun(script, 2, "fail", timeout_s=180)
    assert info.value.rank == 1
    assert _wait_gone(_worker_pids(script)) == []


@pytest.mark.distributed
def test_torchrun_timeout_kills_everything(script: Path) -> None:
    with pytest.raises(TimeoutError, match="did not finish"):
        D.run_torchrun(script, 2, "hang", timeout_s=20)
    assert _wait_gone(_worker_pids(script)) == []


# -- DDP gradients (one shared pool) -------------------------------------------------------------
@pytest.fixture(scope="module")
def pool() -> Iterator[D.WorkerPool]:
    with D.WorkerPool(2, timeout_s=180) as p:
        yield p


@pytest.mark.distributed
@pytest.mark.parametrize(("b", "k", "w"), [(4, 2, 2), (2, 4, 2), (8, 1, 2), (4, 4, 1)])
def test_ddp_gradient_equals_full_batch(pool: D.WorkerPool, b: int, k: int, w: int) -> None:
    x, y = D.lesson_data(b * k * w, seed=1)
    ref = full_batch_grad(D.lesson_model(), D.mse_loss, x, y)
    for no_sync, calls in ((True, 1), (False, k)):
        got = D.ddp_accumulated_grad(D.lesson_model, D.mse_loss, x, y, micro_batch=b, accumulation_steps=k,
                                     world_size=w, no_sync=no_sync, pool=pool)
        assert compare_grads(ref, got.grad).max_rel <= 1e-5
        assert got.ranks_agree
        assert got.allreduce_calls == calls
        assert got.synced_steps == ([False] * (k - 1) + [True] if no_sync else [True] * k)
        flat = sorted(i for rank in got.indices for step in rank for i in step)
        assert flat == list(range(b * k * w))


@pytest.mark.distributed
def test_same_data_on_every_rank_breaks_the_match(pool: D.WorkerPool) -> None:
    x, y = D.lesson_data(16, seed=1)
    ref = full_batch_grad(D.lesson_model(), D.mse_loss, x, y)
    got = D.ddp_accumulated_grad(D.lesson_model, D.mse_loss, x, y, micro_batch=4, accumulation_steps=2,
                                 world_size=2, same_data=True, pool=pool)
    assert compare_grads(ref, got.grad).max_rel > 1e-2
    assert got.indices[0] == got.indices[1]


@pytest.mark.distributed
def test_widget_report(pool: D.WorkerPool) -> None:
    report = D.data_parallel_report(2, 3, 2, pool=pool)
    assert report.sizes.train_batch == 12
    assert (report.calls_no_sync, report.calls_every_step) == (1, 3)
    assert report.diff.max_rel <= 1e-5 and report.ranks_agree
    import matplotlib.pyplot as plt

    plt.close(D.draw_report(report))
