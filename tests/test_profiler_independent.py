"""Profiler.step and the plan's check against something independent (issue 23, deliverable 6).

The other profiler tests compare a meta profile with a CPU profile through the same `Profiler.step`,
so a bookkeeping bug inside it cancels out on both sides. Here the expected values come from
outside it: `helpers.memory.measure_step` of a loop written out in the test (the CPU allocator's
record of the whole run, which knows nothing of phases or caches), and a fresh Profiler.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from helpers.core.data import BatchSpec
from helpers.measure.memory import measure_step
from helpers.meta.profiler import Profiler
from helpers.plan.report import plan_model


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(128, 512), nn.Tanh(), nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 8))


MLP_SPEC = BatchSpec.classifier((128,), 8)


def _hand_loop(model: nn.Module, optimizer: torch.optim.Optimizer, batches: list, loss_fn) -> None:  # noqa: ANN001
    """The explainer's loop, written out: K micro-steps, `predictions` alive until reassigned, one step."""
    optimizer.zero_grad(set_to_none=True)
    for x, y in batches:
        predictions = model(x)
        loss = loss_fn(predictions, y)
        (loss / len(batches)).backward()
    optimizer.step()


def _measured(build, spec: BatchSpec, b: int, k: int, optimizer: str = "sgd",  # noqa: ANN001
              wrapper=None) -> int:  # noqa: ANN001
    """The CPU allocator's peak of `_hand_loop` (the optimizer state created beforehand, as in training)."""
    torch.manual_seed(0)
    model = build()
    opt = {"sgd": lambda p: torch.optim.SGD(p, lr=1e-3),
           "adam": lambda p: torch.optim.Adam(p, lr=1e-3, foreach=False)}[optimizer](model.parameters())
    if optimizer == "adam":  # state exists in steady training
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
    if wrapper is not None:
        model.block_wrapper = wrapper
    batches = [spec.batch(b, "cpu", i) for i in range(k)]
    return measure_step(lambda: _hand_loop(model, opt, batches, spec.loss), model=model,
                        optimizer=opt).peak_bytes


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_k1_after_k2_on_one_profiler_matches_a_hand_written_loop(optimizer: str) -> None:
    """One Profiler asked for K = 2 and then K = 1 gives each the peak of its own hand-written loop.

    Sharing a cached result between K = 1 and K >= 2 (a cache key without min(k, 2)) returns the
    K = 2 peak for K = 1, which is higher by the gradients alive during the second forward pass.
    """
    prof = Profiler(_mlp, MLP_SPEC, optimizer, device="meta", target="cpu")
    b = 256
    two = prof.step(b, accumulation_steps=2).peak_bytes
    one = prof.step(b, accumulation_steps=1).peak_bytes
    real_two, real_one = (_measured(_mlp, MLP_SPEC, b, k, optimizer) for k in (2, 1))
    assert real_two > 1.05 * real_one  # the two loops differ, so a shared answer cannot pass both
    for meta, real in ((two, real_two), (one, real_one)):
        assert 0 <= meta / real - 1 < 0.01, (meta, real)
    # and K = 4 reads K >= 2's answer: the same peak as K = 2 (any K >= 2 holds the same at its peak)
    assert prof.step(b, accumulation_steps=4).peak_bytes == two
    assert prof.step(b, accumulation_steps=4).accumulation_steps == 4


def test_hand_counted_floor_of_sgd_and_adam() -> None:
    """Parameters 4 B each, gradients 4 B, Adam's two moments 8 B (and a 4-byte step count per tensor)."""
    n = sum(p.numel() for p in _mlp().parameters())
    tensors = len(list(_mlp().parameters()))
    for name, state in (("sgd", 0), ("adam", 8 * n + 4 * tensors)):
        s = Profiler(_mlp, MLP_SPEC, name, device="meta", target="cpu").step(4)
        assert s.optimizer_breakdown["parameters"] == 4 * n
        assert s.optimizer_breakdown["gradients"] == 4 * n
        assert s.optimizer_breakdown["optimizer_state"] == state


class _ScratchBlock(nn.Module):
    """A block that makes a large scratch buffer and drops it (as a kernel's workspace would).

    Its backward needs no such buffer, so with checkpointing the update's peak is reached while
    a block is recomputed: the scratch beside the gradients already made.
    """

    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Sequential(nn.Linear(64, 64), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        zero = torch.ones(x.shape[0], 64, 512, device=x.device).sum() * 0  # the scratch is gone after it
        return self.f(x) + zero


class _ScratchNet(nn.Module):
    block_wrapper = None

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.out = nn.Linear(32, 64), nn.Linear(64, 4)
        self.blocks = nn.ModuleList(_ScratchBlock() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x) if self.block_wrapper is None else self.block_wrapper(block, x)
        return self.out(x)


def test_backward_peak_counts_the_recompute_ops() -> None:
    """With every block checkpointed, the peak of the backward passes (recomputation included) is the
    peak of the whole update here, and the allocator's record of a hand-written checkpointed loop says
    how high it is; a backward peak that left out the recompute ops would be lower by the scratch."""
    spec = BatchSpec.classifier((32,), 4)
    prof = Profiler(_ScratchNet, spec, "sgd", device="meta", target="cpu")
    step = prof.step(16, checkpoint="blocks", accumulation_steps=1)

    def wrapper(block, x):  # noqa: ANN001, ANN202
        return checkpoint(block, x, use_reentrant=False)

    real = _measured(_ScratchNet, spec, 16, 1, "sgd", wrapper)
    scratch = 16 * 64 * 512 * 4
    # within 1% either way: the allocator also rounds this toy's scalars (a few KiB here)
    assert abs(step.peak_bytes / real - 1) < 0.01, (step.peak_bytes, real)
    assert abs(step.backward_peak_bytes / real - 1) < 0.01, (step.backward_peak_bytes, real)
    assert step.backward_peak_bytes - step.forward_end_bytes > scratch / 2


def test_plan_check_runs_the_chosen_configuration_in_full() -> None:
    """plan_model's 'profiled again' figure is the peak of the chosen B x K, as a fresh profile says.

    A fresh Profiler (no cache shared with the plan's) gives the number; the hand-written loop on
    CPU bounds it from below.
    """
    prof = Profiler(_mlp, MLP_SPEC, "sgd", device="meta", target="cpu")
    report = plan_model(prof, name="mlp", budget_bytes=1e9, effective_batch=2, checkpoint="none")
    assert report.plan is not None and (report.plan.micro_batch, report.plan.accumulation_steps) == (2, 1)
    fresh = Profiler(_mlp, MLP_SPEC, "sgd", device="meta", target="cpu").step(2, accumulation_steps=1)
    assert report.checked_peak_bytes == fresh.peak_bytes
    real = _measured(_mlp, MLP_SPEC, 2, 1)
    assert 0 <= report.checked_peak_bytes / real - 1 < 0.01


def test_one_profiler_answers_as_fresh_ones_for_every_k() -> None:
    """K = 2 then K = 1 at another micro-batch: every answer equals a fresh Profiler's."""
    shared = Profiler(_mlp, MLP_SPEC, "adam", device="meta", target="cpu")
    for b, k in ((3, 2), (3, 1), (5, 1), (5, 3)):
        fresh = Profiler(_mlp, MLP_SPEC, "adam", device="meta", target="cpu").step(b, accumulation_steps=k)
        assert shared.step(b, accumulation_steps=k).peak_bytes == fresh.peak_bytes, (b, k)
