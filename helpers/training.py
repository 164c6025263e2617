"""The pieces of a training step that several lessons share (core, lessons 01-08).

- `lm_loss(logits, targets)`: next-token cross-entropy, the one language-model loss
  every lesson and test uses. Its signature is a `loss_fn(outputs, targets)`, so it
  plugs straight into `helpers.accumulation.accumulated_grad`.
- `make_optimizer(name, model)`: the lessons' two optimizers by name (`OPTIMIZERS`):
  plain SGD, which keeps no state, and Adam, which keeps two tensors per parameter.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from helpers.checks import choice, instance_arg, tensor_arg

__all__ = ["IGNORE_INDEX", "OPTIMIZERS", "REDUCTIONS", "lm_loss", "make_optimizer"]

IGNORE_INDEX = -100  # PyTorch's and Hugging Face's label for padding: no loss, no gradient
REDUCTIONS = ("mean", "sum", "none")
OPTIMIZERS = ("sgd", "adam")


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, *, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of `logits` (batch, seq, vocab) against `targets` (batch, seq).

    Positions labelled `IGNORE_INDEX` are skipped. `reduction="mean"` averages over
    the valid tokens; `"sum"` adds them up (for token-weighted accumulation, lesson 05);
    `"none"` returns one loss per position, flattened.
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


def make_optimizer(name: str, model: nn.Module) -> torch.optim.Optimizer:
    """'sgd' (plain, no momentum: no state) or 'adam' (two state tensors per parameter), lr 1e-3."""
    choice("optimizer", name, OPTIMIZERS)
    instance_arg("model", model, nn.Module, "torch.nn.Module")
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=1e-3)
    return torch.optim.Adam(model.parameters(), lr=1e-3)
