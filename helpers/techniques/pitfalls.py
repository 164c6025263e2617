"""When gradient accumulation is not a bigger batch: the pitfalls, measured (lesson 04).

Built on `helpers.accumulation` (flat_grad, full_batch_grad, accumulated_grad,
compare_grads). Gradient errors here are L2 relative errors,
||g_acc - g_full|| / ||g_full|| (`GradDiff.l2_rel`), and the plots say so. Four
pitfalls, each with the measurement a notebook needs:

- BatchNorm: `norm_error_curve` (accumulated vs full-batch gradient error for
  each micro-batch size), `ghost_batch_grad`, `batchnorm_buffers`.
- Dropout: `dropout_grads` with `helpers.models.nets.DropoutMLP`, a model whose dropout
  masks can be passed in, so a full-batch mask can be sliced per micro-batch.
- Scheduler stepping: `lr_schedule` (a real `LambdaLR` of `helpers.core.training.warmup_cosine`
  stepped per update or per micro-step).
- Mixed precision (in `helpers.techniques.amp`; float16 autocast on CPU and CUDA):
  `amp_update` runs one accumulated update with a GradScaler in the correct order or in one
  of the wrong ones; `fp16_underflow` counts the gradient entries float16 flushes to zero.

Helpers that build a model or draw dropout masks seed their own copy of torch's
random state (`torch.random.fork_rng`), so the caller's random stream is left as it was.

The lesson's widgets, sizes, figures and exercise checkers are in `helpers.lessons.lesson04`.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from helpers.core.data import image_batch, regression_batch
from helpers.core.training import cleared_grads, warmup_cosine
from helpers.core.validate import choice, int_at_least, int_in_range, positive_int
from helpers.models.nets import NORMS, ConvNet, DropoutMLP
from helpers.techniques.accumulation import (
    LossFn,
    accumulated_grad,
    check_batch,
    check_micro_batch,
    compare_grads,
    flat_grad,
    full_batch_grad,
)

__all__ = [
    "BN_MODES", "SCHEDULE_MODES", "Schedule", "batchnorm_buffers", "default_micro_batches", "dropout_grads",
    "ghost_batch_grad", "lr_schedule", "norm_error_curve", "set_norm_mode",
]

BN_MODES = ("train", "eval", "frozen")
SCHEDULE_MODES = ("update", "micro")


@contextmanager
def _own_rng(device: torch.device | str) -> Iterator[None]:
    """Run the body on a copy of torch's random state (CPU, and `device` if CUDA), restored after."""
    device = torch.device(device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        yield


def _manual_seed(seed: int, device: torch.device | str) -> None:
    """Seed torch's CPU generator and `device`'s (what `torch.manual_seed` does, for one device).

    Call it inside `_own_rng(device)`; it gives the same numbers as `seed_everything(seed)`.
    """
    device = torch.device(device)
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        torch.cuda.default_generators[index].manual_seed(seed)


# -- BatchNorm -----------------------------------------------------------------------
def set_norm_mode(model: nn.Module, mode: str) -> nn.Module:
    """Put `model` in training mode with its BatchNorm layers in `mode`; returns `model`.

    - 'train': BatchNorm normalizes with the statistics of the batch it sees.
    - 'eval':  the whole model in eval mode; BatchNorm uses its running statistics.
    - 'frozen': the model trains, but every BatchNorm uses its running statistics,
      stops updating them, and its affine weight and bias stop learning.
    """
    choice("mode", mode, BN_MODES)
    model.train(mode != "eval")
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and mode == "frozen":
            module.eval()
            for p in module.parameters():
                p.requires_grad_(False)
    return model


def _conv_setup(
    norm: str, batch: int, *, width: int, depth: int, size: int, mode: str, seed: int,
    device: torch.device | str,
) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    choice("norm", norm, NORMS)
    positive_int("batch", batch)
    with _own_rng(device):
        _manual_seed(seed, device)
        model = ConvNet(in_channels=3, width=width, depth=depth, num_classes=10, norm=norm).to(device)
    x, y = image_batch(batch, channels=3, size=size, num_classes=10, seed=seed, device=device)
    if mode != "train":  # give the running statistics realistic values first
        with torch.no_grad():
            model.train()
            for _ in range(3):
                model(x)
    set_norm_mode(model, mode)
    return model, x, y


def default_micro_batches(batch: int) -> list[int]:
    """Powers of two that divide `batch`, from 1 up to and including `batch` itself.

    Args:
        batch: the full batch (>= 1).

    Returns:
        The micro-batch sizes, ascending.
    """
    positive_int("batch", batch)
    sizes = [2**i for i in range(batch.bit_length()) if batch % 2**i == 0]
    return sizes if sizes[-1] == batch else sizes + [batch]


def norm_error_curve(
    norm: str,
    *,
    batch: int = 32,
    micro_batches: Sequence[int] | None = None,
    mode: str = "train",
    width: int = 16,
    depth: int = 3,
    size: int = 16,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> dict[int, float]:
    """L2 relative error of the accumulated gradient against the full-batch gradient.

    The weights come from `seed` on a private copy of torch's random state, so calls
    repeat exactly and the caller's random stream is left alone.

    Args:
        norm: the `ConvNet`'s norm ("batch", "group", "layer" or "none").
        batch: examples in the `image_batch`.
        micro_batches: the sizes to try (default `default_micro_batches(batch)`).
        mode: the BatchNorm layers' mode (see `set_norm_mode`).
        width, depth, size: the ConvNet's width and depth and the images' side.
        seed: seeds the weights and data.
        device: where it runs.

    Returns:
        {micro_batch: ||g_accumulated - g_full|| / ||g_full||} (`GradDiff.l2_rel`).
    """
    positive_int("width", width)
    positive_int("depth", depth)
    positive_int("size", size)
    model, x, y = _conv_setup(norm, batch, width=width, depth=depth, size=size, mode=mode,
                              seed=seed, device=device)
    sizes = default_micro_batches(batch) if micro_batches is None else list(micro_batches)
    for m in sizes:
        int_in_range("micro_batches", m, 1, batch)
    reference = full_batch_grad(model, F.cross_entropy, x, y)
    return {m: compare_grads(reference, accumulated_grad(model, F.cross_entropy, x, y, m)).l2_rel
            for m in sizes}


def ghost_batch_grad(
    model: nn.Module, loss_fn: LossFn, inputs: torch.Tensor, targets: torch.Tensor, ghost: int
) -> torch.Tensor:
    """Gradient of ONE loss over the whole batch, where the model sees `ghost`-sized chunks.

    Each chunk goes through the model on its own, so every BatchNorm layer
    normalizes with the statistics of its chunk ("ghost batch norm"); the
    outputs are concatenated and one mean loss and one backward follow.

    Args:
        model: the model (gradients cleared before and after).
        loss_fn: `loss_fn(outputs, targets)` -> a mean loss.
        inputs, targets: the batch.
        ghost: examples per chunk (1 to the batch).

    Returns:
        The flat gradient.

    Raises:
        ValueError: if `ghost` is larger than the batch.
    """
    n = check_batch(inputs, targets)
    positive_int("ghost", ghost)
    if ghost > n:
        raise ValueError(f"ghost={ghost} is larger than the batch ({n} examples)")
    with cleared_grads(model):
        outputs = torch.cat([model(chunk) for chunk in inputs.split(ghost)])
        loss_fn(outputs, targets).backward()
        return flat_grad(model)


def batchnorm_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every BatchNorm layer's running_mean, running_var and num_batches_tracked, concatenated.

    Args:
        model: a model with BatchNorm layers.

    Returns:
        {buffer name: the layers' values as one float64 CPU vector}.

    Raises:
        ValueError: if `model` has no BatchNorm layer.
    """
    layers = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not layers:
        raise ValueError("model has no BatchNorm layers")
    return {
        name: torch.cat([getattr(m, name).detach().reshape(-1).double().cpu() for m in layers])
        for name in ("running_mean", "running_var", "num_batches_tracked")
    }


# -- Dropout -------------------------------------------------------------------------
def dropout_grads(
    micro_batch: int, *, shared_masks: bool, batch: int = 32, n_dropout: int = 2, seed: int = 0,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(full-batch gradient, accumulated gradient) of a `DropoutMLP` in training mode.

    Weights and masks come from `seed` on a private copy of torch's random state (the
    caller's random stream is left alone), so calls repeat exactly.

    Args:
        micro_batch: examples per micro-batch (1 to `batch`).
        shared_masks: False: both runs start from the same seed and let dropout draw its
            own masks. True: the full batch's masks are drawn once and each micro-batch
            uses its slice of them.
        batch: examples in all.
        n_dropout: dropout layers.
        seed: seeds the weights, data and masks.
        device: where it runs.

    Returns:
        The two flat gradients.
    """
    check_micro_batch(micro_batch, positive_int("batch", batch))
    int_at_least("seed", seed, 0)
    with _own_rng(device):
        _manual_seed(seed, device)
        model = DropoutMLP(16, 32, 1, n_dropout=n_dropout).to(device).train()
        x, y = regression_batch(batch, 16, 1, seed=seed, device=device)
        if not shared_masks:
            _manual_seed(seed + 1, device)
            full = full_batch_grad(model, F.mse_loss, x, y)
            _manual_seed(seed + 1, device)
            return full, accumulated_grad(model, F.mse_loss, x, y, micro_batch)
        masks = model.draw_masks(batch, device=device)
    with cleared_grads(model):
        F.mse_loss(model(x, masks), y).backward()
        full = flat_grad(model)
    with cleared_grads(model):
        for start in range(0, batch, micro_batch):
            part = slice(start, start + micro_batch)
            loss = F.mse_loss(model(x[part], [m[part] for m in masks]), y[part])
            (loss * x[part].shape[0] / batch).backward()
        return full, flat_grad(model)


# -- Scheduler stepping --------------------------------------------------------------
@dataclass(frozen=True)
class Schedule:
    """The LR each optimizer update used, against the examples seen when it ran.

    `warmup_end_examples` is the examples seen at the first update that used
    the peak LR; `warnings` holds any warning torch raised while stepping.
    """

    examples: list[int]
    lrs: list[float]
    warmup_end_examples: int
    warnings: list[str]

    def first_update_at_zero(self) -> int | None:
        """The first update (counted from 1) that ran with learning rate 0, or None."""
        return next((i + 1 for i, lr in enumerate(self.lrs) if lr == 0.0), None)


def lr_schedule(
    accum_steps: int, *, per: str = "update", micro_batch: int = 8, updates: int = 64,
    warmup: int = 16, base_lr: float = 1e-3,
) -> Schedule:
    """Step a real `LambdaLR(warmup_cosine(warmup, updates))` through `updates` updates.

    The optimizer holds one dummy parameter; warnings torch raises are recorded, not shown.

    Args:
        accum_steps: micro-steps per update.
        per: "update" steps the scheduler after each optimizer step (right); "micro"
            after every micro-step (wrong).
        micro_batch: examples per micro-step.
        updates: optimizer steps (>= 2).
        warmup: warmup updates (fewer than `updates`).
        base_lr: the peak learning rate.

    Returns:
        The `Schedule`: examples seen and the lr at each update, where warmup ended, the warnings.

    Raises:
        ValueError: if `warmup` is not smaller than `updates`.
    """
    positive_int("accum_steps", accum_steps)
    positive_int("micro_batch", micro_batch)
    int_at_least("updates", updates, 2)
    positive_int("warmup", warmup)
    choice("per", per, SCHEDULE_MODES)
    if warmup >= updates:
        raise ValueError(f"warmup={warmup} must be smaller than updates={updates}")
    dummy = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([dummy], lr=base_lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(warmup, updates))
    examples, lrs = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for u in range(updates):
            for k in range(accum_steps):
                # (forward and loss.backward() of micro-batch k would go here)
                if k == accum_steps - 1:
                    lrs.append(opt.param_groups[0]["lr"])
                    examples.append((u + 1) * accum_steps * micro_batch)
                    opt.step()
                    opt.zero_grad()
                    if per == "update":
                        sched.step()
                if per == "micro":
                    sched.step()
    peak = max(lrs)
    end = next(e for e, lr in zip(examples, lrs, strict=True) if lr >= peak * (1 - 1e-9))
    return Schedule(examples, lrs, end, [str(w.message) for w in caught])
