"""Tests for helpers.distributed (lesson 07): DDP gradients with accumulation, batch bookkeeping, the widget.

The launchers themselves are tested in tests/test_launcher.py. Tests marked
`distributed` start real worker processes (gloo on CPU). Each has a deadline
(SIGALRM), so a hung collective fails the test instead of hanging CI.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from helpers import distributed as D
from helpers.accumulation import compare_grads, full_batch_grad
from helpers.launcher import WorkerPool


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
    x, y = D.lesson_data(8)
    with pytest.raises(ValueError, match="not equal"):
        D.ddp_accumulated_grad(D.lesson_model, D.mse_loss, x, y, micro_batch=2, accumulation_steps=2,
                               world_size=3)
    with pytest.raises(TypeError, match="inputs"):
        D.ddp_accumulated_grad(D.lesson_model, D.mse_loss, x.tolist(), y, micro_batch=2,
                               accumulation_steps=2, world_size=2)


# -- DDP gradients (one shared pool) -------------------------------------------------------------
@pytest.fixture(scope="module")
def pool() -> Iterator[WorkerPool]:
    with WorkerPool(2, timeout_s=180) as p:
        yield p


@pytest.mark.distributed
@pytest.mark.parametrize(("b", "k", "w"), [(4, 2, 2), (2, 4, 2), (8, 1, 2), (4, 4, 1)])
def test_ddp_gradient_equals_full_batch(pool: WorkerPool, b: int, k: int, w: int) -> None:
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
def test_same_data_on_every_rank_breaks_the_match(pool: WorkerPool) -> None:
    x, y = D.lesson_data(16, seed=1)
    ref = full_batch_grad(D.lesson_model(), D.mse_loss, x, y)
    got = D.ddp_accumulated_grad(D.lesson_model, D.mse_loss, x, y, micro_batch=4, accumulation_steps=2,
                                 world_size=2, same_data=True, pool=pool)
    assert compare_grads(ref, got.grad).max_rel > 1e-2
    assert got.indices[0] == got.indices[1]


@pytest.mark.distributed
def test_widget_report(pool: WorkerPool) -> None:
    report = D.data_parallel_report(2, 3, 2, pool=pool)
    assert report.sizes.train_batch == 12
    assert (report.calls_no_sync, report.calls_every_step) == (1, 3)
    assert report.diff.max_rel <= 1e-5 and report.ranks_agree
    import matplotlib.pyplot as plt

    plt.close(D.draw_report(report))


def test_fsdp_runs_here_by_backend_and_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    from helpers import distributed

    assert distributed.fsdp_runs_here("nccl") == (True, "")
    monkeypatch.setattr(distributed.torch, "__version__", "2.5.1+cu124")
    ok, why = distributed.fsdp_runs_here("gloo")
    assert not ok and "2.6" in why and "2.5.1" in why
    monkeypatch.setattr(distributed.torch, "__version__", "2.13.0+cpu")
    assert distributed.fsdp_runs_here("gloo") == (True, "")
    with pytest.raises(ValueError, match="backend"):
        distributed.fsdp_runs_here("mpi")
