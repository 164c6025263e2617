"""helpers.budget: the explainer's calculator and the measured rows."""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from helpers.budget import (
    activation_sweep,
    breakdown_for,
    budget_row,
    explainer_model,
    explainer_table,
    lesson_config,
    linear_fit,
    make_optimizer,
    measure_config,
    scaled_budget,
)

CPU = torch.device("cpu")


def test_calculator_reproduces_the_explainer() -> None:
    rows = explainer_table()
    assert [r.peak_gb for r in rows] == [23.5, 20.3, 18.5]
    assert [r.effective_batch for r in rows] == [32, 32, 32]
    assert rows[0].headroom_gb == pytest.approx(0.5)


def test_calculator_validates() -> None:
    with pytest.raises(ValueError, match="micro_batch must be a positive int, got 0"):
        budget_row(0, 4, 1.0)
    with pytest.raises(ValueError, match="steps"):
        budget_row(4, -1, 1.0)
    with pytest.raises(ValueError, match=">= 0"):
        budget_row(4, 1, -1.0)
    with pytest.raises(ValueError, match="scale='huge'"):
        lesson_config("huge")
    with pytest.raises(ValueError, match="optimizer='lion'"):
        make_optimizer("lion", torch.nn.Linear(2, 2))


def test_scaled_budget_keeps_the_explainer_ratio() -> None:
    assert scaled_budget(145) == pytest.approx(240)


def test_linear_fit() -> None:
    fit = linear_fit([1, 2, 3, 4], [3, 5, 7, 9])
    assert fit.slope == pytest.approx(2) and fit.intercept == pytest.approx(1) and fit.r2 == pytest.approx(1)
    with pytest.raises(ValueError, match="distinct"):
        linear_fit([2, 2], [1, 3])
    with pytest.raises(ValueError, match="equal-length"):
        linear_fit([1, 2], [1])


def test_measured_rows_tiny() -> None:
    model = explainer_model("tiny", CPU)
    big = measure_config(model, micro_batch=8, steps=2)
    small = measure_config(model, micro_batch=4, steps=4)
    ckpt = measure_config(model, micro_batch=4, steps=4,
                          block_wrapper=lambda b, x: checkpoint(b, x, use_reentrant=False))
    assert big.effective_batch == small.effective_batch == 16
    assert ckpt.activations_bytes < small.activations_bytes < big.activations_bytes
    assert big.floor_bytes == small.floor_bytes == ckpt.floor_bytes
    assert model.block_wrapper is None  # restored after measuring


def test_sweep_is_linear_and_floor_is_constant() -> None:
    model = explainer_model("tiny", CPU)
    sweep = activation_sweep(model, [1, 2, 3, 4], progress=False)
    fit = linear_fit(list(sweep), [m.breakdown["activations"] for m in sweep.values()])
    assert fit.r2 > 0.99
    assert len({m.floor_bytes for m in sweep.values()}) == 1
    sgd = breakdown_for(model, 2, "sgd")
    assert sgd is not None and sgd.breakdown["optimizer_state"] == 0
    with pytest.raises(ValueError, match="at least two"):
        activation_sweep(model, [4])
