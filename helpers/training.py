"""The pieces of a training step that several lessons share (core, lessons 01-08).

- `lm_loss(logits, targets)`: next-token cross-entropy, the one language-model loss
  every lesson and test uses. Its signature is a `loss_fn(outputs, targets)`, so it
  plugs straight into `helpers.accumulation.accumulated_grad`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["IGNORE_INDEX", "lm_loss"]

IGNORE_INDEX = -100  # PyTorch's and Hugging Face's label for padding: no loss, no gradient


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, *, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of `logits` (batch, seq, vocab) against `targets` (batch, seq).

    Positions labelled `IGNORE_INDEX` are skipped. `reduction="mean"` averages over
    the valid tokens; `"sum"` adds them up (for token-weighted accumulation, lesson 05).
    """
    if logits.dim() != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(
            f"logits must be (batch, seq, vocab) and targets (batch, seq), got {tuple(logits.shape)} "
            f"and {tuple(targets.shape)}"
        )
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX,
                           reduction=reduction)
