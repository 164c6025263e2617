"""What a step costs besides memory: FLOPs counted by torch, ops launched, and wall-clock time (shown,
never asserted).

- `count_flops(fn)`, `blocks_forward_flops(model, b)`: FLOPs from `torch.utils.flop_counter`.
- `count_ops(fn)`: aten ops dispatched (kernel launches), with a `helpers.measure.dispatch.OpObserver`.
- `interleaved_times(fns)` -> {name: `Timing`}: THE timing helper (warmed up, interleaved);
  `Timing` holds seconds, and `Timing.per_second(n)` the same runs as a rate.
- `throughput_sweep(model, loss_fn, inputs, targets, sizes)`: examples per second of one
  accumulated update per micro-batch size, timed by `interleaved_times` (lesson 03).
- `TradeOffs(model).measure(B, K, checkpointed)` -> `TradeOff`: an update's measured memory,
  counted FLOPs and time, with or without checkpointing (lesson 02's widget).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from helpers.core.data import token_batch
from helpers.core.device import device_of, synchronize
from helpers.core.training import OPTIMIZERS, clear_grads, lm_loss
from helpers.core.validate import bool_arg, callable_arg, choice, instance_arg, int_at_least, positive_int
from helpers.measure.dispatch import OpObserver
from helpers.measure.memory import StepMemory, run_or_oom
from helpers.models.gpt import GPT
from helpers.techniques.accumulation import LossFn, accumulated_grad, check_batch, check_micro_batch
from helpers.techniques.checkpointing import apply_ac
from helpers.techniques.update_memory import measure_update

__all__ = [
    "Timing", "TradeOff", "TradeOffs", "blocks_forward_flops", "count_flops", "count_ops",
    "interleaved_times", "throughput_sweep",
]


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs that `torch.utils.flop_counter.FlopCounterMode` counts while `fn()` runs.

    It counts matmuls, convolutions and attention; pointwise ops count zero.

    Args:
        fn: the work to count, a zero-argument callable.

    Returns:
        The total FLOPs.
    """
    callable_arg("fn", fn, "a zero-argument callable")
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


class _OpCounter(OpObserver):
    """Count the aten ops that run inside (each one a kernel launch on a GPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def observe(self, func, args, kwargs, out) -> None:  # noqa: ANN001
        """One more op."""
        self.ops += 1


def count_ops(fn: Callable[[], object]) -> int:
    """How many aten ops run while `fn()` runs (forward, backward and all).

    Args:
        fn: a zero-argument callable, the work to count.

    Returns:
        The number of aten ops dispatched, seen by a `helpers.measure.dispatch.OpObserver`.
    """
    callable_arg("fn", fn, "a zero-argument callable")
    with _OpCounter() as counter:
        fn()
    return counter.ops


def blocks_forward_flops(model: GPT, micro_batch: int) -> int:
    """FLOPs of one forward of `model`'s blocks (the region `make_block_wrapper` checkpoints).

    Counted with `count_flops` on a random input of the blocks' shape, under `no_grad`:
    the most a full recompute can cost per micro-step (early stop can make it less).
    """
    instance_arg("model", model, GPT, "helpers.models.gpt.GPT")
    positive_int("micro_batch", micro_batch)
    cfg = model.cfg
    x = torch.zeros(micro_batch, cfg.seq_len, cfg.d_model, device=device_of(model))
    with torch.no_grad():
        return count_flops(lambda: [block(x) for block in model.blocks])


@dataclass(frozen=True)
class Timing:
    """Wall-clock seconds of repeated runs: the median and the spread (min and max).

    `per_second(n)` views the same runs as a rate (n things per second), e.g. examples per second.
    """

    median: float
    low: float
    high: float
    runs: int

    def scaled(self, factor: float) -> Timing:
        """The same timing multiplied by `factor` (e.g. K micro-steps per update)."""
        return Timing(self.median * factor, self.low * factor, self.high * factor, self.runs)

    def per_second(self, n: float) -> Timing:
        """The same runs as `n` per second: `low` from the slowest run, `high` from the fastest."""
        return Timing(n / self.median, n / self.high, n / self.low, self.runs)

    def describe(self) -> str:
        """E.g. '12.3 ms (min-max 11.9-14.0 ms, 5 runs)'."""
        return (f"{1e3 * self.median:.1f} ms (min-max {1e3 * self.low:.1f}-{1e3 * self.high:.1f} ms, "
                f"{self.runs} runs)")


def interleaved_times(
    fns: Mapping[str, Callable[[], object]], *, device: torch.device | str = "cpu",
    repeats: int = 5, warmup: int = 1, skip_oom: bool = False,
) -> dict[str, Timing]:
    """Time each callable `repeats` times, interleaved, after `warmup` untimed runs of each.

    Round r runs every callable once, in forward order on even rounds and reversed
    on odd ones, so a slow spell of a shared machine hits all of them alike. On
    CUDA the device is synchronized around each run. Timings are for showing:
    on a shared CPU they are noisy, and lessons never assert on them.

    Args:
        fns: name -> zero-argument callable, the work to time.
        device: the device to synchronize around each run.
        repeats: timed runs of each callable (>= 1).
        warmup: untimed runs of each callable first (>= 0).
        skip_oom: drop a callable that runs out of CUDA memory (`helpers.memory.run_or_oom`)
            from then on; it is left out of the result. Otherwise the error propagates.

    Returns:
        name -> `Timing` (median, min and max seconds of its timed runs).

    Raises:
        ValueError: if `fns` is empty or holds something not callable, or a count is out of range.
    """
    if not fns or not all(callable(f) for f in fns.values()):
        raise ValueError(f"fns must be a non-empty mapping of name -> callable, got {fns!r}")
    int_at_least("repeats", repeats, 1)
    int_at_least("warmup", warmup, 0)
    bool_arg("skip_oom", skip_oom)
    device = torch.device(device)
    alive = list(fns)

    def ran(name: str) -> bool:
        if not skip_oom:
            fns[name]()
            return True
        return run_or_oom(lambda: (fns[name](), True)[1]) is not None

    for _ in range(warmup):
        for name in list(alive):
            if not ran(name):
                alive.remove(name)
    samples: dict[str, list[float]] = {name: [] for name in alive}
    for r in range(repeats):
        for name in list(alive) if r % 2 == 0 else alive[::-1]:
            synchronize(device)
            start = time.perf_counter()
            if not ran(name):
                alive.remove(name)
                continue
            synchronize(device)
            samples[name].append(time.perf_counter() - start)
    out = {}
    for name in alive:
        times = sorted(samples[name])
        out[name] = Timing(times[len(times) // 2], times[0], times[-1], len(times))
    return out


def throughput_sweep(
    model: nn.Module, loss_fn: LossFn, inputs: torch.Tensor, targets: torch.Tensor,
    micro_batches: Sequence[int], *, rounds: int = 5,
) -> dict[int, Timing | None]:
    """Examples per second of one accumulated update over all of `inputs`, per micro-batch size.

    Timed by `helpers.techniques.costs.interleaved_times`: every size runs once to warm up; then
    `rounds` rounds each time every size once, interleaved, so that a slow spell of a
    shared machine hits all sizes alike. Timings are for showing, never for asserting.

    Args:
        model: the model.
        loss_fn: `loss_fn(model(x), y)` -> a mean loss.
        inputs, targets: the effective batch.
        micro_batches: the sizes to time (each 1 to the batch).
        rounds: timed rounds.

    Returns:
        {size: `Timing.per_second` (the median and the range, slowest to fastest round), or
        None for an out-of-memory size}.

    Raises:
        ValueError: if `micro_batches` is empty.
    """
    n = check_batch(inputs, targets)
    positive_int("rounds", rounds)
    sizes = list(micro_batches)
    if not sizes:
        raise ValueError("micro_batches is empty; give at least one micro-batch size")
    for m in sizes:
        check_micro_batch(m, n)
    work = {m: partial(accumulated_grad, model, loss_fn, inputs, targets, m) for m in sizes}
    times = interleaved_times(work, device=device_of(model), repeats=rounds, warmup=1, skip_oom=True)
    clear_grads(model)
    return {m: times[m].per_second(n) if m in times else None for m in sizes}


# -- B x K with and without checkpointing: memory, FLOPs and time per update (lesson 02) ------
@dataclass(frozen=True)
class TradeOff:
    """One configuration: micro-batch B, K accumulation steps, with or without checkpointing.

    Memory comes from a measured update (`helpers.techniques.update_memory.measure_update`), FLOPs
    from FlopCounterMode on one micro-step times K, time from interleaved
    micro-step timings times K (shown, not asserted).
    """

    micro_batch: int
    steps: int
    checkpointed: bool
    memory: StepMemory
    flops_per_update: int
    plain_flops_per_update: int
    time_per_update: Timing

    @property
    def effective_batch(self) -> int:
        """Examples per optimizer update: B x K."""
        return self.micro_batch * self.steps

    @property
    def extra_flops(self) -> int:
        """FLOPs per update beyond the same B x K without checkpointing."""
        return self.flops_per_update - self.plain_flops_per_update

    @property
    def label(self) -> str:
        """E.g. '4 x 8, checkpointed'."""
        return f"{self.micro_batch} x {self.steps}" + (", checkpointed" if self.checkpointed else "")


class TradeOffs:
    """Measures `TradeOff`s on one model and caches what a slider move does not change.

    - memory: a measured update of min(K, 2) micro-steps, cached per (B, min(K, 2),
      checkpointed): from the second micro-step on, the peak is the same for any K
      (the notebook asserts this once against a full K-step update);
    - FLOPs and time of one micro-step, with and without checkpointing, cached per B;
      per update they are K times that (the notebook asserts it for FLOPs).

    Args:
        model: the GPT measured.
        repeats: timed runs of each micro-step.
        optimizer: a name in `OPTIMIZERS`.
    """

    def __init__(self, model: GPT, *, repeats: int = 3, optimizer: str = "adam") -> None:
        self.model = instance_arg("model", model, GPT, "helpers.models.gpt.GPT")
        self.repeats = positive_int("repeats", repeats)
        self.optimizer = choice("optimizer", optimizer, OPTIMIZERS)
        self._memory: dict[tuple[int, int, bool], StepMemory] = {}
        self._micro: dict[int, tuple[int, int, Timing, Timing]] = {}

    @staticmethod
    def mode(checkpointed: bool) -> str:
        """The `apply_ac` mode: "full" (`checkpoint(block, x, use_reentrant=False)`) or "none"."""
        return "full" if checkpointed else "none"

    def micro_step(self, micro_batch: int, checkpointed: bool) -> Callable[[], None]:
        """One forward + backward of `micro_batch` examples (gradients cleared after)."""
        cfg, model = self.model.cfg, self.model
        idx, targets = token_batch(micro_batch, cfg.seq_len, cfg.vocab_size, seed=0, device=device_of(model))
        mode = self.mode(checkpointed)

        def step() -> None:
            with apply_ac(model, mode):
                try:
                    lm_loss(model(idx), targets).backward()
                finally:
                    model.zero_grad(set_to_none=True)

        return step

    def _micro_costs(self, b: int) -> tuple[int, int, Timing, Timing]:
        if b not in self._micro:
            plain, ckpt = self.micro_step(b, False), self.micro_step(b, True)
            flops = count_flops(plain), count_flops(ckpt)  # these runs also warm both steps up
            times = interleaved_times({"plain": plain, "ckpt": ckpt},
                                      device=device_of(self.model),
                                      repeats=self.repeats, warmup=0)
            self._micro[b] = (*flops, times["plain"], times["ckpt"])
        return self._micro[b]

    def measure(self, micro_batch: int, steps: int, checkpointed: bool) -> TradeOff | None:
        """The trade-off of B x K (checkpointed or not), or None when CUDA runs out of memory."""
        int_at_least("micro_batch", micro_batch, 1)
        int_at_least("steps", steps, 1)
        bool_arg("checkpointed", checkpointed)
        key = (micro_batch, min(steps, 2), checkpointed)
        if key not in self._memory:
            mem = run_or_oom(lambda: measure_update(self.model, micro_batch=micro_batch, steps=key[1],
                                                    optimizer=self.optimizer,
                                                    block_wrapper=self.mode(checkpointed)))
            if mem is None:
                return None
            self._memory[key] = mem
        costs = run_or_oom(lambda: self._micro_costs(micro_batch))
        if costs is None:
            return None
        plain_flops, ckpt_flops, plain_t, ckpt_t = costs
        flops = ckpt_flops if checkpointed else plain_flops
        timing = (ckpt_t if checkpointed else plain_t).scaled(steps)
        return TradeOff(micro_batch, steps, checkpointed, self._memory[key], steps * flops,
                        steps * plain_flops, timing)
