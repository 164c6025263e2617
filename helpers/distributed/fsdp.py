"""FSDP2 on real processes: what a rank stores, and its measured peak over one step (lesson 07).

- `fsdp_runs_here(backend)`: whether FSDP2 (`fully_shard`) runs with this backend and torch.
- `local_bytes`: what a rank stores of (possibly sharded) tensors: its persistent state.
- `fsdp_step_memory` -> `FSDPStepMemory`: a rank's peak over one FSDP2 step, and its parts (sharded
  state, gathered parameters, unsharded gradients, activations).
- `fully_shard_units`, `fsdp_rank_memory` (every rank, on the worker pool) and `counted_model`
  (a `LinearStack`), whose units you can count by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from helpers.core.validate import callable_arg, choice, positive_int
from helpers.distributed.ddp import D_IN, D_OUT, lesson_data, mse_loss
from helpers.distributed.launcher import WorkerPool, group_for, shared_pool
from helpers.distributed.processes import max_workers

__all__ = [
    "FSDP_PARTS", "FSDP_TRACKER", "FSDPRankMemory", "FSDPStepMemory", "LinearStack", "counted_model",
    "fsdp_rank_memory", "fsdp_runs_here", "fsdp_step_memory", "fully_shard_units", "local_bytes",
]


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


def fsdp_runs_here(backend: str) -> tuple[bool, str]:
    """Whether FSDP2 (`fully_shard`) runs with `backend` on this torch, and if not, why.

    With NCCL (GPUs) it does. With gloo on CPU it needs torch 2.6 or newer: torch 2.5's
    FSDP2 stops with "FSDP requires CUDA for streams".

    Args:
        backend: "gloo" or "nccl".

    Returns:
        (runs, why not): why is "" when it runs.
    """
    choice("backend", backend, ("gloo", "nccl"))
    if backend == "nccl":
        return True, ""
    major, minor = (int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if (major, minor) >= (2, 6):
        return True, ""
    return False, f"FSDP2 on CPU (gloo) needs torch 2.6 or newer; this is torch {torch.__version__}"


def local_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes this rank stores for `tensors`: a sharded DTensor counts only its local shard.

    Args:
        tensors: tensors or DTensors (None entries are skipped).

    Returns:
        The bytes.
    """
    total = 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


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

    Raises:
        ValueError: if `fully_shard` was not applied to `model`.
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
