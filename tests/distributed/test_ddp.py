"""Tests for helpers.distributed (lesson 07): DDP gradients with accumulation, batch bookkeeping, the widget.

The launchers themselves are tested in tests/distributed/test_launcher.py. Tests marked
`distributed` start real worker processes (gloo on CPU). Each has a deadline
(SIGALRM), so a hung collective fails the test instead of hanging CI.
"""

from __future__ import annotations

import dataclasses
import pathlib

import pytest
import torch

from helpers.distributed import ddp as D
from helpers.distributed.launcher import WorkerPool
from helpers.techniques.accumulation import compare_grads, full_batch_grad


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


def test_argument_checks() -> None:
    with pytest.raises(TypeError):
        D.count_allreduces(torch.nn.Linear(2, 2))
    x, y = D.lesson_data(8)
    with pytest.raises(ValueError, match="not equal"):
        D.ddp_accumulated_grad(D.replica_model, D.mse_loss, x, y, micro_batch=2, accumulation_steps=2,
                               world_size=3)
    with pytest.raises(TypeError, match="inputs"):
        D.ddp_accumulated_grad(D.replica_model, D.mse_loss, x.tolist(), y, micro_batch=2,
                               accumulation_steps=2, world_size=2)


def test_argument_names_start_the_messages() -> None:
    with pytest.raises(ValueError, match="^width must"):
        D.replica_model(width=0)
    with pytest.raises(ValueError, match="^depth must"):
        D.replica_model(depth=0)
    with pytest.raises(ValueError, match="^n must"):
        D.lesson_data(0)
    x, y = D.lesson_data(8)
    kw = dict(micro_batch=2, accumulation_steps=2, world_size=2)
    with pytest.raises(TypeError, match="^no_sync must be a bool"):
        D.ddp_accumulated_grad(D.replica_model, D.mse_loss, x, y, no_sync=1, **kw)
    with pytest.raises(TypeError, match="^same_data must be a bool"):
        D.ddp_accumulated_grad(D.replica_model, D.mse_loss, x, y, same_data=0, **kw)


# -- model, data and sizes, counted by hand ------------------------------------------------------
def _n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_lesson_model_and_bn_model_sizes_and_seed() -> None:
    """Parameter counts by hand; weights are torch's seed-0 draw; the global RNG is left alone."""
    from helpers.models.nets import ResidualMLP

    # 16 -> 64: 1088; each block: LayerNorm 128 + fc1 64*256+256 + fc2 256*64+64 = 33216; 64 -> 4: 260
    assert _n_params(D.replica_model()) == 1088 + 2 * 33216 + 260 == 67780
    # 16 -> 32: 544; BatchNorm1d(32): 64; 32 -> 4: 132
    assert _n_params(D.bn_model()) == 544 + 64 + 132
    x, y = D.lesson_data(5)
    assert x.shape == (5, 16) and y.shape == (5, 4)
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    model, bn = D.replica_model(8, 1), D.bn_model(8)
    assert torch.equal(torch.rand(3), expected_next)  # building them did not consume the global RNG
    torch.manual_seed(0)
    ref = ResidualMLP(16, 8, 1, 4)
    torch.manual_seed(0)
    ref_bn = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                                 torch.nn.Linear(8, 4))
    for got, want in ((model, ref), (bn, ref_bn)):
        for a, b in zip(got.state_dict().values(), want.state_dict().values(), strict=True):
            assert torch.equal(a, b)


def test_results_are_frozen_and_the_counter_starts_empty() -> None:
    grad = D.DDPGrad(torch.zeros(2), 1, [True], True, 0.0, indices=[[[0, 1]]])
    sizes = D.BatchSizes(4, 2, 2, 1)
    for obj, name in ((grad, "allreduce_calls"), (sizes, "world_size")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, 3)
    assert "indices" not in repr(grad)  # per-example lists stay out of the printed result
    counter = D.AllReduceCounter()
    assert counter.group is None and counter.calls == 0  # group None = torch's default process group
    assert counter.buckets == 0


def test_the_hook_counts_every_bucket_and_each_last_one_as_a_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three buckets, the last one closing the backward: buckets 3, calls 1, each sent to DDP's all-reduce."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    sent = []
    monkeypatch.setattr(default_hooks, "allreduce_hook", lambda group, bucket: sent.append(bucket) or "fut")

    class Bucket:
        def __init__(self, last: bool) -> None:
            self.last = last

        def is_last(self) -> bool:
            return self.last

    counter = D.AllReduceCounter()
    buckets = [Bucket(False), Bucket(False), Bucket(True)]
    assert [D._counting_allreduce(counter, b) for b in buckets] == ["fut"] * 3
    assert (counter.buckets, counter.calls) == (3, 1) and sent == buckets




def test_ddp_accumulated_grad_takes_rank_0_and_the_largest_spread(
    fake_pool: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    g0 = torch.tensor([1.0, 2.0])
    results = [
        {"grad": g0, "calls": 1, "synced": [False, True], "spread": 0.0, "indices": [[0, 1], [2, 3]]},
        {"grad": g0 + 0.5, "calls": 1, "synced": [False, True], "spread": 0.5, "indices": [[4, 5], [6, 7]]},
        None,  # a third worker, beyond the requested W = 2
    ]
    fake = fake_pool(3, results)
    requested = []
    monkeypatch.setattr(D, "shared_pool", lambda w: requested.append(w) or fake)
    monkeypatch.setattr(D, "max_workers", lambda: 3)
    x, y = D.lesson_data(8)
    got = D.ddp_accumulated_grad(D.replica_model, D.mse_loss, x, y, micro_batch=2, accumulation_steps=2,
                                 world_size=2)  # pool=None: the shared pool of max(W, max_workers())
    assert requested == [3] and len(fake.calls) == 1
    assert torch.equal(got.grad, g0) and got.allreduce_calls == 1 and got.synced_steps == [False, True]
    assert not got.ranks_agree and got.rank_spread == 0.5
    assert got.indices == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    args, timeout_s = fake.calls[0][1], fake.calls[0][2]
    assert args[-2:] == (True, False)  # defaults: no_sync=True, same_data=False
    assert timeout_s == 120.0
    results[1]["spread"] = 0.0
    mine = fake_pool(2, results[:2])
    assert D.ddp_accumulated_grad(D.replica_model, D.mse_loss, x, y, micro_batch=2, accumulation_steps=2,
                                  world_size=2, pool=mine).ranks_agree
    assert requested == [3] and len(mine.calls) == 1  # a pool given is the pool used
    with pytest.raises(ValueError, match=r"^world_size=4 is larger than the pool \(2 workers\)"):
        D.ddp_accumulated_grad(D.replica_model, D.mse_loss, x, y, micro_batch=1, accumulation_steps=2,
                               world_size=4, pool=mine)


# -- DDP gradients (one shared pool) -------------------------------------------------------------


@pytest.mark.distributed
@pytest.mark.parametrize(("b", "k", "w"), [(4, 2, 2), (2, 4, 2), (8, 1, 2), (4, 4, 1), (3, 2, 2)])
def test_ddp_gradient_equals_full_batch(pool: WorkerPool, b: int, k: int, w: int) -> None:
    """DDP's accumulated gradient is the full batch's, for B*K*W = 16 examples and 12 (not D_IN = 16)."""
    x, y = D.lesson_data(b * k * w, seed=1)
    ref = full_batch_grad(D.replica_model(), D.mse_loss, x, y)
    for no_sync, calls in ((True, 1), (False, k)):
        got = D.ddp_accumulated_grad(D.replica_model, D.mse_loss, x, y, micro_batch=b, accumulation_steps=k,
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
    ref = full_batch_grad(D.replica_model(), D.mse_loss, x, y)
    got = D.ddp_accumulated_grad(D.replica_model, D.mse_loss, x, y, micro_batch=4, accumulation_steps=2,
                                 world_size=2, same_data=True, pool=pool)
    assert compare_grads(ref, got.grad).max_rel > 1e-2
    assert got.indices[0] == got.indices[1] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # rank 0's examples everywhere
    # so the update is the gradient of rank 0's 8 examples alone
    rank0 = full_batch_grad(D.replica_model(), D.mse_loss, x[:8], y[:8])
    assert compare_grads(rank0, got.grad).max_rel <= 1e-5
    assert got.allreduce_calls == 1 and got.synced_steps == [False, True]  # no_sync=True by default


# -- FSDP2: the persistent state is 1/W, the peak is not ------------------------------------------


def test_the_counter_counts_synchronised_backwards_not_buckets(tmp_path: pathlib.Path) -> None:
    """2 MiB of gradients in 1 MiB buckets: several bucket all-reduces, one call per backward."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 512))
        ddp = DDP(model, bucket_cap_mb=1)
        counter = D.count_allreduces(ddp)
        x = torch.randn(4, 512)
        for _ in range(3):
            ddp(x).sum().backward()
        with ddp.no_sync():
            ddp(x).sum().backward()  # no sync: neither count moves
        assert counter.calls == 3 and counter.buckets > counter.calls, counter  # 1 bucket before DDP rebuilds
    finally:
        dist.destroy_process_group()
