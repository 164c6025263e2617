"""Tests for helpers.distributed (lesson 07): DDP gradients with accumulation, batch bookkeeping, the widget.

The launchers themselves are tested in tests/test_launcher.py. Tests marked
`distributed` start real worker processes (gloo on CPU). Each has a deadline
(SIGALRM), so a hung collective fails the test instead of hanging CI.
"""

from __future__ import annotations

import dataclasses
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
    given = "(given: train_batch=512, micro_batch=16, accumulation_steps=4, world_size=4)"
    assert str(info.value).endswith(given)
    with pytest.raises(ValueError, match=r"^give at least three of the four batch sizes; got nothing \("):
        D.check_batch_sizes()


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
    # contiguous blocks of B, rank 0 first (written out by hand for n=8, B=2, K=2, W=2)
    assert D.rank_shards(8, 2, 2, 2) == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]


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


def test_argument_names_start_the_messages() -> None:
    with pytest.raises(ValueError, match="^width must"):
        D.lesson_model(width=0)
    with pytest.raises(ValueError, match="^depth must"):
        D.lesson_model(depth=0)
    with pytest.raises(ValueError, match="^n must"):
        D.lesson_data(0)
    with pytest.raises(ValueError, match="^scale="):
        D.predicted_peak_bytes("huge")
    x, y = D.lesson_data(8)
    kw = dict(micro_batch=2, accumulation_steps=2, world_size=2)
    with pytest.raises(TypeError, match="^no_sync must be a bool"):
        D.ddp_accumulated_grad(D.lesson_model, D.mse_loss, x, y, no_sync=1, **kw)
    with pytest.raises(TypeError, match="^same_data must be a bool"):
        D.ddp_accumulated_grad(D.lesson_model, D.mse_loss, x, y, same_data=0, **kw)


# -- model, data and sizes, counted by hand ------------------------------------------------------
def _n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_lesson_model_and_bn_model_sizes_and_seed() -> None:
    """Parameter counts by hand; weights are torch's seed-0 draw; the global RNG is left alone."""
    from helpers.models import ResidualMLP

    # 16 -> 64: 1088; each block: LayerNorm 128 + fc1 64*256+256 + fc2 256*64+64 = 33216; 64 -> 4: 260
    assert _n_params(D.lesson_model()) == 1088 + 2 * 33216 + 260 == 67780
    # 16 -> 32: 544; BatchNorm1d(32): 64; 32 -> 4: 132
    assert _n_params(D.bn_model()) == 544 + 64 + 132
    x, y = D.lesson_data(5)
    assert x.shape == (5, 16) and y.shape == (5, 4)
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    model, bn = D.lesson_model(8, 1), D.bn_model(8)
    assert torch.equal(torch.rand(3), expected_next)  # building them did not consume the global RNG
    torch.manual_seed(0)
    ref = ResidualMLP(16, 8, 1, 4)
    torch.manual_seed(0)
    ref_bn = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                                 torch.nn.Linear(8, 4))
    for got, want in ((model, ref), (bn, ref_bn)):
        for a, b in zip(got.state_dict().values(), want.state_dict().values(), strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("width", [3, 64])
def test_mlp_param_formula_matches_torchs_count(width: int) -> None:
    assert D._mlp_params(width) == _n_params(D.lesson_model(width))


@pytest.mark.parametrize(("workers", "w"), [(1, 1), (2, 2), (3, 2), (4, 4)])
def test_lesson_sizes_per_scale_and_worker_count(monkeypatch: pytest.MonkeyPatch, workers: int,
                                                 w: int) -> None:
    monkeypatch.setattr(D, "max_workers", lambda: workers)
    expected = {"tiny": (2, 2, 32), "small": (4, 4, 64), "medium": (8, 4, 128), "full": (8, 4, 256)}
    for scale, (b, k, width) in expected.items():
        assert D.lesson_sizes(scale) == {"B": b, "K": k, "W": w, "width": width}


def test_predicted_peak_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    """W x (16 bytes x params + 4 bytes x B x depth 2 x 11 x width), with params counted by torch."""
    monkeypatch.setattr(D, "max_workers", lambda: 2)
    tiny_params = _n_params(D.lesson_model(32))  # 17508
    assert D.predicted_peak_bytes("tiny") == 2 * (16 * tiny_params + 4 * 2 * 2 * 11 * 32) == 571520
    assert D.predicted_peak_bytes("small") == 2 * (16 * 67780 + 4 * 4 * 2 * 11 * 64) == 2214016


def test_local_bytes_counts_the_local_shard_once_per_tensor() -> None:
    class Shard:
        """A stand-in for a sharded DTensor: numel/element_size describe the whole, to_local() the shard."""

        def __init__(self, whole: torch.Tensor, local: torch.Tensor) -> None:
            self.whole, self.local = whole, local

        def numel(self) -> int:
            return self.whole.numel()

        def element_size(self) -> int:
            return self.whole.element_size()

        def to_local(self) -> torch.Tensor:
            return self.local

    sharded = Shard(torch.zeros(8), torch.zeros(2))
    tensors = [torch.zeros(3), None, torch.zeros(2, 2, dtype=torch.float64), sharded]
    assert D.local_bytes(tensors) == 3 * 4 + 4 * 8 + 2 * 4
    assert D.local_bytes([]) == 0


def test_results_are_frozen_and_the_counter_starts_empty() -> None:
    grad = D.DDPGrad(torch.zeros(2), 1, [True], True, 0.0, indices=[[[0, 1]]])
    sizes = D.BatchSizes(4, 2, 2, 1)
    report = D.DataParallelReport(sizes, 1, 2, None, True)
    for obj, name in ((grad, "allreduce_calls"), (sizes, "world_size"), (report, "calls_no_sync")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, 3)
    assert "indices" not in repr(grad)  # per-example lists stay out of the printed result
    counter = D.AllReduceCounter()
    assert counter.group is None and counter.calls == 0  # group None = torch's default process group


class _FakePool:
    """Stands in for a WorkerPool: records the call and returns canned per-rank results."""

    def __init__(self, world_size: int, results: list) -> None:
        self.world_size, self.results, self.calls = world_size, results, []

    def run(self, fn: object, *args: object, timeout_s: float) -> list:
        self.calls.append((fn, args, timeout_s))
        return self.results


def test_ddp_accumulated_grad_takes_rank_0_and_the_largest_spread(monkeypatch: pytest.MonkeyPatch) -> None:
    g0 = torch.tensor([1.0, 2.0])
    results = [
        {"grad": g0, "calls": 1, "synced": [False, True], "spread": 0.0, "indices": [[0, 1], [2, 3]]},
        {"grad": g0 + 0.5, "calls": 1, "synced": [False, True], "spread": 0.5, "indices": [[4, 5], [6, 7]]},
        None,  # a third worker, beyond the requested W = 2
    ]
    fake = _FakePool(3, results)
    requested = []
    monkeypatch.setattr(D, "shared_pool", lambda w: requested.append(w) or fake)
    monkeypatch.setattr(D, "max_workers", lambda: 3)
    x, y = D.lesson_data(8)
    got = D.ddp_accumulated_grad(D.lesson_model, D.mse_loss, x, y, micro_batch=2, accumulation_steps=2,
                                 world_size=2)  # pool=None: the shared pool of max(W, max_workers())
    assert requested == [3] and len(fake.calls) == 1
    assert torch.equal(got.grad, g0) and got.allreduce_calls == 1 and got.synced_steps == [False, True]
    assert not got.ranks_agree and got.rank_spread == 0.5
    assert got.indices == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    args, timeout_s = fake.calls[0][1], fake.calls[0][2]
    assert args[-2:] == (True, False)  # defaults: no_sync=True, same_data=False
    assert timeout_s == 120.0
    results[1]["spread"] = 0.0
    mine = _FakePool(2, results[:2])
    assert D.ddp_accumulated_grad(D.lesson_model, D.mse_loss, x, y, micro_batch=2, accumulation_steps=2,
                                  world_size=2, pool=mine).ranks_agree
    assert requested == [3] and len(mine.calls) == 1  # a pool given is the pool used
    with pytest.raises(ValueError, match=r"^world_size=4 is larger than the pool \(2 workers\)"):
        D.ddp_accumulated_grad(D.lesson_model, D.mse_loss, x, y, micro_batch=1, accumulation_steps=2,
                               world_size=4, pool=mine)


def test_report_compares_with_one_process_on_seed_0_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """data_parallel_report with a stand-in for the DDP run: what it passes on and how it combines."""
    seen = []

    def fake_ddp(model_fn, loss_fn, x, y, *, no_sync, **kw):  # noqa: ANN001, ANN003, ANN202
        seen.append((model_fn, x, no_sync, kw))
        grad = full_batch_grad(model_fn(), loss_fn, x, y)  # exactly the one-process gradient
        return D.DDPGrad(grad, 1 if no_sync else kw["accumulation_steps"], [], ranks_agree=not no_sync,
                         rank_spread=0.0, indices=[])

    monkeypatch.setattr(D, "ddp_accumulated_grad", fake_ddp)
    pool = object()
    report = D.data_parallel_report(2, 3, 2, pool=pool)
    assert report.sizes == D.BatchSizes(12, 2, 3, 2)
    assert (report.calls_no_sync, report.calls_every_step) == (1, 3)
    assert report.diff.max_rel == 0.0
    assert not report.ranks_agree  # the no_sync run disagreed, so the report does
    assert [s[2] for s in seen] == [True, False]
    for model_fn, x, _, kw in seen:
        assert _n_params(model_fn()) == 67780  # default width 64
        assert torch.equal(x, D.lesson_data(12, seed=0)[0])  # default seed 0
        assert kw == {"micro_batch": 2, "accumulation_steps": 3, "world_size": 2, "pool": pool}


def test_widget_latency_cases_move_one_slider_each(monkeypatch: pytest.MonkeyPatch) -> None:
    started, shown = [], []
    monkeypatch.setattr(D, "max_workers", lambda: 4)
    monkeypatch.setattr(D, "shared_pool", started.append)
    monkeypatch.setattr(D, "show_data_parallel", lambda b, k, w, *, width: shown.append((b, k, w, width)))
    cases = D.widget_latency_cases("tiny", torch.device("cpu"))
    assert started == [4]
    for case in cases.values():
        case()
    # tiny: B=2, K=2, W=4 (4 workers), width 32; each case moves one slider
    assert dict(zip(cases, shown, strict=True)) == {
        "B=4": (4, 2, 4, 32), "B=1": (1, 2, 4, 32), "K=1": (2, 1, 4, 32), "K=4": (2, 4, 4, 32),
        "W=1": (2, 2, 1, 32), "W=4": (2, 2, 4, 32),
    }


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
    assert got.indices[0] == got.indices[1] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # rank 0's examples everywhere
    # so the update is the gradient of rank 0's 8 examples alone
    rank0 = full_batch_grad(D.lesson_model(), D.mse_loss, x[:8], y[:8])
    assert compare_grads(rank0, got.grad).max_rel <= 1e-5
    assert got.allreduce_calls == 1 and got.synced_steps == [False, True]  # no_sync=True by default


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

    monkeypatch.setattr(distributed.torch, "__version__", "2.5.1+cu124")
    assert distributed.fsdp_runs_here("nccl") == (True, "")  # NCCL runs it whatever the version
    ok, why = distributed.fsdp_runs_here("gloo")
    assert not ok and "2.6" in why and "2.5.1" in why
    monkeypatch.setattr(distributed.torch, "__version__", "2.6.0+cpu")
    assert distributed.fsdp_runs_here("gloo") == (True, "")  # 2.6 is the first that does
    monkeypatch.setattr(distributed.torch, "__version__", "2.13.0+cpu")
    assert distributed.fsdp_runs_here("gloo") == (True, "")
    with pytest.raises(ValueError, match="backend"):
        distributed.fsdp_runs_here("mpi")


# -- FSDP2: the persistent state is 1/W, the peak is not ------------------------------------------
# counted_model(256, 3), counted by hand: the root keeps inp (16 x 256) and out (256 x 4), each of the
# 3 units is one 256 x 256 weight; fp32, no biases; Adam keeps two moments and one 4-byte step per tensor.
UNIT = 256 * 256 * 4  # 262,144 bytes: one unit's weights, and as much again for its full gradients
ROOT = (16 * 256 + 256 * 4) * 4  # 20,480 bytes
PARAMS = ROOT + 3 * UNIT  # 806,912 bytes
STEPS = 5 * 4  # Adam's step counters: one 4-byte scalar per parameter tensor


def test_counted_model_is_counted_by_hand() -> None:
    model = D.counted_model()
    assert [p.numel() * 4 for p in model.blocks.parameters()] == [UNIT] * 3
    assert sum(p.numel() * 4 for p in [*model.inp.parameters(), *model.out.parameters()]) == ROOT
    assert sum(p.numel() * 4 for p in model.parameters()) == PARAMS
    assert model(torch.zeros(2, 16)).shape == (2, 4)
    torch.manual_seed(5)
    expected = torch.rand(2)
    torch.manual_seed(5)
    again = D.counted_model()
    assert torch.equal(torch.rand(2), expected)  # the global RNG is left alone
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(), strict=True))
    with pytest.raises(ValueError, match="^depth must"):
        D.counted_model(depth=0)


def test_fsdp_parts_cover_every_category_of_torchs_tracker_once() -> None:
    """Nothing FSDPMemTracker measures falls outside the lesson's parts, and nothing counts twice."""
    from torch.distributed._tools.fsdp2_mem_tracker import _FSDPRefType

    named = [name for names in D.FSDP_PARTS.values() for name in names]
    assert len(named) == len(set(named))
    assert {t.value for t in _FSDPRefType} <= set(named)  # a category torch adds later shows as "other"


def test_fsdp_step_memory_and_rank_memory_check_their_arguments() -> None:
    with pytest.raises(ValueError, match="^step must be a zero-argument callable"):
        D.fsdp_step_memory(3, model=torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="^model must be a module that fully_shard was applied to, got Lin"):
        D.fsdp_step_memory(lambda: None, model=torch.nn.Linear(2, 2))
    fake = _FakePool(2, [])
    with pytest.raises(ValueError, match=r"^world_size=4 is larger than the pool \(2 workers\)"):
        D.fsdp_rank_memory(D.counted_model, world_size=4, pool=fake)
    with pytest.raises(ValueError, match="^micro_batch must"):
        D.fsdp_rank_memory(D.counted_model, world_size=2, micro_batch=0, pool=fake)
    assert fake.calls == []


def test_draw_fsdp_memory_shows_state_persistent_and_peak() -> None:
    import matplotlib.pyplot as plt

    state = {"parameters": 4, "gradients": 4, "optimizer_state": 8}
    persistent = {k: v // 2 for k, v in state.items()}
    peak = D.FSDPStepMemory(20, {"sharded_state": 8, "gathered_parameters": 6, "unsharded_gradients": 4,
                                 "activations": 2, "other": 0}, [1, 1], D.FSDP_TRACKER)
    fig = D.draw_fsdp_memory(state, persistent, peak, {"sync_every_step": [2, 2], "sync_off": [4, 2]}, 2)
    left = fig.axes[0]
    ticks = [t.get_text() for t in left.get_xticklabels()]
    assert ticks == ["DDP:\nstate", "FSDP:\npersistent", "FSDP:\npeak"]
    assert left.get_lines()[0].get_ydata()[0] == 8  # the 1/W line: 16 B / 2, in bytes (B)
    peak_stack = [p.get_height() for p in left.patches if abs(p.get_x() + 0.3 - 2) < 1e-9]  # bars at x = 2
    assert sum(peak_stack) == 20
    plt.close(fig)


@pytest.fixture(scope="module")
def pool4() -> Iterator[WorkerPool]:
    with WorkerPool(4, timeout_s=180) as p:
        yield p


@pytest.mark.distributed
@pytest.mark.parametrize("w", [2, 4])
def test_fsdp_peak_is_not_1_over_w_hand_counted(pool4: WorkerPool, w: int) -> None:
    """A real FSDP2 update (gloo, W ranks) against bytes counted by hand for counted_model.

    The persistent state is exactly 1/W; the peak holds at least the root's weights, one whole
    gathered unit and one unit's full gradients on top of the pieces, so a plan that used 1/W for
    the peak is caught; and it stays under 1/W + 2 x root + 5 units + the (small) activations.
    """
    ok, why = D.fsdp_runs_here("gloo")
    if not ok:
        pytest.skip(why)
    ranks = D.fsdp_rank_memory(D.counted_model, world_size=w, micro_batch=4, pool=pool4)
    assert len(ranks) == w
    one_over_w = 4 * PARAMS // w + STEPS  # parameters, gradients and Adam's two moments, each 1/W
    for r in ranks:
        mem = r.step
        assert r.persistent_bytes == one_over_w
        assert mem.method == D.FSDP_TRACKER and sum(mem.breakdown.values()) == mem.peak_bytes
        # pieces of the weights and Adam's moments + the root + one gathered unit + that unit's full gradients
        assert mem.peak_bytes >= 3 * PARAMS // w + ROOT + UNIT + UNIT
        assert mem.peak_bytes > one_over_w + UNIT  # the 1/W plan is at least a unit short
        assert ROOT + UNIT <= mem.breakdown["gathered_parameters"] <= ROOT + 2 * UNIT
        assert mem.breakdown["unsharded_gradients"] >= UNIT
        assert mem.breakdown["sharded_state"] <= one_over_w
        assert mem.gathered_after_forward == [ROOT] * 3  # after each unit's forward only the root stays
        assert mem.peak_bytes <= one_over_w + 2 * ROOT + 5 * UNIT + 64 * 1024


@pytest.mark.cuda
@pytest.mark.distributed
def test_fsdp_peak_on_cuda_comes_from_the_caching_allocator() -> None:
    """One GPU, one rank (NCCL): the peak is the allocator's, at least the hand-counted bytes."""
    with WorkerPool(1, timeout_s=180) as one_gpu:
        (rank0,) = D.fsdp_rank_memory(D.counted_model, world_size=1, micro_batch=4, pool=one_gpu)
    mem = rank0.step
    assert mem.method == "cuda-allocator"
    assert rank0.persistent_bytes == 4 * PARAMS + STEPS  # W = 1: the whole state
    assert sum(mem.breakdown.values()) == mem.peak_bytes and mem.breakdown["other"] >= 0
    # the weights and Adam's moments + the root's gathered copy + a unit's gathered copy + its gradients
    assert mem.peak_bytes >= 3 * PARAMS + ROOT + UNIT + UNIT
