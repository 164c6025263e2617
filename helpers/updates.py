"""One accumulation update, measured and predicted (core: lessons 01, 02, 06 and 08).

- `measure_update()` runs one whole accumulation update (K micro-steps of `loss / K`,
  then the optimizer step) of the explainer-sized GPT under `helpers.memory.measure_step`;
  `measure_config()` summarises it as a row of the explainer's table (`ConfigMemory`),
  and `plot_measured_table()` draws such rows.
- `breakdown_for()` and `activation_sweep()` measure the breakdown at several
  micro-batch sizes (an OOM becomes None); `linear_fit()` fits a line and its R².
- `activation_bytes_per_example()`, `held_logits_bytes_per_example()` and
  `predicted_update_peak_bytes()` are the formulas lesson 01 checks against those
  measurements, and that the scale tests use to size each lesson for a GPU class.

The measured update is the explainer's loop as written: `predictions = model(idx)` and
`loss = ...` are variables, so the logits stay alive until the next micro-step reassigns
them, through the next forward pass and, for the last micro-step, through the optimizer
step. At the peak (the start of a backward pass) the activations are what autograd saved
plus those held logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from helpers import plots
from helpers.data import token_batch
from helpers.memory import StepMemory, measure_step, run_or_oom
from helpers.models import GPT, BlockWrapper, device_of
from helpers.tracker import release_point
from helpers.training import lm_loss, make_optimizer
from helpers.validate import int_at_least, positive_int

__all__ = [
    "BUDGET_LABEL", "ConfigMemory", "activation_sweep", "breakdown_for", "measure_config", "measure_update",
    "plot_measured_table",
]

BUDGET_LABEL = "24 GB budget, scaled (drawn)"


def _batch(model: GPT, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    cfg = model.cfg
    return token_batch(n, cfg.seq_len, cfg.vocab_size, seed=seed, device=device_of(model))


# -- formulas the lesson checks against measurement ------------------------------------------


# -- measured rows -----------------------------------------------------------------------------
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
    block_wrapper: BlockWrapper | None = None, seed: int = 0, max_micro_steps: int | None = None,
) -> StepMemory:
    """Measure one accumulation update of `steps` micro-batches of `micro_batch` examples.

    A first, unmeasured update of one micro-step creates the optimizer state,
    as in steady training. The measured update then runs `steps` forward/backward
    passes on `loss / steps`, followed by one optimizer step, so from the second
    micro-step on the gradients are alive next to the activations. It is the
    explainer's loop as written: `predictions` and `loss` stay bound until the next
    micro-step reassigns them, and the last ones through the optimizer step.
    `block_wrapper` (for example a checkpoint call) is set on the model for the
    duration.

    `max_micro_steps` (>= 2) runs only that many of the `steps` micro-steps. Every
    micro-step from the second on holds the same memory (same shapes, gradients
    already alive), so the peak of the whole update is the peak of its first two
    micro-steps and the optimizer step; lesson 01 checks this before its widget
    relies on it.
    """
    positive_int("micro_batch", micro_batch)
    positive_int("steps", steps)
    if max_micro_steps is not None:  # >= 2: the steady state starts at the second micro-step
        int_at_least("max_micro_steps", max_micro_steps, 2)
    opt = make_optimizer(optimizer, model)
    real_steps = steps if max_micro_steps is None else min(steps, max_micro_steps)
    batches = [_batch(model, micro_batch, seed + i) for i in range(real_steps)]
    previous, model.block_wrapper = model.block_wrapper, block_wrapper

    def update(micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        opt.zero_grad(set_to_none=True)
        for idx, targets in micro_batches:
            predictions = model(idx)
            loss = lm_loss(predictions, targets)
            release_point(predictions, loss)  # where `del predictions` would drop them; changes nothing
            (loss / steps).backward()
        opt.step()

    try:
        update(batches[:1])  # warm-up: optimizer state now exists
        return measure_step(lambda: update(batches), model=model, optimizer=opt)
    finally:
        model.block_wrapper = previous
        opt.zero_grad(set_to_none=True)


def measure_config(
    model: GPT, *, micro_batch: int, steps: int, optimizer: str = "adam",
    block_wrapper: BlockWrapper | None = None, seed: int = 0, max_micro_steps: int | None = None,
) -> ConfigMemory:
    """`measure_update` summarised as a row of the explainer's table."""
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
    """`breakdown_for` at each micro-batch size, with a progress bar (None marks an OOM)."""
    if len(micro_batches) < 2:
        raise ValueError(f"need at least two micro-batch sizes, got {list(micro_batches)}")
    from tqdm.auto import tqdm

    sizes = tqdm(micro_batches, desc="micro-batch sweep", disable=not progress)
    return {b: breakdown_for(model, b, optimizer) for b in sizes}


def plot_measured_table(rows: Sequence[ConfigMemory], labels: Sequence[str] | None = None,
                        budget: float | None = None, *, budget_label: str = BUDGET_LABEL) -> None:
    """Stacked bars (floor, activations, other) of measured rows, with an optional budget line."""
    if not rows:
        raise ValueError("rows is empty: measure at least one configuration")
    labels = list(labels) if labels is not None else [f"{r.micro_batch} x {r.steps}" for r in rows]
    if len(labels) != len(rows):
        raise ValueError(f"got {len(labels)} labels for {len(rows)} rows")
    data = {
        label: {
            "parameters + gradients + optimizer_state": r.floor_bytes,
            "activations": r.activations_bytes,
            "other": r.other_bytes,
        }
        for label, r in zip(labels, rows, strict=True)
    }
    fig, (ax,) = plots.figure(width=7.5, height=3.4)
    plots.stacked_bars(ax, data, budget=budget, budget_label=budget_label,
                       title=f"Measured peak per configuration ({rows[0].method})")
    plots.show(fig)
