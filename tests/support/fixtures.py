"""Fixtures two or more test files use (registered by `tests/conftest.py`)."""

from __future__ import annotations

import pytest
import torch

from helpers.techniques.token_loss import variable_length_sequences
from helpers.techniques.tokens import tiny_lm

V, L = 16, 12  # the tiny language model's vocabulary and longest sequence


@pytest.fixture(scope="module")
def tiny_token_lm() -> torch.nn.Module:
    """Lesson 05's tiny language model at the tests' size (one layer, width 16), seed 0."""
    return tiny_lm(vocab_size=V, max_len=L, d_model=16, n_layers=1, seed=0)


def token_samples(n: int = 8, spread: float = 0.8, seed: int = 0) -> list[torch.Tensor]:
    """`n` variable-length token sequences for `tiny_token_lm`."""
    return variable_length_sequences(n, L, V, spread=spread, seed=seed)
