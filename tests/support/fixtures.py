"""Fixtures two or more test files use (registered by `tests/conftest.py`), and their sizes."""

from __future__ import annotations

import pytest
import torch

from helpers.frameworks import installed
from helpers.techniques.token_loss import variable_length_sequences
from helpers.techniques.tokens import tiny_lm

V, L = 16, 12  # the tiny language model's vocabulary and longest sequence
HF_SIZES = dict(vocab_size=48, hidden=24, layers=2, heads=2, max_len=12)  # the frameworks' tests' LMs


@pytest.fixture(scope="module")
def tiny_token_lm() -> torch.nn.Module:
    """Lesson 05's tiny language model at the tests' size (one layer, width 16), seed 0."""
    return tiny_lm(vocab_size=V, max_len=L, d_model=16, n_layers=1, seed=0)


def token_samples(n: int = 8, spread: float = 0.8, seed: int = 0) -> list[torch.Tensor]:
    """`n` variable-length token sequences for `tiny_token_lm`."""
    return variable_length_sequences(n, L, V, spread=spread, seed=seed)


@pytest.fixture(scope="module")
def hf():
    """`helpers.frameworks.hf`, imported once Transformers is (its import timed)."""
    installed.timed_import("transformers")
    from helpers.frameworks import hf as module

    return module
