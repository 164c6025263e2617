"""The pieces of a training step that several lessons share (core, lessons 01-08).

- `lm_loss(logits, targets)`: next-token cross-entropy, the one language-model loss
  every lesson and test uses. Its signature is a `loss_fn(outputs, targets)`, so it
  plugs straight into `helpers.accumulation.accumulated_grad`.
- `make_optimizer(name, model)`: the lessons' optimizers by name (`OPTIMIZERS`): plain
  SGD, which keeps no state, SGD with momentum (one tensor per parameter), and Adam and
  AdamW (two tensors per parameter, plus a step counter per parameter tensor);
  `STATE_PER_PARAM` says how many parameter-sized state tensors each keeps.
- `warmup_cosine(warmup_steps, total_steps=None)`: a linear learning-rate warmup, then a cosine
  to 0 (or none), as a `LambdaLR` factor.
- `trainable_params(model)`, `clear_grads(model)`, `cleared_grads(model)`: the parameters that
  train (refusing a model with none), and `.grad` set to None, once or around a block.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from helpers.core.validate import choice, instance_arg, positive_int, tensor_arg

__all__ = [
    "IGNORE_INDEX", "OPTIMIZERS", "REDUCTIONS", "STATE_PER_PARAM", "clear_grads", "cleared_grads",
    "lm_loss", "make_optimizer", "trainable_params", "warmup_cosine",
]

IGNORE_INDEX = -100  # PyTorch's and Hugging Face's label for padding: no loss, no gradient
REDUCTIONS = ("mean", "sum", "none")
OPTIMIZERS = ("sgd", "sgd-momentum", "adam", "adamw")
STATE_PER_PARAM = {"sgd": 0, "sgd-momentum": 1, "adam": 2, "adamw": 2}  # parameter-sized state tensors


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, *, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of `logits` against `targets`, skipping positions labelled `IGNORE_INDEX`.

    Args:
        logits: (batch, seq, vocab) scores.
        targets: (batch, seq) token ids.
        reduction: "mean" averages over the valid tokens; "sum" adds them up (token-weighted
            accumulation, lesson 05); "none" gives one loss per position, flattened.

    Returns:
        The loss: a scalar, or (batch * seq,) losses for "none".

    Raises:
        ValueError: if the shapes are not (batch, seq, vocab) and (batch, seq), or `reduction` is unknown.
    """
    tensor_arg("logits", logits)
    tensor_arg("targets", targets)
    choice("reduction", reduction, REDUCTIONS)
    if logits.dim() != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(
            f"logits must be (batch, seq, vocab) and targets (batch, seq), got {tuple(logits.shape)} "
            f"and {tuple(targets.shape)}"
        )
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX,
                           reduction=reduction)


def make_optimizer(name: str, model: nn.Module, *, foreach: bool | None = None) -> torch.optim.Optimizer:
    """The optimizer `name` over `model`'s trainable parameters, lr 1e-3.

    Args:
        name: one of `OPTIMIZERS`.
        model: the model whose parameters with `requires_grad` it updates.
        foreach: None lets torch pick its implementation; True is CUDA's default multi-tensor
            one (larger temporaries in the step), False the one-tensor-at-a-time loop.

    Returns:
        A fresh `torch.optim.Optimizer` (no state yet).
    """
    choice("optimizer", name, OPTIMIZERS)
    instance_arg("model", model, nn.Module, "torch.nn.Module")
    params = [p for p in model.parameters() if p.requires_grad]
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-3, foreach=foreach)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, foreach=foreach)
    return torch.optim.SGD(params, lr=1e-3, momentum=0.9 if name == "sgd-momentum" else 0.0, foreach=foreach)


def warmup_cosine(warmup_steps: int, total_steps: int | None = None) -> Callable[[int], float]:
    """LR multiplier for `LambdaLR`: linear warmup to 1.0 over `warmup_steps`, then cosine to 0.

    Step s of warmup gives (s + 1) / warmup_steps (so the peak is at step warmup_steps - 1).
    With `total_steps`, a cosine takes it to 0 at `total_steps` and it stays at 0 after; without
    it, it stays at 1.0 (a plain linear warmup).

    Args:
        warmup_steps: steps of warmup (>= 1).
        total_steps: steps to the end of the cosine (more than `warmup_steps`), or None for none.

    Returns:
        step -> multiplier.

    Raises:
        ValueError: if `total_steps` does not exceed `warmup_steps`.
    """
    positive_int("warmup_steps", warmup_steps)
    if total_steps is None:
        return lambda step: min(1.0, (step + 1) / warmup_steps)
    positive_int("total_steps", total_steps)
    if total_steps <= warmup_steps:
        raise ValueError(f"total_steps={total_steps} must exceed warmup_steps={warmup_steps}")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps + 1) / (total_steps - warmup_steps))
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


# -- argument checks shared by the gradient functions ---------------------------------
def trainable_params(model: nn.Module) -> list[nn.Parameter]:
    """The parameters of `model` that require grad; raises if `model` is no Module or has none."""
    instance_arg("model", model, nn.Module, "torch.nn.Module")
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("model has no parameters that require grad; nothing to differentiate")
    return params


@contextmanager
def cleared_grads(model: nn.Module) -> Iterator[nn.Module]:
    """Clear `model`'s gradients on entry and again on exit, also when the body raises.

    ``with cleared_grads(model): loss.backward(); g = flat_grad(model)`` starts
    from no gradients and leaves none behind.
    """
    clear_grads(model)
    try:
        yield model
    finally:
        clear_grads(model)


# -- clearing and reading gradients ----------------------------------------------------
def clear_grads(model: nn.Module) -> None:
    """Set every parameter's `.grad` to None (what `zero_grad(set_to_none=True)` does)."""
    for p in model.parameters():
        p.grad = None
