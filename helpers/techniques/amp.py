"""Mixed precision with accumulation, measured (lesson 04's fourth pitfall).

float16 autocast on CPU and CUDA: `amp_update` runs one accumulated update with a GradScaler
in the correct order or in one of the wrong ones (`AMP_ORDERS`), and reports the gradient the
optimizer actually applied and the norm clipping saw; `fp16_underflow` counts the gradient
entries float16 flushes to zero without a scaler.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import nn

from helpers.core.validate import choice, number_in_range, positive_number
from helpers.techniques.accumulation import LossFn, check_batch, check_micro_batch, compare_grads, flat_grad

__all__ = ["AMP_ORDERS", "AmpOutcome", "Underflow", "amp_dtype", "amp_update", "fp16_underflow"]

# Each order of the GradScaler calls in `amp_update`: (what runs after every micro-step's
# backward, what runs before `scaler.step`). "unscale" is `scaler.unscale_(optimizer)`,
# "update" is `scaler.update()`, "clip" is `clip_grad_norm_`. Only "correct" is right.
_AMP_STEPS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "correct": ((), ("unscale", "clip")),
    "unscale_each": (("unscale",), ("unscale", "clip")),
    "update_each": (("update",), ("unscale", "clip")),
    "unscale_update_each": (("unscale", "update"), ("clip",)),
    "clip_before_unscale": ((), ("clip", "unscale")),
}
AMP_ORDERS = tuple(_AMP_STEPS)


# -- Mixed precision -----------------------------------------------------------------
def amp_dtype(device: torch.device | str) -> torch.dtype:
    """float16 on every device: the half type whose narrow range needs a GradScaler.

    CPU autocast supports float16 (checked on torch 2.13); on CUDA it is the usual case.

    Args:
        device: validated only.

    Returns:
        `torch.float16`.
    """
    torch.device(device)
    return torch.float16


@dataclass(frozen=True)
class AmpOutcome:
    """One accumulated update: the gradient the optimizer applied, or what went wrong.

    `applied` is the flat gradient at the moment `optimizer.step()` ran (None
    if it never ran); `error` is the text of an exception torch raised (None
    if none); `skipped` is True when GradScaler skipped the step;
    `clip_norm` is the total norm `clip_grad_norm_` measured (what clipping
    saw, before it rescaled; None if it never ran); `scale` is the scaler's
    scale during the update (1.0 when the scaler is off).
    """

    applied: torch.Tensor | None
    error: str | None
    skipped: bool
    clip_norm: float | None = None
    scale: float = 1.0


def amp_update(
    model: nn.Module, loss_fn: LossFn, inputs: torch.Tensor, targets: torch.Tensor,
    micro_batch: int, *, order: str = "correct", amp: bool = True, max_norm: float = 1.0,
    init_scale: float = 2.0**10, use_scaler: bool = True, loss_weight: float = 1.0,
) -> AmpOutcome:
    """Run one accumulated update of a deep copy of `model` (SGD, lr 0.1) with a GradScaler.

    Args:
        model: the model (copied; the original is not changed).
        loss_fn: `loss_fn(outputs, targets)` -> a mean loss.
        inputs, targets: the batch.
        micro_batch: examples per micro-batch.
        order: one of `AMP_ORDERS` (`_AMP_STEPS` lists each order's calls):
            "correct": scale(loss / K).backward() per micro-step; then unscale_ -> clip ->
            step -> update once. "unscale_each" / "update_each": unscale_ / update after
            every micro-step (torch raises). "unscale_update_each": both after every
            micro-step. "clip_before_unscale": clip the still-scaled gradients, then unscale_.
        amp: False runs the same loop in float32 with a disabled scaler (the reference).
        max_norm: the clipping norm; `math.inf` measures the norm without clipping.
        init_scale: the scaler's first scale (torch's default, 2**16, can overflow float16
            on the very first step, which GradScaler then skips).
        use_scaler: False keeps float16 autocast but disables the scaler (no loss scaling).
        loss_weight: multiplies each micro-batch's loss (to reach the small losses where
            float16 underflows).

    Returns:
        The `AmpOutcome`: the gradient the step applied (None if skipped or raised), the
        error torch raised, whether the step was skipped, the clip norm and the scale.
    """
    choice("order", order, AMP_ORDERS)
    n = check_batch(inputs, targets)
    check_micro_batch(micro_batch, n)
    number_in_range("max_norm", max_norm, 0.0, math.inf, low_open=True)
    positive_number("init_scale", init_scale)
    positive_number("loss_weight", loss_weight)
    model = copy.deepcopy(model).train()
    device = inputs.device
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(device.type, init_scale=init_scale, enabled=amp and use_scaler)
    scale = float(scaler.get_scale()) if scaler.is_enabled() else 1.0
    seen: list[torch.Tensor] = []
    norms: list[float] = []
    opt.register_step_pre_hook(lambda *_: seen.append(flat_grad(model)))

    def clip() -> None:
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)))

    actions = {"unscale": lambda: scaler.unscale_(opt), "update": scaler.update, "clip": clip}
    after_each, before_step = _AMP_STEPS[order]
    try:
        for x, y in zip(inputs.split(micro_batch), targets.split(micro_batch), strict=True):
            with torch.autocast(device.type, dtype=amp_dtype(device), enabled=amp):
                loss = loss_fn(model(x), y) * loss_weight
            scaler.scale(loss * x.shape[0] / n).backward()
            for name in after_each:
                actions[name]()
        for name in before_step:
            actions[name]()
        scaler.step(opt)
        scaler.update()
    except (RuntimeError, AssertionError) as exc:
        return AmpOutcome(None, f"{type(exc).__name__}: {exc}", skipped=False,
                          clip_norm=norms[0] if norms else None, scale=scale)
    return AmpOutcome(seen[0] if seen else None, None, skipped=not seen,
                      clip_norm=norms[0] if norms else None, scale=scale)


@dataclass(frozen=True)
class Underflow:
    """Gradient entries float16 flushed to zero, with and without a GradScaler.

    `nonzero` counts the float32 reference's non-zero entries; `zeroed_plain`
    and `zeroed_scaled` count those that came out exactly 0.0 under float16
    autocast without and with loss scaling; `error_plain` / `error_scaled`
    are the L2-relative errors against the reference; `scale` is the loss scale.
    """

    nonzero: int
    zeroed_plain: int
    zeroed_scaled: int
    error_plain: float
    error_scaled: float
    scale: float


def fp16_underflow(
    model: nn.Module, loss_fn: LossFn, inputs: torch.Tensor, targets: torch.Tensor,
    micro_batch: int, *, loss_weight: float, init_scale: float = 2.0**16,
) -> Underflow:
    """One accumulated update three ways (float32; float16 without scaler; float16 with one).

    Nothing is clipped (`max_norm=inf`), so the applied gradients are the raw
    accumulated ones.

    Args:
        model, loss_fn, inputs, targets, micro_batch: as for `amp_update`.
        loss_weight: multiplies each micro-batch's loss.
        init_scale: the scaler's first scale.

    Returns:
        The `Underflow`: entries zeroed in float16 with and without the scaler, and errors.

    Raises:
        RuntimeError: if one of the three runs took no step.
    """
    kw = dict(order="correct", max_norm=math.inf, loss_weight=loss_weight)
    ref = amp_update(model, loss_fn, inputs, targets, micro_batch, amp=False, **kw)
    plain = amp_update(model, loss_fn, inputs, targets, micro_batch, use_scaler=False, **kw)
    scaled = amp_update(model, loss_fn, inputs, targets, micro_batch, init_scale=init_scale, **kw)
    for name, out in (("float32", ref), ("float16 without scaler", plain), ("float16 with scaler", scaled)):
        if out.applied is None:
            raise RuntimeError(f"the {name} run took no step ({out.error or 'skipped: inf/nan'})")
    nz = ref.applied != 0
    return Underflow(
        nonzero=int(nz.sum()),
        zeroed_plain=int(((plain.applied == 0) & nz).sum()),
        zeroed_scaled=int(((scaled.applied == 0) & nz).sum()),
        error_plain=compare_grads(ref.applied, plain.applied).l2_rel,
        error_scaled=compare_grads(ref.applied, scaled.applied).l2_rel,
        scale=scaled.scale,
    )
