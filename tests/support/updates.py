"""A small MLP's accumulated Adam update, for the tests that measure an update's phases and fit profiles."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from helpers.core.data import regression_batch
from helpers.models.nets import ResidualMLP


def mlp_adam() -> tuple[nn.Module, torch.optim.Optimizer]:
    """A `ResidualMLP` (64 -> 256 x 3 -> 8, seed 0) and its Adam."""
    torch.manual_seed(0)
    model = ResidualMLP(d_in=64, width=256, depth=3, d_out=8)
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def mlp_update(model: nn.Module, opt: torch.optim.Optimizer, b: int) -> Callable[[], None]:
    """One update of 2 micro-steps of 16 x `b` regression examples (loss / 2), run once as a warm-up.

    The warm-up makes Adam's state exist, so a measurement of the returned update is steady training.
    """
    batches = [regression_batch(16 * b, 64, 8, seed=i) for i in range(2)]

    def update() -> None:
        opt.zero_grad(set_to_none=True)
        for x, y in batches:
            (F.mse_loss(model(x), y) / 2).backward()
        opt.step()

    update()
    return update
