"""helpers.models.nets (core): the block hook every model runs through, and facts about a model."""

from __future__ import annotations

import pytest
import torch

from helpers.core.device import device_of
from helpers.models.nets import ResidualMLP, param_bytes


def test_block_wrapper_is_called_per_block() -> None:
    model = ResidualMLP(4, 8, 3, 1)
    seen = []
    model.block_wrapper = lambda block, x: (seen.append(block), block(x))[1]
    model(torch.randn(2, 4))
    assert seen == list(model.blocks)


def test_param_bytes_counts_each_storage_once() -> None:
    model = ResidualMLP(4, 8, 2, 1)
    assert param_bytes(model) == 4 * sum(p.numel() for p in model.parameters())


def test_device_of() -> None:
    assert device_of(ResidualMLP(4, 8, 1, 1)) == torch.device("cpu")
    with pytest.raises(ValueError, match="no parameters"):
        device_of(torch.nn.ReLU())
    with pytest.raises(TypeError, match="torch.nn.Module"):
        device_of("model")  # type: ignore[arg-type]


def test_param_bytes_counts_tied_and_offset_views_once() -> None:
    """Tied weights, and two parameters viewing one storage at different offsets (issue 16)."""
    tied = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    tied[1].weight = tied[0].weight
    assert param_bytes(tied) == 10 * 4 * 4
    flat = torch.zeros(100)  # 400 bytes
    shared = torch.nn.Module()
    shared.a = torch.nn.Parameter(torch.empty(0))
    shared.b = torch.nn.Parameter(torch.empty(0))
    shared.a.data = flat[:60].view(6, 10)
    shared.b.data = flat[40:]  # starts 160 bytes in: its data_ptr differs, its storage does not
    assert shared.b.data_ptr() != shared.a.data_ptr()
    assert param_bytes(shared) == 400  # the storage once, not 60 * 4 + 60 * 4
