"""Data parallelism with real processes: DDP gradients, batch bookkeeping, sharded bytes (lesson 07).

Everything runs on PyTorch's own distributed engine, through the worker processes
of `helpers.distributed.launcher` (a persistent `WorkerPool` for the widget, `run_torchrun` for
the lesson's scripts). Nothing is simulated.

- Model and data, deterministic so every process builds the same thing:
  `replica_model`, `bn_model`, `lesson_data`, `mse_loss`.
- `count_allreduces`: a DDP communication hook that counts gradient all-reduces.
- `ddp_accumulated_grad` -> `DDPGrad`: one update of K micro-steps on W real DDP
  workers, with or without `no_sync`; `rank_shards` says who uses which example.
- `check_batch_sizes` -> `BatchSizes`: B x K x W, the fourth from three.
- `local_bytes`: what a rank stores of (possibly sharded) tensors (FSDP): its persistent state.
- `fsdp_step_memory` -> `FSDPStepMemory`: a rank's peak over one FSDP2 step, and its parts
  (sharded state, gathered parameters, unsharded gradients, activations); `fully_shard_units`,
  `fsdp_rank_memory` (every rank, on the worker pool) and `counted_model`, whose units you can
  count by hand; `draw_fsdp_memory` puts the peak beside the 1/W line.
- Widget: `lesson_sizes`, `data_parallel_report`, `draw_report`, `show_data_parallel`.
- Per-lesson protocol: `predicted_peak_bytes(scale)`, `widget_latency_cases(scale, device)`;
  exercise checkers `check_exercise_1` ... `check_exercise_3`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from helpers.core.validate import callable_arg, positive_int, tensor_arg
from helpers.distributed.launcher import WorkerPool, group_for, shared_pool
from helpers.distributed.processes import max_workers
from helpers.techniques.accumulation import flat_grad

__all__ = [
    "AllReduceCounter", "BatchSizes", "DDPGrad", "bn_model", "check_batch_sizes", "count_allreduces",
    "ddp_accumulated_grad", "lesson_data", "replica_model", "mse_loss", "rank_shards",
]

# -- the lesson's model, data and counting hook ------------------------------------------
D_IN, D_OUT, DEPTH = 16, 4, 2


def replica_model(width: int = 64, depth: int = DEPTH) -> nn.Module:
    """A small `ResidualMLP` (16 -> width x depth blocks -> 4), the same on every rank (seed 0).

    Module-level and argument-free by default, so a worker can rebuild it from a
    pickled reference (`functools.partial(replica_model, width=...)` also pickles).
    The global RNG is left untouched.

    Args:
        width, depth: the blocks' width and their number.

    Returns:
        The model.
    """
    from helpers.models.nets import ResidualMLP

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return ResidualMLP(D_IN, positive_int("width", width), positive_int("depth", depth), D_OUT)


def bn_model(width: int = 32) -> nn.Module:
    """Linear -> BatchNorm1d -> ReLU -> Linear (16 -> width -> 4), seed 0, for the BatchNorm section.

    Args:
        width: the hidden width.

    Returns:
        The model, the same in every process.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        w = positive_int("width", width)
        return nn.Sequential(nn.Linear(D_IN, w), nn.BatchNorm1d(w), nn.ReLU(), nn.Linear(w, D_OUT))


def lesson_data(n: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """`n` regression examples (16 features -> 4 targets), identical in every process for a seed.

    Args:
        n: examples.
        seed: seeds them.

    Returns:
        (inputs (n, 16), targets (n, 4)).
    """
    from helpers.core.data import regression_batch

    return regression_batch(positive_int("n", n), D_IN, D_OUT, seed=seed)


def mse_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean squared error over the examples given (a picklable, module-level loss).

    Args:
        outputs, targets: tensors of the same shape.

    Returns:
        The mean loss.
    """
    return nn.functional.mse_loss(outputs, targets)


@dataclass
class AllReduceCounter:
    """State of the counting communication hook: `calls` = synchronised backward passes so far,
    `buckets` = bucket all-reduces (one or more per synchronised backward)."""

    group: object = None
    calls: int = 0
    buckets: int = 0


def _counting_allreduce(state, bucket):  # no annotations: DDP checks real ones, and this module's are strings
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    state.buckets += 1
    state.calls += bucket.is_last()  # a backward all-reduces each bucket; its last one closes the sync
    return default_hooks.allreduce_hook(state.group, bucket)  # DDP's own all-reduce, then / W


def count_allreduces(ddp_model: nn.Module) -> AllReduceCounter:
    """Register a DDP communication hook on `ddp_model` that counts its gradient all-reduces.

    The hook does exactly what DDP does without a hook (all-reduce each bucket,
    divide by the group size). It adds one to `counter.buckets` per bucket, and one
    to `counter.calls` per synchronised backward (at its last bucket). Call it once,
    before the first backward. A model with more gradient bytes than DDP's first
    bucket (1 MiB once DDP has rebuilt its buckets after the first backward) sends
    several buckets per synchronised backward: the lessons' models do at the GPU scale.

    Args:
        ddp_model: a `DistributedDataParallel` model.

    Returns:
        The `AllReduceCounter`.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    if not isinstance(ddp_model, DDP):
        raise TypeError(f"ddp_model must be a DistributedDataParallel, got {type(ddp_model).__name__}")
    counter = AllReduceCounter(group=ddp_model.process_group)
    ddp_model.register_comm_hook(counter, _counting_allreduce)
    return counter


def rank_shards(n: int, micro_batch: int, accumulation_steps: int, world_size: int) -> list[list[list[int]]]:
    """Example indices for rank r, micro-step k: `shards[r][k]` (contiguous blocks of B).

    Rank r takes examples [r*B*K, (r+1)*B*K), cut into K micro-batches of B, so
    each of the n = B x K x W examples is used exactly once.
    """
    sizes = check_batch_sizes(n, micro_batch, accumulation_steps, world_size)
    b, k = sizes.micro_batch, sizes.accumulation_steps
    return [[list(range((r * k + s) * b, (r * k + s + 1) * b)) for s in range(k)] for r in range(world_size)]


# -- B x K x W with real DDP ---------------------------------------------------------------
@dataclass(frozen=True)
class DDPGrad:
    """One update of DDP + accumulation, as every rank saw it.

    - `grad`: rank 0's flat gradient after the update (`flat_grad` form);
    - `allreduce_calls`: gradient all-reduces during the update (DDP hook count);
    - `synced_steps`: per micro-step, whether its backward all-reduced;
    - `ranks_agree`: every rank holds the same gradient (`rank_spread` = largest difference);
    - `indices`: per rank, per micro-step, the example indices it used.
    """

    grad: torch.Tensor
    allreduce_calls: int
    synced_steps: list[bool]
    ranks_agree: bool
    rank_spread: float
    indices: list[list[list[int]]] = field(repr=False)


def _ddp_worker(model_fn: Callable[[], nn.Module], loss_fn: Callable, inputs: torch.Tensor,
                targets: torch.Tensor, micro_batch: int, k: int, w: int, no_sync: bool,
                same_data: bool) -> dict | None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    if rank >= w:
        return None  # this pool is larger than the requested W
    group = group_for(w)
    dev = torch.device("cuda", rank) if dist.get_backend() == "nccl" else torch.device("cpu")
    model = model_fn().to(dev)
    ddp = DDP(model, process_group=group, device_ids=[rank] if dev.type == "cuda" else None)
    counter = count_allreduces(ddp)
    shards = rank_shards(inputs.shape[0], micro_batch, k, w)
    mine = shards[0 if same_data else rank]
    synced = []
    for step, idx in enumerate(mine):
        before = counter.calls
        quiet = no_sync and step < k - 1
        with ddp.no_sync() if quiet else contextlib.nullcontext():  # forward AND backward inside
            loss = loss_fn(ddp(inputs[idx].to(dev)), targets[idx].to(dev)) / k
            loss.backward()
        synced.append(counter.calls > before)
    grad = flat_grad(model).cpu()
    everyone = [torch.empty_like(grad) for _ in range(w)]
    dist.all_gather(everyone, grad, group=group)  # not a gradient all-reduce: the hook does not see it
    spread = max((g - grad).abs().max().item() for g in everyone)
    return {"grad": grad, "calls": counter.calls, "synced": synced, "spread": spread, "indices": mine}


def ddp_accumulated_grad(
    model_fn: Callable[[], nn.Module],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    micro_batch: int,
    accumulation_steps: int,
    world_size: int,
    no_sync: bool = True,
    same_data: bool = False,
    timeout_s: float = 120.0,
    pool: WorkerPool | None = None,
) -> DDPGrad:
    """The gradient of one update of K micro-steps on W real DDP workers (gloo on CPU).

    Each worker builds `model_fn()` after the process group is initialised, wraps it in
    `DistributedDataParallel`, counts its all-reduces with `count_allreduces`, and runs K
    micro-steps on its own examples (`rank_shards`: every example of `inputs` exactly once),
    each backward on `loss_fn(...) / K`. DDP's all-reduce averages over W, so the result is
    the gradient of the mean loss over all B x K x W examples.

    Args:
        model_fn: a picklable, module-level callable that builds the model.
        loss_fn: a picklable loss `loss_fn(outputs, targets)`.
        inputs, targets: all B x K x W examples.
        micro_batch, accumulation_steps, world_size: B, K and W (checked by `check_batch_sizes`).
        no_sync: wrap the first K-1 micro-steps (forward and backward) in `no_sync()`: one
            all-reduce per update instead of K.
        same_data: give every rank rank 0's examples, the classic data-loading bug (no
            `DistributedSampler`).
        timeout_s: the most seconds the workers may take.
        pool: the workers (default: the shared pool, started on first use).

    Returns:
        A `DDPGrad`: rank 0's gradient, the all-reduce count, the synced micro-steps, whether
        the ranks agree, and each rank's example indices.

    Raises:
        ValueError: if inputs and targets differ in length, the sizes do not multiply up, or
            `world_size` is larger than the pool.
    """
    callable_arg("model_fn", model_fn)
    callable_arg("loss_fn", loss_fn)
    tensor_arg("inputs", inputs)
    tensor_arg("targets", targets)
    if inputs.shape[0] != targets.shape[0]:
        raise ValueError(f"inputs ({inputs.shape[0]}) and targets ({targets.shape[0]}) differ in length")
    for name, flag in (("no_sync", no_sync), ("same_data", same_data)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    check_batch_sizes(inputs.shape[0], micro_batch, accumulation_steps, world_size)
    if pool is None:
        pool = shared_pool(max(world_size, max_workers()))
    if world_size > pool.world_size:
        raise ValueError(f"world_size={world_size} is larger than the pool ({pool.world_size} workers)")
    out = pool.run(_ddp_worker, model_fn, loss_fn, inputs.detach().cpu(), targets.detach().cpu(),
                   micro_batch, accumulation_steps, world_size, no_sync, same_data, timeout_s=timeout_s)
    ranks = out[:world_size]
    return DDPGrad(
        grad=ranks[0]["grad"], allreduce_calls=ranks[0]["calls"], synced_steps=ranks[0]["synced"],
        ranks_agree=max(r["spread"] for r in ranks) == 0.0, rank_spread=max(r["spread"] for r in ranks),
        indices=[r["indices"] for r in ranks],
    )


# -- batch bookkeeping ---------------------------------------------------------------------
@dataclass(frozen=True)
class BatchSizes:
    """train_batch = micro_batch x accumulation_steps x world_size (B_eff = B x K x W)."""

    train_batch: int
    micro_batch: int
    accumulation_steps: int
    world_size: int

    def __str__(self) -> str:
        return (f"{self.micro_batch} (B) x {self.accumulation_steps} (K) x {self.world_size} (W) "
                f"= {self.train_batch} examples per update")


def check_batch_sizes(train_batch: int | None = None, micro_batch: int | None = None,
                      accumulation_steps: int | None = None, world_size: int | None = None) -> BatchSizes:
    """Infer the 4th of (train batch, micro-batch, accumulation steps, world size) from 3, or check all 4.

    In the spirit of DeepSpeed's "train_batch_size is not equal to
    micro_batch_per_gpu * gradient_acc_step * world_size".

    Args:
        train_batch, micro_batch, accumulation_steps, world_size: at least three of them,
            each a positive int (`TypeError` for a float or bool).

    Returns:
        The four `BatchSizes`.

    Raises:
        ValueError: for fewer than three values, an inconsistent set, or a fourth value that
            would not be a whole number; the message shows every number given.
    """
    given = {"train_batch": train_batch, "micro_batch": micro_batch,
             "accumulation_steps": accumulation_steps, "world_size": world_size}
    for name, value in given.items():
        if value is not None:
            positive_int(name, value)
    shown = ", ".join(f"{n}={v}" for n, v in given.items() if v is not None) or "nothing"
    missing = [n for n, v in given.items() if v is None]
    if len(missing) > 1:
        raise ValueError(f"give at least three of the four batch sizes; got {shown} "
                         f"({' and '.join(missing)} missing)")
    if missing == ["train_batch"]:
        given["train_batch"] = micro_batch * accumulation_steps * world_size
    elif missing:
        factors = [v for n, v in given.items() if n not in ("train_batch", missing[0])]
        product = math.prod(factors)
        if train_batch % product:
            raise ValueError(
                f"Check batch related parameters: with {shown}, {missing[0]} would be "
                f"{train_batch} / {' x '.join(map(str, factors))} = {train_batch / product:.4g}, "
                "not a whole number")
        given[missing[0]] = train_batch // product
    sizes = BatchSizes(**given)  # type: ignore[arg-type]
    product = sizes.micro_batch * sizes.accumulation_steps * sizes.world_size
    if sizes.train_batch != product:
        raise ValueError(
            f"Check batch related parameters: train_batch={sizes.train_batch} is not equal to "
            f"micro_batch x accumulation_steps x world_size = {sizes.micro_batch} x "
            f"{sizes.accumulation_steps} x {sizes.world_size} = {product} (given: {shown})")
    return sizes


# -- FSDP2: a rank's peak, not only its 1/W -------------------------------------------------


# -- widget ----------------------------------------------------------------------------------


# -- the lesson protocol -----------------------------------------------------------------------


# -- exercises ---------------------------------------------------------------------------------
