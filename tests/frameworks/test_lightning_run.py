"""helpers.frameworks.lightning_run: Lightning clips once per update and steps its scheduler per update."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from helpers.core.data import regression_batch
from helpers.frameworks import installed
from helpers.models.nets import ResidualMLP
from helpers.techniques.accumulation import compare_grads

CI = os.environ.get("CI", "").lower() == "true"
pytestmark = pytest.mark.skipif(bool(installed.missing("lightning")) and not CI,
                                reason="needs the frameworks extra (lightning)")


@pytest.fixture(scope="module")
def pl_run():
    installed.timed_import("lightning")
    from helpers.frameworks import lightning_run

    return lightning_run


def _net() -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        return ResidualMLP(6, 12, 1, 3)


def _flat(net: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in net.parameters()])


@pytest.mark.parametrize("k", [3, 5])
def test_clip_once_and_step_the_scheduler_once_per_update(pl_run, k: int) -> None:
    updates, clip = 2, 0.02
    x, y = regression_batch(updates * k * 2, 6, 3, seed=1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=2)
    schedule = lambda u: 0.5 ** u  # noqa: E731 - the lr halves every scheduler step
    module = pl_run.loop_module(_net(), F.mse_loss, lr=0.2, lr_lambda=schedule)
    trainer = pl_run.quiet_trainer(max_steps=updates, accumulate_grad_batches=k, gradient_clip_val=clip)
    with installed.caught_warnings():
        trainer.fit(module, loader)
    assert len(module.clip_norms) == updates and pl_run.scheduler_of(trainer).last_epoch == updates
    assert module.clip_lrs == [0.2 * schedule(u) for u in range(updates)]

    loop = _net()  # lesson 03's loop: loss / K, one clip after the K-th micro-step, then step and schedule
    start = _flat(loop)
    opt = torch.optim.SGD(loop.parameters(), lr=0.2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    norms = []
    for step, (xb, yb) in enumerate(loader):
        (F.mse_loss(loop(xb), yb) / k).backward()
        if (step + 1) % k == 0:
            norms.append(float(torch.nn.utils.clip_grad_norm_(loop.parameters(), clip)))
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
    assert module.clip_norms == pytest.approx(norms, rel=1e-5) and min(norms) > clip
    assert compare_grads(_flat(loop) - start, _flat(module.net) - start).max_rel <= 1e-5


def test_arguments_are_checked(pl_run) -> None:
    with pytest.raises(ValueError, match="net"):
        pl_run.loop_module("not a module", F.mse_loss, lr=0.1)
    with pytest.raises(ValueError, match="lr"):
        pl_run.loop_module(_net(), F.mse_loss, lr=0.0)
    trainer = pl_run.quiet_trainer(max_steps=1)
    with pytest.raises(ValueError, match="no learning-rate scheduler"):
        pl_run.scheduler_of(trainer)
