"""helpers.frameworks.accel: accumulate() against the loop, its shared GradientState, and 2 gloo workers."""

from __future__ import annotations

import copy
import gc
import os

import pytest
import torch

from helpers.core.training import lm_loss
from helpers.frameworks import installed
from helpers.models.gpt import GPTConfig, seeded_gpt
from helpers.techniques.accumulation import compare_grads
from helpers.techniques.token_loss import count_valid_tokens, split_micro_batches, variable_length_sequences
from helpers.techniques.tokens import fixed_step

CI = os.environ.get("CI", "").lower() == "true"
pytestmark = pytest.mark.skipif(bool(installed.missing("accelerate")) and not CI,
                                reason="needs the frameworks extra (accelerate)")
CFG = GPTConfig(vocab_size=40, seq_len=10, d_model=16, n_heads=2, n_layers=1, dropout=0.0)


@pytest.fixture(scope="module")
def accel():
    installed.timed_import("accelerate")
    from helpers.frameworks import accel as module

    return module


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize("k", [1, 3])
def test_accumulate_syncs_once_per_k_and_matches_the_loop(accel, k: int) -> None:
    model = seeded_gpt(CFG, "cpu")
    loop = copy.deepcopy(model)
    x = torch.randint(0, CFG.vocab_size, (2 * k * 2, CFG.seq_len))
    micro = list(zip(x.split(2), x.roll(-1, 1).split(2), strict=True))
    accelerator = accel.fresh_accelerator(k)
    prepared, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.2))
    syncs = accel.accumulate_run(accelerator, prepared, opt, micro, lm_loss)
    assert syncs == ([False] * (k - 1) + [True]) * 2
    sgd = torch.optim.SGD(loop.parameters(), lr=0.2)
    for step, (xb, yb) in enumerate(micro):
        (lm_loss(loop(xb), yb) / k).backward()
        if (step + 1) % k == 0:
            sgd.step()
            sgd.zero_grad(set_to_none=True)
    assert compare_grads(_flat(loop), _flat(model)).max_rel <= 1e-6


def test_stepped_gradient_is_the_loss_over_k_gradient_and_changes_no_weight(accel) -> None:
    model = seeded_gpt(CFG, "cpu")
    before = _flat(model)
    x = torch.randint(0, CFG.vocab_size, (6, CFG.seq_len))
    micro = list(zip(x.split(2), x.roll(-1, 1).split(2), strict=True))
    syncs, grad = accel.stepped_gradient(model, micro, lm_loss, 3)
    assert syncs == [False, False, True]
    assert torch.equal(_flat(model), before) and all(p.grad is None for p in model.parameters())
    for xb, yb in micro:  # lesson 03's loop: loss / K
        (lm_loss(model(xb), yb) / 3).backward()
    loop = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert compare_grads(loop, grad).max_rel <= 1e-6


def test_token_loss_is_lesson_05s_fix_and_the_mean_is_not(accel) -> None:
    cfg = GPTConfig(vocab_size=40, seq_len=12, d_model=16, n_heads=2, n_layers=1, dropout=0.0)
    model = seeded_gpt(cfg, "cpu")
    mbs = split_micro_batches(variable_length_sequences(9, 12, 40, spread=0.9, seed=4), 3)
    reference = fixed_step(model, mbs).grad
    n = count_valid_tokens([mb.labels for mb in mbs])
    errors = []
    for loss_fn in (lm_loss, lambda lg, lb: accel.token_loss(lg, lb, n, 3)):
        accelerator = accel.fresh_accelerator(3)
        prepared = accelerator.prepare(model)
        for mb in mbs:
            with accelerator.accumulate(prepared):
                accelerator.backward(loss_fn(prepared(mb.input_ids), mb.labels))
        grad = torch.cat([p.grad.flatten() for p in model.parameters()])
        errors.append(compare_grads(reference, grad).max_rel)
        model.zero_grad(set_to_none=True)
    assert errors[0] > 1e-3 and errors[1] <= 1e-6, errors
    with pytest.raises(ValueError, match="n_group"):
        accel.token_loss(torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.long), 0, 1)


@pytest.mark.skipif(bool(installed.missing("transformers")) and not CI, reason="needs transformers")
def test_a_live_trainer_that_stopped_on_its_last_batch_leaks_gradient_state(accel, tmp_path) -> None:
    from accelerate import Accelerator

    installed.timed_import("transformers")
    from helpers.frameworks import hf, hf_models

    sizes = dict(vocab_size=48, hidden=24, layers=1, heads=2, max_len=10)
    rows = hf_models.training_rows(variable_length_sequences(4, 10, 48, spread=0.5, seed=1))
    accel.reset_gradient_state()
    import transformers

    trainer = hf.quiet(transformers.Trainer(
        model=hf_models.causal_lm("llama", **sizes), train_dataset=rows, data_collator=hf_models.collate,
        args=hf.comparison_arguments(str(tmp_path), micro_batch=2, accumulation_steps=2, learning_rate=0.1)))
    trainer.train()  # max_steps=1 on exactly one update's rows: it stops on the loader's last batch
    state = accel.gradient_state()
    model = seeded_gpt(CFG, "cpu")
    x = torch.randint(0, CFG.vocab_size, (6, CFG.seq_len))
    micro = list(zip(x.split(2), x.roll(-1, 1).split(2), strict=True))

    def syncs(accelerator: object) -> list[bool]:
        prepared, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        return accel.accumulate_run(accelerator, prepared, opt, micro, lm_loss)

    stale = syncs(Accelerator(gradient_accumulation_steps=3, cpu=True))
    fresh = syncs(accel.fresh_accelerator(3))
    assert fresh == [False, False, True]
    if state.leaks:  # accelerate 1.15 with transformers 5.24
        assert stale == [True, True, True], stale
    else:
        assert stale == fresh
    del trainer
    gc.collect()
    assert not accel.gradient_state().leaks


@pytest.mark.distributed
def test_two_gloo_workers_all_reduce_once_per_update(accel, monkeypatch: pytest.MonkeyPatch) -> None:
    """About 10-20 s on 2 busy cores: each spawned worker imports torch, DDP and Accelerate."""
    from helpers.distributed.ddp import lesson_data, mse_loss, replica_model
    from helpers.distributed.processes import POOL_START_ENV

    # Spawned even under `make unit`'s LESSONS_POOL_START=fork: a forked worker would inherit the
    # Accelerate state this process's other tests made, and Accelerate would not wrap the model in DDP.
    monkeypatch.setenv(POOL_START_ENV, "spawn")

    k, b, width = 3, 2, 16
    pool = accel.start_workers(2).result(timeout=180)
    try:
        ranks = accel.two_worker_update(k, b, width, updates=2, pool=pool)  # the notebook's path
    finally:
        pool.close()
    single = replica_model(width)
    opt = torch.optim.SGD(single.parameters(), lr=0.1)
    for u in range(2):
        xs, ys = lesson_data(b * k * 2, seed=100 + u)
        opt.zero_grad()
        mse_loss(single(xs), ys).backward()
        opt.step()
    for out in ranks:
        assert out["distributed_type"].endswith("MULTI_CPU")
        assert out["allreduces"] == [0, 0, 1, 1, 1, 2], out["allreduces"]  # counted by the comm hook
        assert out["syncs"] == [False, False, True] * 2
        assert compare_grads(_flat(single), out["weights"]).max_rel <= 1e-5


def test_forked_workers_start_in_the_callers_thread(accel, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fork made from a background thread can copy a lock the caller's thread holds (lesson 10 hung
    so under `make check`): with LESSONS_POOL_START=fork the pool starts before start_workers returns."""
    import threading

    from helpers.distributed import launcher, processes

    started: list[threading.Thread] = []

    class Pool:  # stands in for WorkerPool: records which thread started it
        def __init__(self, world_size: int, timeout_s: float) -> None:
            started.append(threading.current_thread())

        def run(self, fn: object) -> None:
            pass

    monkeypatch.setattr(launcher, "WorkerPool", Pool)
    monkeypatch.setenv(processes.POOL_START_ENV, "fork")
    assert accel.start_workers(2).done() and started == [threading.current_thread()]
    monkeypatch.setenv(processes.POOL_START_ENV, "spawn")
    accel.start_workers(2).result(timeout=30)
    assert len(started) == 2 and started[1] is not threading.current_thread()  # spawned: in the background
