"""Hugging Face Accelerate's gradient accumulation, counted against the loop (instrument, lesson 10).

`Accelerator(gradient_accumulation_steps=K)` with `with accelerator.accumulate(model):`
runs K micro-steps per update: `accelerator.backward(loss)` divides the loss by K, the
prepared optimizer only steps (and only zeroes) when `accelerator.sync_gradients` is
True, and under DDP the first K-1 backwards run inside `no_sync`. Needs the
`frameworks` extra; Accelerate is imported only when a function is called.

- `GradientStateView`, `gradient_state()`: the process-wide `GradientState` singleton, read.
- `reset_gradient_state()`, `fresh_accelerator(k)`: the fix for a state an earlier
  Trainer left behind (see the note below).
- `accumulate_run(accelerator, model, optimizer, micro_batches, loss_fn)`: the
  accumulate loop, returning `sync_gradients` after every micro-step; `stepped_gradient(...)`:
  the same loop with a `GradientProbe` for optimizer, and the gradient it would have applied.
- `token_loss(logits, labels, n_group, k)`: lesson 05's group-token-count loss, scaled by K
  because `accelerator.backward` divides by K.
- `worker_update(...)`, `two_worker_update(...)`: the same loop in W gloo workers, its
  DDP all-reduces counted from the communication hook (`helpers.distributed.count_allreduces`);
  `start_workers(w)` starts and warms those workers in the background.

NOTE [the GradientState singleton]: every `Accelerator` in a process shares one
`GradientState`. It remembers the dataloader it is iterating (a weak reference) and
whether that dataloader is at its end. A Transformers `Trainer` that stops at
`max_steps` inside its dataloader never leaves it, so while that Trainer is alive the
state says "inside a dataloader, at its end", and a later `accumulate()` syncs (and
steps) on every micro-step. `fresh_accelerator` clears the state first.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from helpers.core.training import IGNORE_INDEX
from helpers.core.validate import positive_int

__all__ = [
    "GradientProbe",
    "GradientStateView",
    "accumulate_run",
    "fresh_accelerator",
    "gradient_state",
    "reset_gradient_state",
    "start_workers",
    "stepped_gradient",
    "token_loss",
    "two_worker_update",
    "worker_update",
]


@dataclass(frozen=True)
class GradientStateView:
    """What Accelerate's shared `GradientState` says right now."""

    in_dataloader: bool
    end_of_dataloader: bool
    sync_gradients: bool
    num_steps: int

    @property
    def leaks(self) -> bool:
        """True when a new accumulate() would sync on every micro-step (inside a finished loader)."""
        return self.in_dataloader and self.end_of_dataloader


def gradient_state() -> GradientStateView:
    """Read the process-wide `accelerate.state.GradientState` (creating it if none exists).

    Returns:
        A `GradientStateView` of its flags and step count.
    """
    from accelerate.state import GradientState

    state = GradientState()
    return GradientStateView(bool(state.in_dataloader), bool(state.end_of_dataloader),
                             bool(state.sync_gradients), int(state.num_steps))


def reset_gradient_state() -> None:
    """Forget the shared `GradientState`; the next `Accelerator` builds a fresh one.

    `GradientState._reset_state` is private (Accelerate's own tests use it); a fresh
    Python process is the public way to get the same result.
    """
    from accelerate.state import GradientState

    GradientState._reset_state()


def fresh_accelerator(k: int, *, device: torch.device | str = "cpu") -> object:
    """An `Accelerator(gradient_accumulation_steps=k)` that no earlier Trainer can disturb.

    Clears the shared `GradientState` first (see the module note). The frameworks' loggers
    are set to errors only (`helpers.frameworks.installed.silence_logs`).

    Args:
        k: gradient accumulation steps.
        device: a CPU device passes `cpu=True`.

    Returns:
        The `accelerate.Accelerator`.
    """
    from accelerate import Accelerator

    from helpers.frameworks.installed import silence_logs

    positive_int("k", k)
    silence_logs()
    reset_gradient_state()
    return Accelerator(gradient_accumulation_steps=k, cpu=torch.device(device).type == "cpu")


def accumulate_run(accelerator: object, model: nn.Module, optimizer: torch.optim.Optimizer,
                   micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> list[bool]:
    """Accelerate's accumulation loop over `micro_batches`; `sync_gradients` after each one.

    Args:
        accelerator: the `Accelerator` that prepared `model` and `optimizer`.
        model: the prepared model.
        optimizer: the prepared optimizer (it steps only when gradients are synced).
        micro_batches: (inputs, targets) pairs, one per micro-step.
        loss_fn: `loss_fn(model(inputs), targets)`, a mean over the micro-batch.

    Returns:
        One bool per micro-step: whether that micro-step synced (and stepped).
    """
    syncs = []
    for x, y in micro_batches:
        with accelerator.accumulate(model):  # type: ignore[attr-defined]
            loss = loss_fn(model(x), y)
            accelerator.backward(loss)  # type: ignore[attr-defined]  # divides by K
            syncs.append(bool(accelerator.sync_gradients))  # type: ignore[attr-defined]
            optimizer.step()
            optimizer.zero_grad()
    return syncs


class GradientProbe(torch.optim.Optimizer):
    """An 'optimizer' whose step records the flat gradient it would apply and changes nothing.

    Args:
        params: the parameters (or parameter groups) it watches.
    """

    def __init__(self, params: object) -> None:
        super().__init__(params, {})
        self.seen: list[torch.Tensor] = []

    @torch.no_grad()
    def step(self, closure: object = None) -> None:  # noqa: ARG002 - the Optimizer signature
        self.seen.append(torch.cat([p.grad.flatten() for g in self.param_groups for p in g["params"]]))


def stepped_gradient(model: nn.Module, micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                     loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], k: int, *,
                     device: torch.device | str = "cpu") -> tuple[list[bool], torch.Tensor]:
    """Accelerate's accumulate loop over `micro_batches`, and the gradient its optimizer last stepped with.

    A `fresh_accelerator(k)` prepares `model` with a `GradientProbe`, so nothing is updated;
    the model's gradients are cleared afterwards.

    Args:
        model: the model (not yet prepared).
        micro_batches: (inputs, targets) pairs, one per micro-step.
        loss_fn: `loss_fn(model(inputs), targets)`.
        k: gradient accumulation steps.
        device: where the model runs.

    Returns:
        (`sync_gradients` after each micro-step, the flat gradient of the last step).
    """
    accelerator = fresh_accelerator(k, device=device)
    probe = GradientProbe(model.parameters())
    prepared, opt = accelerator.prepare(model, probe)  # type: ignore[attr-defined]
    syncs = accumulate_run(accelerator, prepared, opt, micro_batches, loss_fn)
    model.zero_grad(set_to_none=True)
    return syncs, probe.seen[-1]


def token_loss(logits: torch.Tensor, labels: torch.Tensor, n_group: int, k: int) -> torch.Tensor:
    """Summed token cross-entropy / the group's valid tokens, times K (and times W under DDP).

    `accelerator.backward` divides every loss by K and DDP averages over W workers;
    multiplying by K (x W) first leaves lesson 05's group-token-count gradient. This is
    Accelerate's own recipe for padded batches.

    Args:
        logits, labels: one micro-batch's logits and labels.
        n_group: the group's valid tokens.
        k: K, or K x W with W workers.

    Returns:
        The loss, a scalar tensor.
    """
    positive_int("n_group", n_group)
    positive_int("k", k)
    total = F.cross_entropy(logits.flatten(0, -2), labels.flatten(), ignore_index=IGNORE_INDEX,
                            reduction="sum")
    return total * k / n_group


# -- several workers ---------------------------------------------------------------------------
def worker_update(k: int, micro_batch: int, width: int, updates: int = 2) -> dict[str, object]:
    """In a `helpers.distributed.launcher` worker: `updates` accumulated updates with Accelerate over DDP.

    Every rank builds the same `helpers.distributed.replica_model(width)` and takes its own
    K micro-batches of `micro_batch` examples per update (rank r: a contiguous block).
    Returns this rank's `sync_gradients` per micro-step, the DDP all-reduce count after
    each micro-step (counted by the communication hook, not read from Accelerate), the
    distributed type Accelerate chose and the final weights.
    """
    import torch.distributed as dist

    from helpers.distributed.ddp import count_allreduces, lesson_data, mse_loss, replica_model

    rank, world = dist.get_rank(), dist.get_world_size()
    # Accelerate finds its processes from these variables; the process group already exists.
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1")
    device = torch.device("cuda", rank) if dist.get_backend() == "nccl" else torch.device("cpu")
    accelerator = fresh_accelerator(k, device=device)
    model = replica_model(width)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)  # type: ignore[attr-defined]
    counter = count_allreduces(model)
    syncs, calls = [], []
    for u in range(updates):
        x, y = lesson_data(micro_batch * k * world, seed=100 + u)
        mine = slice(rank * micro_batch * k, (rank + 1) * micro_batch * k)
        x, y = x[mine].to(device), y[mine].to(device)
        pieces = list(zip(x.split(micro_batch), y.split(micro_batch), strict=True))
        for piece in pieces:
            syncs += accumulate_run(accelerator, model, optimizer, [piece], mse_loss)
            calls.append(counter.calls)
    weights = torch.cat([p.detach().flatten() for p in accelerator.unwrap_model(model).parameters()]).cpu()
    return {"distributed_type": str(accelerator.distributed_type), "syncs": syncs, "allreduces": calls,
            "weights": weights}


def _warm_up() -> bool:
    # What a worker's first `accelerator.prepare` imports (DTensor checks, DDP's dynamo hooks).
    import accelerate  # noqa: F401
    import torch._dynamo  # noqa: F401
    import torch.distributed.tensor  # noqa: F401

    return True


def start_workers(world_size: int = 2) -> Future:
    """Start `world_size` gloo workers in the background and warm them up.

    Spawned workers spend seconds importing torch, Accelerate and DDP's modules. Started
    early, they do it while the caller works on. Under `LESSONS_POOL_START=fork` the pool starts
    here, before this returns: a fork made from a background thread while the caller's thread
    imports or compiles can copy a lock that thread holds into the child, which then hangs.

    Args:
        world_size: workers to start.

    Returns:
        A Future whose `result()` is a `helpers.distributed.launcher.WorkerPool` for
        `two_worker_update(..., pool=...)`; close it after.
    """
    from helpers.distributed.launcher import WorkerPool
    from helpers.distributed.processes import POOL_START_ENV

    positive_int("world_size", world_size)

    def start() -> object:
        pool = WorkerPool(world_size, timeout_s=180.0)
        pool.run(_warm_up)
        return pool

    if os.environ.get(POOL_START_ENV) == "fork":
        ready: Future = Future()
        ready.set_result(start())
        return ready
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lesson10-workers")
    future = executor.submit(start)
    executor.shutdown(wait=False)  # the one task still runs; nothing else is accepted
    return future


def two_worker_update(k: int, micro_batch: int, width: int, updates: int = 2, world_size: int = 2, *,
                      pool: object | None = None) -> list[dict[str, object]]:
    """`worker_update` on `world_size` gloo workers (joined in one group).

    Needs a `__main__` that can be re-imported (a notebook, a test, or a guarded script).

    Args:
        k, micro_batch, width, updates: passed to `worker_update`.
        world_size: workers.
        pool: workers from `start_workers`; None starts workers for this call.

    Returns:
        Each rank's `worker_update` result, in rank order.
    """
    from helpers.distributed.launcher import launch

    positive_int("world_size", world_size)
    if pool is not None:
        return pool.run(worker_update, k, micro_batch, width, updates)  # type: ignore[attr-defined]
    return launch(worker_update, world_size, k, micro_batch, width, updates, timeout_s=180.0)
