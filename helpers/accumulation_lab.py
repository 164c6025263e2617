"""Instruments and widgets for lesson 03 (gradient accumulation).

- `micro_step_memory(loop, model)`: live memory after each micro-step of a loop
  written in the notebook, measured with `helpers.memory.MemoryTracker`.
- `examples_per_second(...)`: throughput of one accumulated update.
- `gradient_error(...)` / `show_gradient_error(...)`: the gradient widget.
- `scatter_grads(...)`, `plot_micro_step_memory(...)`: the lesson's plots.

The gradient API itself (`flat_grad`, `full_batch_grad`, `accumulated_grad`,
`compare_grads`) is in `helpers.accumulation`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from helpers.accumulation import (
    GradDiff,
    LossFn,
    _check_batch,
    _check_micro_batch,
    _trainable,
    accumulated_grad,
    clear_grads,
    compare_grads,
    full_batch_grad,
)
from helpers.device import median_seconds
from helpers.memory import MemoryTracker

if TYPE_CHECKING:
    from matplotlib.axes import Axes

Mark = Callable[[str], int]


@dataclass
class MicroStepMemory:
    """Live memory of an accumulation loop, read after every micro-step.

    - `labels`, `live_after`: one entry per `mark(label)` call of the loop,
      preceded by ("start", live bytes before the loop).
    - `peak_bytes`: the largest live tensor memory at any op of the loop.
    - `peak_activations`: the largest amount of live forward-pass tensors.
    - `method`: how it was measured (a tensor-level tracker of live storages).
    """

    labels: list[str]
    live_after: list[int]
    peak_bytes: int
    peak_activations: int
    method: str

    def growth(self, first: int = 1, last: int = -1) -> int:
        """Live bytes at mark `last` minus live bytes at mark `first` (start is mark 0)."""
        return self.live_after[last] - self.live_after[first]


def micro_step_memory(loop: Callable[[Mark], object], model: nn.Module) -> MicroStepMemory:
    """Run `loop(mark)` once under a `MemoryTracker` and read live memory at each mark.

    `loop` is the accumulation loop under study; it calls `mark(label)` after
    each micro-step. Tensors made before the call (the batches) are not
    counted; the model's parameters and gradients are. Grads are cleared
    before and after, so runs do not see each other's gradients.
    """
    if not callable(loop):
        raise ValueError(f"loop must be a callable taking mark(label), got {type(loop).__name__}")
    _trainable(model)
    clear_grads(model)
    try:
        with MemoryTracker(model=model) as tracker:
            labels, live = ["start"], [tracker.mark("start")]

            def mark(label: str) -> int:
                labels.append(str(label))
                live.append(tracker.mark(str(label)))
                return live[-1]

            loop(mark)
        timeline = tracker.timeline()
    finally:
        clear_grads(model)
    device = next(model.parameters()).device
    method = "cpu-tracker" if device.type == "cpu" else "tensor-tracker (live storages)"
    return MicroStepMemory(
        labels=labels,
        live_after=live,
        peak_bytes=max(timeline.total),
        peak_activations=max(timeline.series["activations"]),
        method=method,
    )


def examples_per_second(
    model: nn.Module,
    loss_fn: LossFn,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    micro_batch: int,
    *,
    repeats: int = 3,
) -> float | None:
    """Examples per second of one accumulated update over all of `inputs`.

    Times forward + backward of every micro-batch (no optimizer step), as the
    median of `repeats` runs after one warm-up; on CUDA the device is
    synchronized before each clock read. Returns None when the micro-batch
    does not fit in GPU memory (CUDA out of memory).
    """
    n = _check_batch(inputs, targets)
    _check_micro_batch(micro_batch, n)
    device = next(model.parameters()).device
    try:
        seconds = median_seconds(
            lambda: accumulated_grad(model, loss_fn, inputs, targets, micro_batch),
            device=device, repeats=repeats, warmup=1,
        )
    except torch.cuda.OutOfMemoryError:
        clear_grads(model)
        torch.cuda.empty_cache()
        return None
    return n / seconds


# -- widgets -------------------------------------------------------------------------
def gradient_error(
    micro_batch: int,
    steps: int,
    scale: bool = True,
    *,
    seed: int = 0,
    sizes: tuple[int, int, int, int] = (16, 64, 2, 4),
    device: torch.device | str = "cpu",
) -> tuple[GradDiff, torch.Tensor, torch.Tensor]:
    """Widget function: accumulated vs full-batch gradient of a small ResidualMLP.

    Builds a fresh `ResidualMLP(*sizes)` (d_in, width, depth, d_out) and a
    regression batch of `micro_batch * steps` examples, both from `seed`
    without touching the global RNG. Returns `(diff, reference, candidate)`:
    the comparison, the full-batch gradient and the accumulated one.
    """
    from helpers.data import regression_batch
    from helpers.models import ResidualMLP

    for name, value in (("micro_batch", micro_batch), ("steps", steps)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    d_in, width, depth, d_out = sizes
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = ResidualMLP(d_in, width, depth, d_out).to(device)
    x, y = regression_batch(micro_batch * steps, d_in, d_out, seed=seed + 1, device=device)
    mse = torch.nn.functional.mse_loss
    reference = full_batch_grad(model, mse, x, y)
    candidate = accumulated_grad(model, mse, x, y, micro_batch, scale=scale)
    return compare_grads(reference, candidate), reference, candidate


def scatter_grads(ax: Axes, reference: torch.Tensor, candidate: torch.Tensor, *, steps: int,
                  title: str = "", max_points: int = 4000) -> None:
    """Scatter candidate against reference gradient entries, with the lines y = x and y = Kx.

    Plots at most `max_points` entries, picked with a fixed seed, so that big
    models still draw in a fraction of a second.
    """
    n = reference.numel()
    pick = torch.randperm(n, generator=torch.Generator().manual_seed(0))[:max_points]
    ref, cand = reference.detach().cpu()[pick], candidate.detach().cpu()[pick]
    ax.scatter(ref, cand, s=4, alpha=0.5)
    lim = float(reference.abs().max()) * 1.05
    ax.plot([-lim, lim], [-lim, lim], color="k", lw=0.8, label="equal (y = x)")
    ax.plot([-lim, lim], [-lim * steps, lim * steps], color="crimson", lw=0.8, ls="--",
            label=f"K times (y = {steps}x)")
    ax.set_xlim(-lim, lim)
    ax.set_ylim(-lim * steps * 1.05, lim * steps * 1.05)
    ax.set_xlabel("full-batch gradient entry")
    ax.set_ylabel("accumulated gradient entry")
    ax.set_title(title)
    ax.legend(fontsize=8)


def show_gradient_error(micro_batch: int = 8, steps: int = 4, scale: bool = True) -> None:
    """Widget: plot accumulated against full-batch gradient entries and print the errors.

    A thin wrapper around `gradient_error` (which tests call directly).
    """
    from helpers.plots import figure, show

    diff, ref, cand = gradient_error(micro_batch, steps, scale)
    fig, (ax,) = figure(width=5.5, height=4.0)
    scatter_grads(ax, ref, cand, steps=steps,
                  title=f"micro-batch {micro_batch}, K = {steps}, "
                        f"{'loss / K' if scale else 'no division by K'}")
    show(fig)
    print(f"max_rel {diff.max_rel:.2e} | norm_ratio {diff.norm_ratio:.5f} | cosine {diff.cosine:.6f}")


def plot_micro_step_memory(ax: Axes, results: dict[str, MicroStepMemory], *,
                           unit_bytes: int, title: str = "") -> None:
    """Lines of live memory after each micro-step, in multiples of `unit_bytes`.

    Each line starts at 0 (live memory before the loop); overlapping lines get
    different dash styles and markers so that both stay visible.
    """
    from matplotlib.ticker import MaxNLocator

    if unit_bytes <= 0:
        raise ValueError(f"unit_bytes must be positive, got {unit_bytes}")
    styles = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ("-", "x"), ("--", "v")]
    for i, (name, res) in enumerate(results.items()):
        base = res.live_after[0]
        line, marker = styles[i % len(styles)]
        ax.plot(range(len(res.live_after)), [(v - base) / unit_bytes for v in res.live_after],
                ls=line, marker=marker, ms=5, label=name, alpha=0.85)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("mark (0 = before the loop, k = after micro-step k)")
    ax.set_ylabel("live memory above start\n(x one micro-batch's activations)")
    ax.set_title(title)
    ax.legend(fontsize=8)
