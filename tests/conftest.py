"""Shared test fixtures: a fixed seed for every test, and the cuda marker's skip."""

from __future__ import annotations

import pytest
import torch

from helpers.device import seed_everything


@pytest.fixture(autouse=True)
def _seed() -> None:
    seed_everything(0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
