"""helpers.distributed.fsdp: local bytes, the FSDP2 tracker's parts, a rank's measured peak, by hand."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helpers.distributed import fsdp as F
from helpers.distributed.fsdp import (
    FSDP_PARTS,
    FSDP_TRACKER,
    FSDPRankMemory,
    FSDPStepMemory,
    LinearStack,
    counted_model,
    fsdp_rank_memory,
    fsdp_runs_here,
    fsdp_step_memory,
    local_bytes,
)
from helpers.distributed.launcher import WorkerPool


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
    assert local_bytes(tensors) == 3 * 4 + 4 * 8 + 2 * 4
    assert local_bytes([]) == 0


def test_fsdp_runs_here_by_backend_and_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    from helpers.distributed import ddp, fsdp

    monkeypatch.setattr(ddp.torch, "__version__", "2.5.1+cu124")
    assert fsdp.fsdp_runs_here("nccl") == (True, "")  # NCCL runs it whatever the version
    ok, why = fsdp.fsdp_runs_here("gloo")
    assert not ok and "2.6" in why and "2.5.1" in why
    monkeypatch.setattr(ddp.torch, "__version__", "2.6.0+cpu")
    assert fsdp.fsdp_runs_here("gloo") == (True, "")  # 2.6 is the first that does
    monkeypatch.setattr(ddp.torch, "__version__", "2.13.0+cpu")
    assert fsdp.fsdp_runs_here("gloo") == (True, "")
    with pytest.raises(ValueError, match="backend"):
        fsdp.fsdp_runs_here("mpi")


# counted_model(256, 3), counted by hand: the root keeps inp (16 x 256) and out (256 x 4), each of the
# 3 units is one 256 x 256 weight; fp32, no biases; Adam keeps two moments and one 4-byte step per tensor.
UNIT = 256 * 256 * 4  # 262,144 bytes: one unit's weights, and as much again for its full gradients


ROOT = (16 * 256 + 256 * 4) * 4  # 20,480 bytes


PARAMS = ROOT + 3 * UNIT  # 806,912 bytes


STEPS = 5 * 4  # Adam's step counters: one 4-byte scalar per parameter tensor


def test_counted_model_is_counted_by_hand() -> None:
    model = counted_model()
    assert [p.numel() * 4 for p in model.blocks.parameters()] == [UNIT] * 3
    assert sum(p.numel() * 4 for p in [*model.inp.parameters(), *model.out.parameters()]) == ROOT
    assert sum(p.numel() * 4 for p in model.parameters()) == PARAMS
    assert model(torch.zeros(2, 16)).shape == (2, 4)
    torch.manual_seed(5)
    expected = torch.rand(2)
    torch.manual_seed(5)
    again = counted_model()
    assert torch.equal(torch.rand(2), expected)  # the global RNG is left alone
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(), strict=True))
    with pytest.raises(ValueError, match="^depth must"):
        counted_model(depth=0)


def test_linear_stack_defaults_and_counted_models_seed() -> None:
    """LinearStack() is 16 -> 256, three 256 x 256 units, 256 -> 4; counted_model is it built after seed 0."""
    assert [tuple(p.shape) for p in LinearStack().parameters()] == [(256, 16), *[(256, 256)] * 3, (4, 256)]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        seed0 = LinearStack(256, 3)
    pairs = zip(counted_model().parameters(), seed0.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


def test_the_method_names_and_frozen_results() -> None:
    """The CPU method is named "fsdp-mem-tracker" (as FSDPStepMemory documents), and results are frozen."""
    assert FSDP_TRACKER == "fsdp-mem-tracker"
    step = FSDPStepMemory(1, {"other": 1}, [], FSDP_TRACKER)
    for obj, name in ((step, "peak_bytes"), (FSDPRankMemory(2, step), "persistent_bytes")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, 3)


def test_fsdp_rank_memory_defaults_to_the_shared_pool(fake_pool: type,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a pool it asks shared_pool for max(W, max_workers()) workers and checks W against that pool."""
    fake, asked = fake_pool(2, []), []
    monkeypatch.setattr(F, "max_workers", lambda: 3)
    monkeypatch.setattr(F, "shared_pool", lambda n: asked.append(n) or fake)
    with pytest.raises(ValueError, match=r"^world_size=4 is larger than the pool \(2 workers\)"):
        fsdp_rank_memory(counted_model, world_size=4)
    assert asked == [4] and fake.calls == []


def test_fsdp_rank_memory_sends_the_workers_its_defaults_and_keeps_w_ranks(fake_pool: type) -> None:
    """The workers get (model_fn, W, micro_batch 4, K 1) and 120 s; ranks beyond W (None) are dropped."""
    step = FSDPStepMemory(1, {"other": 1}, [], FSDP_TRACKER)
    fake = fake_pool(3, [{"persistent": 7, "step": step}, {"persistent": 8, "step": step}, None])
    assert fsdp_rank_memory(counted_model, world_size=2, pool=fake) == [FSDPRankMemory(7, step),
                                                                         FSDPRankMemory(8, step)]
    assert [(args, t) for _, args, t in fake.calls] == [((counted_model, 2, 4, 1), 120.0)]


def test_fsdp_parts_cover_every_category_of_torchs_tracker_once() -> None:
    """Nothing FSDPMemTracker measures falls outside the lesson's parts, and nothing counts twice."""
    from torch.distributed._tools.fsdp2_mem_tracker import _FSDPRefType

    named = [name for names in FSDP_PARTS.values() for name in names]
    assert len(named) == len(set(named))
    assert {t.value for t in _FSDPRefType} <= set(named)  # a category torch adds later shows as "other"


def test_fsdp_step_memory_and_rank_memory_check_their_arguments(fake_pool: type) -> None:
    with pytest.raises(ValueError, match="^step must be a zero-argument callable"):
        fsdp_step_memory(3, model=torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="^model must be a module that fully_shard was applied to, got Lin"):
        fsdp_step_memory(lambda: None, model=torch.nn.Linear(2, 2))
    fake = fake_pool(2, [])
    with pytest.raises(ValueError, match=r"^world_size=4 is larger than the pool \(2 workers\)"):
        fsdp_rank_memory(counted_model, world_size=4, pool=fake)
    with pytest.raises(ValueError, match="^micro_batch must"):
        fsdp_rank_memory(counted_model, world_size=2, micro_batch=0, pool=fake)
    assert fake.calls == []




@pytest.mark.distributed
@pytest.mark.parametrize(("w", "k"), [(2, 1), (4, 1), (2, 2)])
def test_fsdp_peak_is_not_1_over_w_hand_counted(pool4: WorkerPool, w: int, k: int) -> None:
    """A real FSDP2 update (gloo, W ranks) against bytes counted by hand for counted_model.

    The persistent state is exactly 1/W; the peak holds at least the root's weights, one whole
    gathered unit and one unit's full gradients on top of the pieces, so a plan that used 1/W for
    the peak is caught; and it stays under 1/W + 2 x root + 5 units + the (small) activations.
    """
    ok, why = fsdp_runs_here("gloo")
    if not ok:
        pytest.skip(why)
    ranks = fsdp_rank_memory(counted_model, world_size=w, micro_batch=4, accumulation_steps=k, pool=pool4)
    assert len(ranks) == w
    one_over_w = 4 * PARAMS // w + STEPS  # parameters, gradients and Adam's two moments, each 1/W
    for r in ranks:
        mem = r.step
        assert r.persistent_bytes == one_over_w
        assert mem.method == FSDP_TRACKER and sum(mem.breakdown.values()) == mem.peak_bytes
        assert set(mem.breakdown) == {*FSDP_PARTS, "other"} and mem.breakdown["other"] == 0  # all named
        # pieces of the weights and Adam's moments + the root + one gathered unit + that unit's full gradients
        assert mem.peak_bytes >= 3 * PARAMS // w + ROOT + UNIT + UNIT
        assert mem.peak_bytes > one_over_w + UNIT  # the 1/W plan is at least a unit short
        assert ROOT + UNIT <= mem.breakdown["gathered_parameters"] <= ROOT + 2 * UNIT
        assert mem.breakdown["unsharded_gradients"] >= UNIT
        assert mem.breakdown["sharded_state"] <= one_over_w
        # at the peak (in backward) a step that starts without gradients (K = 1) has made the gradient
        # shards of one or two of the last units (gloo's timing decides), never the root's and the first
        # unit's; with K = 2 the first micro-step made every shard
        pieces = 3 * PARAMS // w + STEPS
        if k == 1:
            assert pieces + UNIT // w <= mem.breakdown["sharded_state"] <= pieces + 2 * UNIT // w
        else:
            assert mem.breakdown["sharded_state"] == one_over_w
        assert mem.gathered_after_forward == [ROOT] * 3 * k  # after each unit's forward only the root stays
        assert mem.peak_bytes <= one_over_w + 2 * ROOT + 5 * UNIT + 64 * 1024


@pytest.mark.cuda
@pytest.mark.distributed
def test_fsdp_peak_on_cuda_comes_from_the_caching_allocator() -> None:
    """One GPU, one rank (NCCL): the peak is the allocator's, at least the hand-counted bytes."""
    with WorkerPool(1, timeout_s=180) as one_gpu:
        (rank0,) = fsdp_rank_memory(counted_model, world_size=1, micro_batch=4, pool=one_gpu)
    mem = rank0.step
    assert mem.method == "cuda-allocator"
    assert rank0.persistent_bytes == 4 * PARAMS + STEPS  # W = 1: the whole state
    assert sum(mem.breakdown.values()) == mem.peak_bytes and mem.breakdown["other"] >= 0
    # the weights and Adam's moments + the root's gathered copy + a unit's gathered copy + its gradients
    assert mem.peak_bytes >= 3 * PARAMS + ROOT + UNIT + UNIT
