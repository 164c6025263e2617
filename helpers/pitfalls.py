"""When gradient accumulation is not a bigger batch: instruments for lesson 04.

Built on `helpers.accumulation` (flat_grad, full_batch_grad, accumulated_grad,
compare_grads). Four pitfalls, each with the measurement a notebook needs:

- BatchNorm: `norm_error_curve` (accumulated vs full-batch gradient error for
  each micro-batch size), `ghost_batch_grad`, `batchnorm_buffers`.
- Dropout: `DropoutMLP`, a model whose dropout masks can be passed in, so a
  full-batch mask can be sliced per micro-batch (`dropout_grads`).
- Scheduler stepping: `warmup_cosine` and `lr_schedule` (a real `LambdaLR`
  stepped per update or per micro-step).
- Mixed precision: `amp_update` runs one accumulated update with a GradScaler
  in the correct order or in one of the wrong ones, and reports the gradient
  the optimizer actually applied.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from matplotlib.axes import Axes
from torch import nn

from helpers.accumulation import (
    LossFn,
    accumulated_grad,
    clear_grads,
    flat_grad,
    full_batch_grad,
)
from helpers.data import image_batch, regression_batch
from helpers.device import seed_everything
from helpers.models import NORMS, ConvNet

BN_MODES = ("train", "eval", "frozen")
SCHEDULE_MODES = ("update", "micro")
AMP_ORDERS = ("correct", "unscale_each", "update_each", "unscale_update_each",
              "clip_before_unscale")


def _check_int(name: str, value: object, low: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return value


def _check_choice(name: str, value: object, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not allowed; choose one of {tuple(choices)}")
    return str(value)


def relative_error(reference: torch.Tensor, candidate: torch.Tensor) -> float:
    """||candidate - reference|| / ||reference||, computed in float64 (0.0 = identical)."""
    if reference.shape != candidate.shape:
        raise ValueError(
            f"reference and candidate must have the same shape, got {tuple(reference.shape)} "
            f"and {tuple(candidate.shape)}"
        )
    ref = reference.detach().double().cpu()
    norm = ref.norm().item()
    if norm == 0.0:
        raise ValueError("reference is all zeros; a relative error needs a non-zero reference")
    return (candidate.detach().double().cpu() - ref).norm().item() / norm


# -- BatchNorm -----------------------------------------------------------------------
def set_norm_mode(model: nn.Module, mode: str) -> nn.Module:
    """Put `model` in training mode with its BatchNorm layers in `mode`; returns `model`.

    - 'train': BatchNorm normalizes with the statistics of the batch it sees.
    - 'eval':  the whole model in eval mode; BatchNorm uses its running statistics.
    - 'frozen': the model trains, but every BatchNorm uses its running statistics,
      stops updating them, and its affine weight and bias stop learning.
    """
    _check_choice("mode", mode, BN_MODES)
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
    _check_choice("norm", norm, NORMS)
    _check_int("batch", batch)
    seed_everything(seed)
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
    """Powers of two that divide `batch`, from 1 up to and including `batch` itself."""
    _check_int("batch", batch)
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
    """Relative error of the accumulated gradient against the full-batch gradient.

    Builds a `ConvNet(norm=norm)` and an `image_batch(batch)`, puts the
    BatchNorm layers in `mode` (see `set_norm_mode`), and returns
    {micro_batch: ||g_accumulated - g_full|| / ||g_full||}. `micro_batches`
    defaults to `default_micro_batches(batch)`. Re-seeds, so calls repeat exactly.
    """
    _check_int("width", width)
    _check_int("depth", depth)
    _check_int("size", size)
    model, x, y = _conv_setup(norm, batch, width=width, depth=depth, size=size, mode=mode,
                              seed=seed, device=device)
    sizes = default_micro_batches(batch) if micro_batches is None else list(micro_batches)
    for m in sizes:
        if not isinstance(m, int) or isinstance(m, bool) or not 1 <= m <= batch:
            raise ValueError(f"micro_batches must hold ints in [1, {batch}], got {m!r}")
    reference = full_batch_grad(model, F.cross_entropy, x, y)
    return {m: relative_error(reference, accumulated_grad(model, F.cross_entropy, x, y, m))
            for m in sizes}


def ghost_batch_grad(
    model: nn.Module, loss_fn: LossFn, inputs: torch.Tensor, targets: torch.Tensor, ghost: int
) -> torch.Tensor:
    """Gradient of ONE loss over the whole batch, where the model sees `ghost`-sized chunks.

    Each chunk goes through the model on its own, so every BatchNorm layer
    normalizes with the statistics of its chunk ("ghost batch norm"); the
    outputs are concatenated and one mean loss and one backward follow.
    """
    _check_int("ghost", ghost)
    if ghost > inputs.shape[0]:
        raise ValueError(f"ghost={ghost} is larger than the batch ({inputs.shape[0]} examples)")
    clear_grads(model)
    try:
        outputs = torch.cat([model(chunk) for chunk in inputs.split(ghost)])
        loss_fn(outputs, targets).backward()
        return flat_grad(model)
    finally:
        clear_grads(model)


def batchnorm_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every BatchNorm layer's running_mean, running_var and num_batches_tracked, concatenated."""
    layers = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not layers:
        raise ValueError("model has no BatchNorm layers")
    return {
        name: torch.cat([getattr(m, name).detach().reshape(-1).double().cpu() for m in layers])
        for name in ("running_mean", "running_var", "num_batches_tracked")
    }


def plot_error_curves(ax: Axes, curves: dict[str, dict[int, float]], *, batch: int) -> None:
    """Log-log plot of {label: {micro_batch: relative error}}; zeros are drawn at 1e-9."""
    styles = [("o", "-"), ("s", "-"), ("^", "--"), ("D", "-."), ("v", ":")]
    for (label, curve), (marker, ls) in zip(curves.items(), styles * 2, strict=False):
        ax.plot(list(curve), [max(v, 1e-9) for v in curve.values()], marker=marker, ls=ls,
                label=label, alpha=0.85)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.axvline(batch, color="#999", ls=":", lw=1)
    ax.text(0.99, 0.02, "points at 1e-9 are exactly 0", transform=ax.transAxes, ha="right",
            fontsize=8, color="#666")
    ax.set_xlabel("micro-batch size (examples)")
    ax.set_ylabel("relative gradient error")
    ax.set_title(f"accumulated vs full-batch gradient (batch {batch})")
    ax.legend(fontsize=8)


# -- Dropout -------------------------------------------------------------------------
class DropoutMLP(nn.Module):
    """`n_dropout` blocks of Linear -> ReLU -> dropout, then a Linear head.

    `forward(x, masks)` uses the given keep-masks (one bool tensor of shape
    (len(x), width) per dropout layer) instead of drawing new ones, so the
    full batch's masks can be sliced per micro-batch.
    """

    def __init__(self, d_in: int, width: int, d_out: int, *, p: float = 0.5,
                 n_dropout: int = 2) -> None:
        super().__init__()
        for name, value in (("d_in", d_in), ("width", width), ("d_out", d_out),
                            ("n_dropout", n_dropout)):
            _check_int(name, value)
        if not 0.0 < p < 1.0:
            raise ValueError(f"p must be in (0, 1), got {p!r}")
        self.p, self.width = p, width
        self.hidden = nn.ModuleList(
            nn.Linear(d_in if i == 0 else width, width) for i in range(n_dropout)
        )
        self.head = nn.Linear(width, d_out)

    def draw_masks(self, n: int, *, device: torch.device | str = "cpu") -> list[torch.Tensor]:
        """Fresh keep-masks for `n` examples (from the global RNG), one per dropout layer."""
        _check_int("n", n)
        return [torch.rand(n, self.width, device=device) >= self.p for _ in self.hidden]

    def forward(self, x: torch.Tensor, masks: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
        if masks is not None and len(masks) != len(self.hidden):
            raise ValueError(f"need {len(self.hidden)} masks (one per dropout layer), "
                             f"got {len(masks)}")
        for i, layer in enumerate(self.hidden):
            x = F.relu(layer(x))
            x = (x * masks[i] / (1.0 - self.p) if masks is not None
                 else F.dropout(x, self.p, self.training))
        return self.head(x)


def dropout_grads(
    micro_batch: int, *, shared_masks: bool, batch: int = 32, n_dropout: int = 2, seed: int = 0,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(full-batch gradient, accumulated gradient) of a `DropoutMLP` in training mode.

    `shared_masks=False`: both runs start from the same seed and let dropout
    draw its own masks. `shared_masks=True`: the full batch's masks are drawn
    once and each micro-batch uses its slice of them.
    """
    _check_int("batch", batch)
    _check_int("micro_batch", micro_batch)
    if micro_batch > batch:
        raise ValueError(f"micro_batch={micro_batch} is larger than the batch ({batch})")
    seed_everything(seed)
    model = DropoutMLP(16, 32, 1, n_dropout=n_dropout).to(device).train()
    x, y = regression_batch(batch, 16, 1, seed=seed, device=device)
    if not shared_masks:
        seed_everything(seed + 1)
        full = full_batch_grad(model, F.mse_loss, x, y)
        seed_everything(seed + 1)
        return full, accumulated_grad(model, F.mse_loss, x, y, micro_batch)
    masks = model.draw_masks(batch, device=device)
    model.zero_grad(set_to_none=True)
    F.mse_loss(model(x, masks), y).backward()
    full = flat_grad(model)
    model.zero_grad(set_to_none=True)
    for start in range(0, batch, micro_batch):
        part = slice(start, start + micro_batch)
        loss = F.mse_loss(model(x[part], [m[part] for m in masks]), y[part])
        (loss * x[part].shape[0] / batch).backward()
    acc = flat_grad(model)
    model.zero_grad(set_to_none=True)
    return full, acc


# -- Scheduler stepping --------------------------------------------------------------
def warmup_cosine(warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """LR multiplier: linear warmup to 1.0 over `warmup_steps`, cosine to 0 at `total_steps`.

    Step s of warmup gives (s + 1) / warmup_steps (so the peak is at step
    warmup_steps - 1); after `total_steps` the multiplier stays at 0.
    """
    _check_int("warmup_steps", warmup_steps)
    _check_int("total_steps", total_steps)
    if total_steps <= warmup_steps:
        raise ValueError(f"total_steps={total_steps} must exceed warmup_steps={warmup_steps}")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps + 1) / (total_steps - warmup_steps))
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


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


def lr_schedule(
    accum_steps: int, *, per: str = "update", micro_batch: int = 8, updates: int = 64,
    warmup: int = 16, base_lr: float = 1e-3,
) -> Schedule:
    """Step a real `LambdaLR(warmup_cosine(warmup, updates))` through `updates` updates.

    Each update is `accum_steps` micro-steps of `micro_batch` examples.
    `per='update'` steps the scheduler after each optimizer step (right);
    `per='micro'` steps it after every micro-step (wrong). The optimizer holds
    one dummy parameter; warnings torch raises are recorded, not shown.
    """
    _check_int("accum_steps", accum_steps)
    _check_int("micro_batch", micro_batch)
    _check_int("updates", updates, low=2)
    _check_int("warmup", warmup)
    _check_choice("per", per, SCHEDULE_MODES)
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


def plot_lr_schedules(ax: Axes, schedules: dict[str, Schedule], *, title: str = "") -> None:
    """LR against examples seen, one line per schedule, with the warmup end marked."""
    for (label, s), color in zip(schedules.items(), ("#4C72B0", "#DD8452", "#55A868"),
                                 strict=False):
        ax.plot(s.examples, s.lrs, label=label, color=color)
        ax.axvline(s.warmup_end_examples, color=color, ls=":", lw=1)
    ax.set_xlabel("examples seen")
    ax.set_ylabel("learning rate")
    ax.set_title(title)
    ax.legend(fontsize=8)


# -- Mixed precision -----------------------------------------------------------------
def amp_dtype(device: torch.device | str) -> torch.dtype:
    """float16 on CUDA (needs a GradScaler), bfloat16 on CPU."""
    return torch.float16 if torch.device(device).type == "cuda" else torch.bfloat16


@dataclass(frozen=True)
class AmpOutcome:
    """One accumulated update: the gradient the optimizer applied, or what went wrong.

    `applied` is the flat gradient at the moment `optimizer.step()` ran (None
    if it never ran); `error` is the text of an exception torch raised (None
    if none); `skipped` is True when GradScaler skipped the step.
    """

    applied: torch.Tensor | None
    error: str | None
    skipped: bool


def amp_update(
    model: nn.Module, loss_fn: LossFn, inputs: torch.Tensor, targets: torch.Tensor,
    micro_batch: int, *, order: str = "correct", amp: bool = True, max_norm: float = 1.0,
    init_scale: float = 2.0**10,
) -> AmpOutcome:
    """Run one accumulated update of a deep copy of `model` (SGD, lr 0.1) with a GradScaler.

    `order` (see `AMP_ORDERS`):
    - 'correct': scale(loss / K).backward() per micro-step; then unscale_ ->
      clip -> step -> update once.
    - 'unscale_each': unscale_ after every micro-step (torch raises).
    - 'update_each': scaler.update() after every micro-step (torch raises).
    - 'unscale_update_each': unscale_ and update after every micro-step.
    - 'clip_before_unscale': clip the still-scaled gradients, then unscale_.
    `amp=False` runs the same loop in float32 with a disabled scaler (the reference).
    The scaler starts at `init_scale` (torch's default, 2**16, can overflow
    float16 on the very first step, which GradScaler then skips).
    """
    _check_choice("order", order, AMP_ORDERS)
    n = inputs.shape[0]
    _check_int("micro_batch", micro_batch)
    if micro_batch > n:
        raise ValueError(f"micro_batch={micro_batch} is larger than the batch ({n} examples)")
    if not max_norm > 0:
        raise ValueError(f"max_norm must be > 0, got {max_norm!r}")
    model = copy.deepcopy(model).train()
    device = inputs.device
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if not init_scale > 0:
        raise ValueError(f"init_scale must be > 0, got {init_scale!r}")
    scaler = torch.amp.GradScaler(device.type, init_scale=init_scale, enabled=amp)
    seen: list[torch.Tensor] = []
    opt.register_step_pre_hook(lambda *_: seen.append(flat_grad(model)))
    clip = lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)  # noqa: E731
    try:
        for x, y in zip(inputs.split(micro_batch), targets.split(micro_batch), strict=True):
            with torch.autocast(device.type, dtype=amp_dtype(device), enabled=amp):
                loss = loss_fn(model(x), y)
            scaler.scale(loss * x.shape[0] / n).backward()
            if order in ("unscale_each", "unscale_update_each"):
                scaler.unscale_(opt)
            if order in ("update_each", "unscale_update_each"):
                scaler.update()
        if order == "clip_before_unscale":
            clip()
            scaler.unscale_(opt)
        elif order != "unscale_update_each":
            scaler.unscale_(opt)
            clip()
        else:
            clip()
        scaler.step(opt)
        scaler.update()
    except (RuntimeError, AssertionError) as exc:
        return AmpOutcome(None, f"{type(exc).__name__}: {exc}", skipped=False)
    return AmpOutcome(seen[0] if seen else None, None, skipped=not seen)
