"""Data parallelism with real processes: DDP gradients, batch bookkeeping, sharded bytes (lesson 07).

Everything runs on PyTorch's own distributed engine, through the worker processes
of `helpers.launcher` (a persistent `WorkerPool` for the widget, `run_torchrun` for
the lesson's scripts). Nothing is simulated.

- Model and data, deterministic so every process builds the same thing:
  `lesson_model`, `bn_model`, `lesson_data`, `mse_loss`.
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from helpers.accumulation import flat_grad
from helpers.launcher import WorkerPool, group_for, max_workers, shared_pool
from helpers.validate import callable_arg, choice, positive_int, tensor_arg

__all__ = [
    "AllReduceCounter",
    "BatchSizes",
    "DDPGrad",
    "DataParallelReport",
    "FSDPRankMemory",
    "FSDPStepMemory",
    "FSDP_PARTS",
    "FSDP_TRACKER",
    "LinearStack",
    "bn_model",
    "check_batch_sizes",
    "check_exercise_1",
    "check_exercise_2",
    "check_exercise_3",
    "count_allreduces",
    "counted_model",
    "data_parallel_report",
    "ddp_accumulated_grad",
    "draw_fsdp_memory",
    "draw_report",
    "fsdp_rank_memory",
    "fsdp_runs_here",
    "fsdp_step_memory",
    "fully_shard_units",
    "lesson_data",
    "lesson_model",
    "lesson_sizes",
    "local_bytes",
    "mse_loss",
    "predicted_peak_bytes",
    "rank_shards",
    "show_data_parallel",
    "widget_latency_cases",
]

# -- the lesson's model, data and counting hook ------------------------------------------
SIZES = {  # scale -> model width; the lesson is about communication, so models stay small everywhere
    "tiny": 32, "small": 64, "medium": 128, "full": 256,
}
D_IN, D_OUT, DEPTH = 16, 4, 2


def lesson_model(width: int = 64, depth: int = DEPTH) -> nn.Module:
    """A small `ResidualMLP` (16 -> width x depth blocks -> 4), the same on every rank (seed 0).

    Module-level and argument-free by default, so a worker can rebuild it from a
    pickled reference (`functools.partial(lesson_model, width=...)` also pickles).
    The global RNG is left untouched.
    """
    from helpers.models import ResidualMLP

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return ResidualMLP(D_IN, positive_int("width", width), positive_int("depth", depth), D_OUT)


class LinearStack(nn.Module):
    """16 -> width, then `depth` bias-free width x width Linear units, then width -> 4 (no bias).

    A model whose FSDP units you can count by hand: each unit in `blocks` is exactly
    width x width fp32 weights (256 KiB at width 256), and the root keeps `inp` and `out`.
    """

    def __init__(self, width: int = 256, depth: int = 3) -> None:
        super().__init__()
        w = positive_int("width", width)
        self.inp = nn.Linear(D_IN, w, bias=False)
        self.blocks = nn.ModuleList(nn.Linear(w, w, bias=False) for _ in range(positive_int("depth", depth)))
        self.out = nn.Linear(w, D_OUT, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def counted_model(width: int = 256, depth: int = 3) -> nn.Module:
    """A `LinearStack` with seed-0 weights, the same on every rank (the global RNG is left alone)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return LinearStack(width, depth)


def bn_model(width: int = 32) -> nn.Module:
    """Linear -> BatchNorm1d -> ReLU -> Linear (16 -> width -> 4), seed 0, for the BatchNorm section."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        w = positive_int("width", width)
        return nn.Sequential(nn.Linear(D_IN, w), nn.BatchNorm1d(w), nn.ReLU(), nn.Linear(w, D_OUT))


def lesson_data(n: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """`n` regression examples (16 features -> 4 targets), identical in every process for a seed."""
    from helpers.data import regression_batch

    return regression_batch(positive_int("n", n), D_IN, D_OUT, seed=seed)


def mse_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean squared error over the examples given (a picklable, module-level loss)."""
    return nn.functional.mse_loss(outputs, targets)


@dataclass
class AllReduceCounter:
    """State of the counting communication hook: `calls` = bucket all-reduces so far."""

    group: object = None
    calls: int = 0


def _counting_allreduce(state, bucket):  # no annotations: DDP checks real ones, and this module's are strings
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    state.calls += 1
    return default_hooks.allreduce_hook(state.group, bucket)  # DDP's own all-reduce, then / W


def count_allreduces(ddp_model: nn.Module) -> AllReduceCounter:
    """Register a DDP communication hook on `ddp_model` that counts its gradient all-reduces.

    The hook does exactly what DDP does without a hook (all-reduce each bucket,
    divide by the group size), and adds one to `counter.calls` per bucket. Call
    it once, before the first backward. The lesson's models fit in one bucket,
    so one count is one synchronised backward.
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

    Each worker builds `model_fn()` (a picklable, module-level callable) after
    the process group is initialised, wraps it in `DistributedDataParallel`,
    counts its all-reduces with `count_allreduces`, and runs K micro-steps on its
    own examples (`rank_shards`: every example of `inputs` exactly once), each
    backward on `loss_fn(...) / K`. DDP's all-reduce averages over W, so the
    result is the gradient of the mean loss over all B x K x W examples.
    `no_sync=True` wraps the first K-1 micro-steps (forward and backward) in
    `no_sync()`: one all-reduce per update instead of K. `same_data=True` gives
    every rank rank 0's examples, the classic data-loading bug (no
    `DistributedSampler`). Runs on `pool` (default: the shared pool, started on
    first use).
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


def fsdp_runs_here(backend: str) -> tuple[bool, str]:
    """Whether FSDP2 (`fully_shard`) runs with `backend` on this torch, and if not, why.

    With NCCL (GPUs) it does. With gloo on CPU it needs torch 2.6 or newer: torch 2.5's
    FSDP2 stops with "FSDP requires CUDA for streams".
    """
    choice("backend", backend, ("gloo", "nccl"))
    if backend == "nccl":
        return True, ""
    major, minor = (int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if (major, minor) >= (2, 6):
        return True, ""
    return False, f"FSDP2 on CPU (gloo) needs torch 2.6 or newer; this is torch {torch.__version__}"


def check_batch_sizes(train_batch: int | None = None, micro_batch: int | None = None,
                      accumulation_steps: int | None = None, world_size: int | None = None) -> BatchSizes:
    """Infer the 4th of (train batch, micro-batch, accumulation steps, world size) from 3, or check all 4.

    In the spirit of DeepSpeed's "train_batch_size is not equal to
    micro_batch_per_gpu * gradient_acc_step * world_size": an inconsistent set,
    or a fourth value that would not be a whole number, raises `ValueError`
    showing every number given. Each given value must be a positive int
    (`TypeError` for a float or bool).
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


def local_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes this rank stores for `tensors`: a sharded DTensor counts only its local shard."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


# -- FSDP2: a rank's peak, not only its 1/W -------------------------------------------------
# NOTE [Measuring an FSDP2 step on CPU]
# helpers.memory cannot measure an FSDP2 step: its tracker counts a sharded DTensor parameter at
# its full (unsharded) size, and never sees the gathered parameters, because FSDP2 allocates and
# frees them by resizing storages (`UntypedStorage.resize_`), which no dispatch mode sees. The CPU
# allocator's record (torch.profiler memory events) misses the frees that gloo's own threads make,
# so under gloo it varies from run to run. torch's FSDPMemTracker is made for this step: it patches
# `resize_`, knows DTensor, and names FSDP's buffers. It is the measurement on CPU; on CUDA the
# caching allocator gives the peak and FSDPMemTracker the parts.
FSDP_TRACKER = "fsdp-mem-tracker"  # torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker
FSDP_PARTS = {  # FSDPMemTracker's categories, grouped the way lesson 07 explains a rank's peak
    "sharded_state": ("Sharded Param", "Sharded Grad", "OptState"),  # the 1/W part
    "gathered_parameters": ("Unsharded Param", "All Gather"),  # all-gathered units, the root's
    "unsharded_gradients": ("Unsharded Grad", "Reduce Scatter", "Temp"),  # before / in reduce-scatter
    "activations": ("Activation", "Inputs", "Buffer"),
}


@dataclass(frozen=True)
class FSDPStepMemory:
    """One rank's memory over one FSDP2 step (`fsdp_step_memory`).

    - `peak_bytes`: the largest live memory of the model's tensors on this rank;
    - `breakdown`: what was live at that peak, by `FSDP_PARTS` plus `other` (CUDA: what the
      allocator held beyond the tracked tensors), summing to `peak_bytes`. `unsharded_gradients`
      includes backward's temporaries, where the reduce-scatter's buffers are filled;
    - `gathered_after_forward`: unsharded parameter bytes right after each non-root unit's forward
      resharded it, in forward order: what stays gathered between units (the root's parameters);
    - `method`: `"fsdp-mem-tracker"` or `"cuda-allocator"`.
    """

    peak_bytes: int
    breakdown: dict[str, int]
    gathered_after_forward: list[int]
    method: str


def _fsdp_module_type() -> type:
    try:
        from torch.distributed.fsdp import FSDPModule  # torch >= 2.6
    except ImportError:  # torch 2.5
        from torch.distributed._composable.fsdp import FSDPModule
    return FSDPModule


def fsdp_step_memory(step: Callable[[], object], *, model: nn.Module,
                     optimizer: torch.optim.Optimizer | None = None) -> FSDPStepMemory:
    """Run `step()` once on this rank and measure the peak of an FSDP2 (`fully_shard`) model.

    The counterpart of `helpers.memory.measure_step` for a sharded model (see the NOTE above
    for why that one cannot measure it). Call it inside a worker, with `model` the root that
    `fully_shard` was applied to and the `optimizer` the step uses. Run one step before (FSDP's
    lazy initialisation, the optimizer's state), so the measured one is a steady-state step.

    Args:
        step: zero-argument callable: forward, backward, maybe `optimizer.step()`.
        model: the root FSDP module.
        optimizer: the optimizer whose state should count as sharded state.

    Returns:
        FSDPStepMemory: the peak, its parts, and what stays gathered between units.
    """
    callable_arg("step", step, "a zero-argument callable")
    if not isinstance(model, _fsdp_module_type()):
        raise ValueError(f"model must be a module that fully_shard was applied to, "
                         f"got {type(model).__name__}")
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPModState, _FSDPRefType

    device = next(model.parameters()).device
    tracker = FSDPMemTracker(model, optimizer)
    after_forward: list[int] = []

    def next_micro_step(*_: object) -> None:  # the tracker follows one forward of the root at a time
        after_forward.extend(
            snap[device].get(_FSDPRefType.UNSHARDED_PARAM, 0)
            for mod, stats in tracker.memory_tracking.items() if mod is not model
            for snap in stats.snapshots.get(_FSDPModState.AFT_POST_FW, []))
        tracker.reset_mod_stats()  # module snapshots only; the peak is kept

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    with tracker:  # entering re-registers FSDP's hooks, so ours goes in front of them afterwards
        handle = model.register_forward_pre_hook(next_micro_step, prepend=True)
        try:
            tracked_before = tracker.get_tracker_snapshot()[device]["Total"]
            step()
            next_micro_step()
        finally:
            handle.remove()
    peak = {getattr(k, "value", k): v for k, v in tracker.get_tracker_snapshot("peak")[device].items()}
    breakdown = {part: sum(peak.get(name, 0) for name in names) for part, names in FSDP_PARTS.items()}
    breakdown["other"] = peak["Total"] - sum(breakdown.values())  # a category torch adds later
    method = FSDP_TRACKER
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        rise = torch.cuda.max_memory_allocated(device) - before
        breakdown["other"] += max(0, rise - (peak["Total"] - tracked_before))
        method = "cuda-allocator"
    return FSDPStepMemory(sum(breakdown.values()), breakdown, after_forward, method)


def fully_shard_units(model: nn.Module, **kwargs: object) -> nn.Module:
    """Apply FSDP2's `fully_shard` to each module of `model.blocks` (the units), then to `model` (the root).

    The root keeps what no unit took (here the input and output layers). `kwargs` (a `mesh`,
    `reshard_after_forward`, ...) go to every call. Works on torch 2.5 (its early import path) too.
    """
    try:
        from torch.distributed.fsdp import fully_shard  # torch >= 2.6
    except ImportError:  # torch 2.5
        from torch.distributed._composable.fsdp import fully_shard
    for block in model.blocks:
        fully_shard(block, **kwargs)
    return fully_shard(model, **kwargs)


@dataclass(frozen=True)
class FSDPRankMemory:
    """One rank's FSDP2 memory: `persistent_bytes` (its shards of parameters, gradients and Adam
    state after the update) and `step` (`fsdp_step_memory` of that update)."""

    persistent_bytes: int
    step: FSDPStepMemory


def _fsdp_memory_worker(model_fn: Callable[[], nn.Module], w: int, micro_batch: int, k: int) -> dict | None:
    from torch.distributed.device_mesh import DeviceMesh

    rank = dist.get_rank()
    if rank >= w:
        return None  # this pool is larger than the requested W
    dev = torch.device("cuda", rank) if dist.get_backend() == "nccl" else torch.device("cpu")
    model = fully_shard_units(model_fn().to(dev), mesh=DeviceMesh.from_group(group_for(w), dev.type))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = (t[rank::w].to(dev) for t in lesson_data(micro_batch * k * w, seed=0))

    def update() -> None:
        for s in range(k):
            loss = mse_loss(model(x[s * micro_batch:(s + 1) * micro_batch]),
                            y[s * micro_batch:(s + 1) * micro_batch]) / k
            loss.backward()
        opt.step()

    update()  # FSDP's lazy initialisation and Adam's state; the next update is the steady state
    opt.zero_grad(set_to_none=True)
    step = fsdp_step_memory(update, model=model, optimizer=opt)
    state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
    persistent = local_bytes([*model.parameters(), *(p.grad for p in model.parameters()), *state])
    return {"persistent": persistent, "step": step}


def fsdp_rank_memory(model_fn: Callable[[], nn.Module], *, world_size: int, micro_batch: int = 4,
                     accumulation_steps: int = 1, timeout_s: float = 120.0,
                     pool: WorkerPool | None = None) -> list[FSDPRankMemory]:
    """Each rank's persistent state and peak over one Adam update of an FSDP2 model on W real workers.

    Each of the first `world_size` workers of `pool` builds `model_fn()` (picklable; the
    model has `blocks`), shards it with `fully_shard_units` over those W ranks, runs one update
    (K micro-steps of `micro_batch` examples of `lesson_data`, gradients reduce-scattered every
    micro-step, then Adam), and measures a second one with `fsdp_step_memory`.

    Args:
        model_fn: builds the unsharded model, the same on every rank.
        world_size: W, at most the pool's size.
        micro_batch: examples per micro-step on each rank.
        accumulation_steps: micro-steps per update (K).
        timeout_s: deadline for the run.
        pool: the workers (default: the shared pool, started on first use).

    Returns:
        list[FSDPRankMemory]: one per rank, in rank order.
    """
    callable_arg("model_fn", model_fn)
    positive_int("micro_batch", micro_batch)
    positive_int("accumulation_steps", accumulation_steps)
    positive_int("world_size", world_size)
    if pool is None:
        pool = shared_pool(max(world_size, max_workers()))
    if world_size > pool.world_size:
        raise ValueError(f"world_size={world_size} is larger than the pool ({pool.world_size} workers)")
    out = pool.run(_fsdp_memory_worker, model_fn, world_size, micro_batch, accumulation_steps,
                   timeout_s=timeout_s)
    return [FSDPRankMemory(r["persistent"], r["step"]) for r in out[:world_size]]


# -- widget ----------------------------------------------------------------------------------
def lesson_sizes(scale: str) -> dict[str, int]:
    """The lesson's default B, K, W and model width at `scale` (W: 2, or the GPUs under NCCL)."""
    from helpers.device import by_scale

    bk = by_scale(scale, tiny=(2, 2), small=(4, 4), medium=(8, 4), full=(8, 4))
    return {"B": bk[0], "K": bk[1], "W": min(2, max_workers()) if max_workers() < 4 else max_workers(),
            "width": SIZES[scale]}


@dataclass(frozen=True)
class DataParallelReport:
    """One widget answer: the sizes, all-reduces per update both ways, and the gradient match."""

    sizes: BatchSizes
    calls_no_sync: int
    calls_every_step: int
    diff: object  # helpers.accumulation.GradDiff against one process on the full batch
    ranks_agree: bool


def data_parallel_report(micro_batch: int, accumulation_steps: int, world_size: int, *, width: int = 64,
                         pool: WorkerPool | None = None, seed: int = 0) -> DataParallelReport:
    """Run one update of B x K x W on real DDP workers, with and without no_sync; compare to one process."""
    import functools

    from helpers.accumulation import compare_grads, full_batch_grad

    sizes = check_batch_sizes(None, micro_batch, accumulation_steps, world_size)
    x, y = lesson_data(sizes.train_batch, seed=seed)
    model_fn = functools.partial(lesson_model, width)
    ref = full_batch_grad(model_fn(), mse_loss, x, y)
    kw = dict(micro_batch=micro_batch, accumulation_steps=accumulation_steps, world_size=world_size,
              pool=pool)
    quiet = ddp_accumulated_grad(model_fn, mse_loss, x, y, no_sync=True, **kw)
    loud = ddp_accumulated_grad(model_fn, mse_loss, x, y, no_sync=False, **kw)
    return DataParallelReport(sizes, quiet.allreduce_calls, loud.allreduce_calls,
                              compare_grads(ref, quiet.grad), quiet.ranks_agree and loud.ranks_agree)


def draw_report(report: DataParallelReport) -> object:
    """Left: who computes which examples (W ranks x K micro-steps of B). Right: all-reduces per update."""
    from matplotlib.patches import Rectangle

    from helpers import plots

    s = report.sizes
    fig, (left, right) = plots.figure(2, width=9.0, height=3.2)
    colors = ["#4C72B0", "#DD8452", "#55A868", "#8172B2"]
    for r in range(s.world_size):
        for k in range(s.accumulation_steps):
            alpha = 0.3 + 0.6 * (k + 1) / s.accumulation_steps
            color = colors[r % len(colors)]
            left.add_patch(Rectangle((k + 0.05, r + 0.05), 0.9, 0.9, color=color, alpha=alpha))
            if s.accumulation_steps <= 8:
                left.text(k + 0.5, r + 0.5, f"B={s.micro_batch}", ha="center", va="center", fontsize=8)
    left.set_xlim(0, s.accumulation_steps)
    left.set_ylim(s.world_size, 0)
    left.set_xlabel("micro-step (K)")
    left.set_ylabel("worker rank (W)")
    left.set_title(f"B x K x W = {s.micro_batch} x {s.accumulation_steps} x {s.world_size} = {s.train_batch}")
    left.grid(False)
    labels = ["no_sync on K-1\nmicro-steps", "sync every\nmicro-step"]
    values = [report.calls_no_sync, report.calls_every_step]
    right.bar(labels, values, color=["#55A868", "#C44E52"])
    for i, v in enumerate(values):
        right.annotate(str(v), (i, v), ha="center", va="bottom")
    right.set_ylabel("gradient all-reduces per update")
    right.set_ylim(0, max(values) * 1.25 + 0.5)
    right.set_title(f"vs one process: max_rel {report.diff.max_rel:.1e}")
    return fig


def show_data_parallel(micro_batch: int = 4, accumulation_steps: int = 4, world_size: int = 2,
                       *, width: int = 64) -> None:
    """The widget's work: measure with `data_parallel_report` on the shared pool, print and draw it."""
    from helpers import plots

    report = data_parallel_report(micro_batch, accumulation_steps, world_size, width=width)
    s = report.sizes
    match = "matches" if report.diff.max_rel <= 1e-5 else "does NOT match"
    print(f"effective batch B x K x W = {s.micro_batch} x {s.accumulation_steps} x {s.world_size} = "
          f"{s.train_batch} | all-reduces per update: {report.calls_no_sync} with no_sync, "
          f"{report.calls_every_step} without | gradient {match} one process on {s.train_batch} examples "
          f"(max_rel {report.diff.max_rel:.1e}) | ranks agree: {report.ranks_agree}")
    plots.show(draw_report(report))


PEAK_COLORS = {"sharded_state": "#A6B4CF", "gathered_parameters": "#C44E52",
               "unsharded_gradients": "#CCB974", "activations": "#DD8452", "other": "#999999"}


def draw_fsdp_memory(state: dict[str, int], persistent: dict[str, int], peak: FSDPStepMemory,
                     held: dict[str, list[int]], world_size: int) -> object:
    """Left: per rank, DDP's state, FSDP's persistent state and FSDP's peak, with the 1/W line.

    Right: gradient bytes kept after each micro-step, with sync every micro-step and with sync off
    (`held`: {"sync_every_step": [...], "sync_off": [...]}). `state` and `persistent` are bytes by
    category (parameters, gradients, optimizer_state); `peak` is rank 0's `fsdp_step_memory`.
    """
    from helpers import plots

    w = positive_int("world_size", world_size)
    fig, (left, right) = plots.figure(2, width=10.5, height=3.6)
    unit, size = plots.byte_unit(max(sum(state.values()), peak.peak_bytes))
    bars = [(0, state, plots.COLORS, ""), (1, persistent, plots.COLORS, ""),
            (2, peak.breakdown, PEAK_COLORS, "peak: ")]
    for x, parts, colors, prefix in bars:
        bottom = 0.0
        for name, value in parts.items():
            if value:
                label = f"{prefix}{name.replace('_', ' ')}" if x != 1 else None
                left.bar(x, value / size, bottom=bottom, color=colors.get(name), label=label, width=0.6)
                bottom += value / size
    left.axhline(sum(state.values()) / w / size, color="black", ls="--", lw=1.2, label=f"1/{w} of the state")
    left.set_xticks([0, 1, 2], ["DDP:\nstate", "FSDP:\npersistent", "FSDP:\npeak"])
    left.set_ylabel(unit)
    left.set_title(f"Per rank (rank 0 of {w})")
    left.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    labels = {"sync_every_step": "sync every micro-step", "sync_off": "sync off until the last"}
    for mode, values in held.items():
        right.plot(range(1, len(values) + 1), [b / 1024 for b in values], marker="o",
                   label=labels.get(mode, mode))
    right.set_xticks(range(1, max(map(len, held.values()), default=0) + 1))
    right.set_xlabel("after micro-step")
    right.set_ylabel("gradient KiB held (rank 0)")
    right.set_title("Kept between micro-steps")
    right.legend(fontsize=8)
    return fig


# -- the lesson protocol -----------------------------------------------------------------------
def _mlp_params(width: int) -> int:
    per_block = 2 * width + (width * 4 * width + 4 * width) + (4 * width * width + width)
    return (D_IN * width + width) + DEPTH * per_block + (width * D_OUT + D_OUT)


def predicted_peak_bytes(scale: str) -> int:
    """Predicted peak of the lesson's largest experiment at `scale`, summed over the W processes.

    Per process: the fp32 model with gradients and Adam's two moments (16 bytes
    per parameter, the figure lesson 01 measures) plus the activations of one
    micro-batch (4 bytes x depth x 11 x width per example: LayerNorm, fc1, GELU
    and fc2 outputs of each block). The experiments are small at every scale:
    this lesson is about communication, not memory.
    """
    from helpers.device import SCALES

    sizes = lesson_sizes(choice("scale", scale, SCALES))
    w = sizes["width"]
    per_process = 16 * _mlp_params(w) + 4 * sizes["B"] * DEPTH * 11 * w
    return sizes["W"] * per_process


def widget_latency_cases(scale: str, device: torch.device) -> dict[str, Callable[[], object]]:
    """One callable per slider move of the lesson's widget (B, K and W), on the shared worker pool.

    The target for this lesson is 2 s per move, not 1 s: every move runs two
    real DDP updates (with and without `no_sync`) across worker processes.
    Building the cases starts the pool (process start-up is paid once, here).
    """
    sizes = lesson_sizes(scale)
    b, k, w, width = sizes["B"], sizes["K"], sizes["W"], sizes["width"]
    shared_pool(max(w, max_workers()))

    def move(bb: int, kk: int, ww: int) -> Callable[[], object]:
        return lambda: show_data_parallel(bb, kk, ww, width=width)

    return {
        f"B={b * 2}": move(b * 2, k, w), "B=1": move(1, k, w),
        "K=1": move(b, 1, w), f"K={k * 2}": move(b, k * 2, w),
        "W=1": move(b, k, 1), f"W={max_workers()}": move(b, k, max_workers()),
    }


# -- exercises ---------------------------------------------------------------------------------
def check_exercise_1(answer: object) -> str:
    """Exercise 1: train batch 1024 on 16 GPUs with micro-batch 8: how many accumulation steps?"""
    right = check_batch_sizes(1024, 8, None, 16).accumulation_steps
    if answer == right:
        return f"Correct: 1024 / (8 x 16) = {right} accumulation steps."
    return ("Not yet: the train batch is B x K x W. Divide 1024 by the micro-batch and by the number "
            "of GPUs (check_batch_sizes(1024, 8, None, 16) does it for you).")


def check_exercise_2(answer: object) -> str:
    """Exercise 2: flag set after the forward, K = 8: (all-reduces per update, micro-step that syncs)?"""
    if isinstance(answer, tuple) and len(answer) == 2 and tuple(answer) == (1, 0):
        return ("Correct: one all-reduce, on micro-step 0 (its forward ran while the flag was still True "
                "from the previous update); micro-steps 1-7 stay local, so the ranks disagree.")
    return ("Not yet: answer a tuple (count, micro_step). DDP decides at the *forward* whether the next "
            "backward all-reduces. Which forwards run while require_backward_grad_sync is True?")


def check_exercise_3(answer: object) -> str:
    """Exercise 3: 1 GB of fp32 weights, Adam, FSDP over W=4: GB of persistent state per rank?"""
    if isinstance(answer, int | float) and not isinstance(answer, bool) and abs(answer - 1.0) <= 0.05:
        return ("Correct: weights 1 + gradients 1 + Adam's two moments 2 = 4 GB, and FSDP keeps a quarter "
                "of each on each of 4 ranks: 1 GB between steps. That is not the peak: during a step a rank "
                "also holds the root's weights, the gathered unit (and the next one) and a unit's full "
                "gradients before the reduce-scatter. Accumulating with sync off adds the unsharded "
                "gradients (1 GB more) between micro-steps.")
    return ("Not yet: count weights, gradients and Adam's two moments (each the size of the weights), "
            "then divide by the number of ranks, as the FSDP section measured.")
