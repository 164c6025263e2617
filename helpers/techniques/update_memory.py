"""One accumulation update measured whole: the explainer's table rows and the micro-batch sweep.

- `measure_update(model, micro_batch=, steps=)` -> `StepMemory`: one update of K micro-steps
  and the optimizer step, after a warm-up that creates the optimizer state, as the explainer's
  loop is written (lessons 01 and 02, the ledger).
- `measure_config(...)` -> `ConfigMemory`: the same, as a row of the explainer's table
  (B, K, peak, activations, floor, other).
- `breakdown_for(model, b)` and `activation_sweep(model, sizes)`: the peak's breakdown at
  several micro-batch sizes (lesson 01's sweep), an OOM shown as None.

`helpers.techniques.phases` measures an update phase by phase.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from helpers.core.data import token_batch
from helpers.core.device import device_of
from helpers.core.training import lm_loss, make_optimizer
from helpers.core.validate import int_at_least, positive_int
from helpers.measure.memory import StepMemory, measure_step, run_or_oom
from helpers.measure.tracker import release_point
from helpers.models.gpt import GPT
from helpers.models.nets import BlockWrapper
from helpers.techniques.checkpointing import apply_ac

__all__ = ["ConfigMemory", "activation_sweep", "breakdown_for", "measure_config", "measure_update"]


def _batch(model: GPT, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    cfg = model.cfg
    return token_batch(n, cfg.seq_len, cfg.vocab_size, seed=seed, device=device_of(model))


@dataclass(frozen=True)
class ConfigMemory:
    """A measured row: one accumulation update of `steps` micro-batches of `micro_batch`."""

    micro_batch: int
    steps: int
    peak_bytes: int
    activations_bytes: int
    floor_bytes: int
    other_bytes: int
    method: str

    @property
    def effective_batch(self) -> int:
        """Examples per optimizer update: micro-batch x steps."""
        return self.micro_batch * self.steps


def measure_update(
    model: GPT, *, micro_batch: int, steps: int, optimizer: str = "adam",
    block_wrapper: str | BlockWrapper | None = None, seed: int = 0, max_micro_steps: int | None = None,
) -> StepMemory:
    """Measure one accumulation update of `steps` micro-batches of `micro_batch` examples.

    A first, unmeasured update of one micro-step creates the optimizer state,
    as in steady training. The measured update then runs `steps` forward/backward
    passes on `loss / steps`, followed by one optimizer step, so from the second
    micro-step on the gradients are alive next to the activations. It is the
    explainer's loop as written: `predictions` and `loss` stay bound until the next
    micro-step reassigns them, and the last ones through the optimizer step.

    Args:
        model: the GPT measured.
        micro_batch, steps: B and K.
        optimizer: a name in `OPTIMIZERS`.
        block_wrapper: a wrapper such as a checkpoint call, or a mode of
            `helpers.techniques.checkpointing.apply_ac` such as "full" (None: plain), applied meanwhile.
        seed: seeds the token batches.
        max_micro_steps: (>= 2) run only that many of the `steps` micro-steps. Every micro-step
            from the second on holds the same memory, so the peak of the whole update is the
            peak of its first two micro-steps and the optimizer step (lesson 01 checks this).

    Returns:
        The `StepMemory` of the measured update.
    """
    positive_int("micro_batch", micro_batch)
    positive_int("steps", steps)
    if max_micro_steps is not None:  # >= 2: the steady state starts at the second micro-step
        int_at_least("max_micro_steps", max_micro_steps, 2)
    opt = make_optimizer(optimizer, model)
    real_steps = steps if max_micro_steps is None else min(steps, max_micro_steps)
    batches = [_batch(model, micro_batch, seed + i) for i in range(real_steps)]
    def update(micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        opt.zero_grad(set_to_none=True)
        for idx, targets in micro_batches:
            predictions = model(idx)
            loss = lm_loss(predictions, targets)
            release_point(predictions, loss)  # where `del predictions` would drop them; changes nothing
            (loss / steps).backward()
        opt.step()

    with apply_ac(model, block_wrapper):
        try:
            update(batches[:1])  # warm-up: optimizer state now exists
            return measure_step(lambda: update(batches), model=model, optimizer=opt)
        finally:
            opt.zero_grad(set_to_none=True)


def measure_config(
    model: GPT, *, micro_batch: int, steps: int, optimizer: str = "adam",
    block_wrapper: str | BlockWrapper | None = None, seed: int = 0, max_micro_steps: int | None = None,
) -> ConfigMemory:
    """`measure_update` summarised as a row of the explainer's table.

    Args:
        model, micro_batch, steps, optimizer, block_wrapper, seed, max_micro_steps: as for
            `measure_update`.

    Returns:
        A `ConfigMemory` (B, K, peak, activations, floor, other, method).
    """
    mem = measure_update(model, micro_batch=micro_batch, steps=steps, optimizer=optimizer,
                         block_wrapper=block_wrapper, seed=seed, max_micro_steps=max_micro_steps)
    b = mem.breakdown
    return ConfigMemory(micro_batch, steps, mem.peak_bytes, b["activations"], mem.floor_bytes,
                        b["other"], mem.method)


def breakdown_for(model: GPT, micro_batch: int, optimizer: str = "adam") -> StepMemory | None:
    """Peak breakdown of a two-micro-step update at `micro_batch`, or None on CUDA OOM.

    This is the pure function behind lesson 01's sweep.
    """
    return run_or_oom(lambda: measure_update(model, micro_batch=micro_batch, steps=2, optimizer=optimizer))


def activation_sweep(
    model: GPT, micro_batches: Sequence[int], optimizer: str = "adam", progress: bool = True
) -> dict[int, StepMemory | None]:
    """`breakdown_for` at each micro-batch size, with a progress bar.

    Args:
        model: the GPT measured.
        micro_batches: at least two sizes.
        optimizer: a name in `OPTIMIZERS`.
        progress: show the progress bar.

    Returns:
        {micro-batch: its `StepMemory`, or None for an OOM}.

    Raises:
        ValueError: for fewer than two sizes.
    """
    if len(micro_batches) < 2:
        raise ValueError(f"need at least two micro-batch sizes, got {list(micro_batches)}")
    from helpers.core.display import progress as progress_line

    sizes = progress_line(micro_batches, desc="micro-batch sweep") if progress else micro_batches
    return {b: breakdown_for(model, b, optimizer) for b in sizes}
