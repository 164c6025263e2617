"""Lesson 01's instruments: the explainer's memory budget, and the same table measured.

- `explainer_table()` is a calculator: from the explainer's inputs (model state,
  overhead, activations per micro-batch) it rebuilds the three rows of its 24 GB table.
- `explainer_model()` builds the GPT-style model used for measurements at a scale.
- `train_step()` builds one plain training step (forward, backward, optimizer step).
- `measure_config()` runs one whole accumulation update (K micro-steps, then
  the optimizer step) under `helpers.memory.measure_step`: a measured row of the table.
- `activation_sweep()` measures the breakdown at several micro-batch sizes, and
  `linear_fit()` checks that activations grow linearly with the micro-batch.
- `breakdown_for()` is the pure function behind the lesson's widget.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from helpers.data import token_batch
from helpers.device import SCALES, seed_everything
from helpers.memory import StepMemory, measure_step
from helpers.models import GPT, GPTConfig

GB = 1e9  # the explainer speaks in decimal gigabytes
OPTIMIZERS = ("sgd", "adam")
BlockWrapper = Callable[[nn.Module, torch.Tensor], torch.Tensor]

# The explainer's profile of a 24 GB GPU (decimal GB).
EXPLAINER_INPUTS = {
    "capacity_gb": 24.0,
    "model_state_gb": 14.5,  # weights + gradients + optimizer state
    "overhead_gb": 2.0,  # CUDA workspaces, framework
    "activations_gb": {8: 7.0, 4: 3.8},  # saved activations per micro-batch size
    "checkpointed_activations_gb": {4: 2.0},
}


@dataclass(frozen=True)
class BudgetRow:
    """One configuration of the budget: what is held at once, and whether it fits."""

    label: str
    micro_batch: int
    steps: int
    activations_gb: float
    peak_gb: float
    capacity_gb: float

    @property
    def effective_batch(self) -> int:
        """Examples per optimizer update: micro-batch x accumulation steps."""
        return self.micro_batch * self.steps

    @property
    def headroom_gb(self) -> float:
        """Capacity left at the peak (negative means out of memory)."""
        return self.capacity_gb - self.peak_gb


def budget_row(
    micro_batch: int, steps: int, activations_gb: float, *, label: str = "",
    model_state_gb: float = EXPLAINER_INPUTS["model_state_gb"],
    overhead_gb: float = EXPLAINER_INPUTS["overhead_gb"],
    capacity_gb: float = EXPLAINER_INPUTS["capacity_gb"],
) -> BudgetRow:
    """Peak = model state + overhead + the activations of ONE micro-batch.

    Accumulation steps do not appear in the peak: each micro-batch's
    activations are freed by its backward before the next one starts.
    """
    for name, value in {"micro_batch": micro_batch, "steps": steps}.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if min(activations_gb, model_state_gb, overhead_gb) < 0 or capacity_gb <= 0:
        raise ValueError("memory figures must be >= 0 and capacity_gb > 0")
    peak = model_state_gb + overhead_gb + activations_gb
    label = label or f"{micro_batch} x {steps}"
    return BudgetRow(label, micro_batch, steps, activations_gb, round(peak, 6), capacity_gb)


def explainer_table() -> list[BudgetRow]:
    """The explainer's three rows, rebuilt from `EXPLAINER_INPUTS`."""
    acts = EXPLAINER_INPUTS["activations_gb"]
    ckpt = EXPLAINER_INPUTS["checkpointed_activations_gb"]
    return [
        budget_row(8, 4, acts[8], label="8 x 4"),
        budget_row(4, 8, acts[4], label="4 x 8"),
        budget_row(4, 8, ckpt[4], label="4 x 8, checkpointed"),
    ]


def scaled_budget(model_state_bytes: int, capacity_gb: float = 24.0) -> float:
    """A budget in bytes that stands in for a GPU on this device.

    It keeps the explainer's ratio of capacity to model state (24 / 14.5), so
    the measured model state fills the same share of it. It is a budget, not
    a measured capacity.
    """
    return model_state_bytes * capacity_gb / EXPLAINER_INPUTS["model_state_gb"]


def lesson_config(scale: str) -> GPTConfig:
    """GPT sizes for lesson measurements at `scale` ('tiny', 'small' or 'full')."""
    if scale not in SCALES:
        raise ValueError(f"scale={scale!r} is not a scale; choose one of {SCALES}")
    sizes = {
        "tiny": dict(vocab_size=64, seq_len=32, d_model=32, n_heads=2, n_layers=2),
        "small": dict(vocab_size=256, seq_len=64, d_model=64, n_heads=4, n_layers=4),
        "full": dict(vocab_size=8192, seq_len=1024, d_model=1024, n_heads=16, n_layers=12),
    }[scale]
    return GPTConfig(dropout=0.0, **sizes)


def explainer_model(scale: str, device: torch.device, seed: int = 0) -> GPT:
    """A freshly initialised GPT for `scale`, on `device`, in train mode."""
    seed_everything(seed)
    return GPT(lesson_config(scale)).to(device).train()


def make_optimizer(name: str, model: nn.Module) -> torch.optim.Optimizer:
    """'sgd' (plain, no momentum: no state) or 'adam' (two state tensors per parameter)."""
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=1e-3)
    if name == "adam":
        return torch.optim.Adam(model.parameters(), lr=1e-3)
    raise ValueError(f"optimizer={name!r} is not supported; choose one of {OPTIMIZERS}")


def lm_loss(model: GPT, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of `model` on a batch."""
    logits = model(idx)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def train_step(
    model: GPT, optimizer: torch.optim.Optimizer, batch: tuple[torch.Tensor, torch.Tensor]
) -> Callable[[], None]:
    """A zero-argument plain training step on `batch`: zero_grad, forward, backward, step."""
    idx, targets = batch

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        lm_loss(model, idx, targets).backward()
        optimizer.step()

    return step


def _batch(model: GPT, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    cfg = model.cfg
    device = next(model.parameters()).device
    return token_batch(n, cfg.seq_len, cfg.vocab_size, seed=seed, device=device)


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
    block_wrapper: BlockWrapper | None = None, seed: int = 0,
) -> StepMemory:
    """Measure one accumulation update of `steps` micro-batches of `micro_batch` examples.

    A first, unmeasured update creates the optimizer state, as in steady
    training. The measured update then runs `steps` forward/backward passes on
    `loss / steps`, followed by one optimizer step, so from the second
    micro-step on the gradients are alive next to the activations.
    `block_wrapper` (for example a checkpoint call) is set on the model for the
    duration.
    """
    budget_row(micro_batch, steps, 0.0)  # validates micro_batch and steps
    opt = make_optimizer(optimizer, model)
    batches = [_batch(model, micro_batch, seed + i) for i in range(steps)]
    previous, model.block_wrapper = model.block_wrapper, block_wrapper

    def update() -> None:
        opt.zero_grad(set_to_none=True)
        for idx, targets in batches:
            (lm_loss(model, idx, targets) / steps).backward()
        opt.step()

    try:
        update()  # warm-up: optimizer state now exists
        return measure_step(update, model=model, optimizer=opt)
    finally:
        model.block_wrapper = previous
        opt.zero_grad(set_to_none=True)


def measure_config(
    model: GPT, *, micro_batch: int, steps: int, optimizer: str = "adam",
    block_wrapper: BlockWrapper | None = None, seed: int = 0,
) -> ConfigMemory:
    """`measure_update` summarised as a row of the explainer's table."""
    mem = measure_update(model, micro_batch=micro_batch, steps=steps, optimizer=optimizer,
                         block_wrapper=block_wrapper, seed=seed)
    b = mem.breakdown
    return ConfigMemory(micro_batch, steps, mem.peak_bytes, b["activations"], mem.floor_bytes,
                        b["other"], mem.method)


def breakdown_for(model: GPT, micro_batch: int, optimizer: str = "adam") -> StepMemory | None:
    """Peak breakdown of a two-micro-step update at `micro_batch`, or None on CUDA OOM.

    This is the pure function behind lesson 01's widget and sweep.
    """
    try:
        return measure_update(model, micro_batch=micro_batch, steps=2, optimizer=optimizer)
    except torch.cuda.OutOfMemoryError:
        gc.collect()
        torch.cuda.empty_cache()
        return None


def show_breakdown(model: GPT, micro_batch: int, optimizer: str, budget: float) -> None:
    """Measure `breakdown_for` and draw it as a stacked bar against `budget` bytes."""
    from helpers import plots

    mem = breakdown_for(model, micro_batch, optimizer)
    if mem is None:
        print(f"micro-batch {micro_batch}: OOM on this device")
        return
    fig, (ax,) = plots.figure(width=5.5, height=3.4)
    plots.stacked_bars(ax, {f"micro-batch {micro_batch}": mem.breakdown}, budget=budget,
                       budget_label="scaled 24 GB budget",
                       title=f"{optimizer}: peak {plots.format_bytes(mem.peak_bytes)} ({mem.method})")
    plots.show(fig)


def activation_sweep(
    model: GPT, micro_batches: Sequence[int], optimizer: str = "adam", progress: bool = True
) -> dict[int, StepMemory | None]:
    """`breakdown_for` at each micro-batch size, with a progress bar (None marks an OOM)."""
    if len(micro_batches) < 2:
        raise ValueError(f"need at least two micro-batch sizes, got {list(micro_batches)}")
    from tqdm.auto import tqdm

    sizes = tqdm(micro_batches, desc="micro-batch sweep", disable=not progress)
    return {b: breakdown_for(model, b, optimizer) for b in sizes}


@dataclass(frozen=True)
class LinearFit:
    """y = slope * x + intercept, with its coefficient of determination."""

    slope: float
    intercept: float
    r2: float


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> LinearFit:
    """Least-squares line through (xs, ys) and its R^2."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError(f"need two equal-length sequences of >= 2 points, got {len(xs)}, {len(ys)}")
    x = torch.tensor(xs, dtype=torch.float64)
    y = torch.tensor(ys, dtype=torch.float64)
    xm, ym = x.mean(), y.mean()
    sxx = ((x - xm) ** 2).sum()
    if sxx == 0:
        raise ValueError("xs are all equal; a line needs at least two distinct x values")
    slope = ((x - xm) * (y - ym)).sum() / sxx
    intercept = ym - slope * xm
    ss_res = ((y - (slope * x + intercept)) ** 2).sum()
    ss_tot = ((y - ym) ** 2).sum()
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return LinearFit(float(slope), float(intercept), float(r2))


def plot_measured_table(rows: Sequence[ConfigMemory], labels: Sequence[str] | None = None,
                        budget: float | None = None) -> None:
    """Stacked bars (floor, activations, other) of measured rows, with an optional budget line."""
    from helpers import plots

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
    plots.stacked_bars(ax, data, budget=budget, budget_label="scaled 24 GB budget",
                       title=f"Measured peak per configuration ({rows[0].method})")
    plots.show(fig)
