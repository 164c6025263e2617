"""The pieces of a training step that several lessons share (core, lessons 01-08).

- `lm_loss(logits, targets)`: next-token cross-entropy, the one language-model loss
  every lesson and test uses. Its signature is a `loss_fn(outputs, targets)`, so it
  plugs straight into `helpers.accumulation.accumulated_grad`.
- `make_optimizer(name, model)`: the lessons' optimizers by name (`OPTIMIZERS`): plain
  SGD, which keeps no state, SGD with momentum (one tensor per parameter), and Adam and
  AdamW (two tensors per parameter, plus a step counter per parameter tensor);
  `STATE_PER_PARAM` says how many parameter-sized state tensors each keeps.
- `linear_warmup(steps)`: a linear learning-rate warmup, as a `LambdaLR` factor.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from helpers.validate import choice, instance_arg, positive_int, tensor_arg

__all__ = [
    "IGNORE_INDEX", "OPTIMIZERS", "REDUCTIONS", "STATE_PER_PARAM", "linear_warmup", "lm_loss",
    "make_optimizer",
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


def linear_warmup(steps: int) -> Callable[[int], float]:
    """A linear warmup over `steps` updates, as a `LambdaLR` factor: (u + 1) / steps, then 1.

    Args:
        steps: warmup updates (>= 1).

    Returns:
        update -> factor.
    """
    positive_int("steps", steps)
    return lambda u: min(1.0, (u + 1) / steps)
