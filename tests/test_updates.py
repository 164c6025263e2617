"""helpers.updates: one accumulation update measured, the activation formula, and the line fit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.checkpoint import checkpoint

from helpers.models import GPTConfig, explainer_config, explainer_model
from helpers.updates import (
    activation_bytes_per_example,
    activation_sweep,
    breakdown_for,
    linear_fit,
    measure_config,
    measure_update,
    predicted_update_peak_bytes,
)

CPU = torch.device("cpu")


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


# -- the drawn budget, the formulas, the shortcut (issue 10/11 items of lesson 01) -------------


def test_formula_matches_the_tracker_at_tiny() -> None:
    model = explainer_model("tiny", CPU)
    sweep = activation_sweep(model, [2, 3, 4], progress=False)
    fit = linear_fit(list(sweep), [m.breakdown["activations"] for m in sweep.values()])
    assert fit.slope == pytest.approx(activation_bytes_per_example(model.cfg), rel=0.01)
    for b, m in sweep.items():
        assert m.peak_bytes == pytest.approx(predicted_update_peak_bytes(model.cfg, b), rel=0.01)
    one_step = measure_update(model, micro_batch=2, steps=1)
    assert one_step.breakdown["gradients"] == 0
    assert one_step.peak_bytes == pytest.approx(predicted_update_peak_bytes(model.cfg, 2, steps=1), rel=0.01)
    sgd = measure_update(model, micro_batch=2, steps=2, optimizer="sgd")
    predicted_sgd = predicted_update_peak_bytes(model.cfg, 2, optimizer="sgd")
    assert sgd.peak_bytes == pytest.approx(predicted_sgd, rel=0.01)


def test_formula_refuses_other_models() -> None:
    with pytest.raises(ValueError, match="dropout=0.0"):
        activation_bytes_per_example(GPTConfig(dropout=0.1))
    with pytest.raises(ValueError, match="fused_attention"):
        predicted_update_peak_bytes(GPTConfig(dropout=0.0, fused_attention=True), 2)
    with pytest.raises(TypeError, match="GPTConfig"):
        activation_bytes_per_example({"d_model": 64})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="micro_batch"):
        predicted_update_peak_bytes(explainer_config("tiny"), 0)


def test_two_micro_steps_give_the_peak_of_many() -> None:
    model = explainer_model("tiny", CPU)
    full = measure_update(model, micro_batch=3, steps=6)
    short = measure_update(model, micro_batch=3, steps=6, max_micro_steps=2)
    assert short.peak_bytes == full.peak_bytes
    row = measure_config(model, micro_batch=3, steps=6, max_micro_steps=2)
    assert row.steps == 6 and row.effective_batch == 18 and row.peak_bytes == full.peak_bytes
    with pytest.raises(ValueError, match="max_micro_steps must be an int >= 2"):
        measure_update(model, micro_batch=3, steps=6, max_micro_steps=1)
    with pytest.raises(TypeError, match="steps"):
        measure_update(model, micro_batch=3, steps=True)  # type: ignore[arg-type]


def test_linear_fit_on_noisy_data_matches_numpy() -> None:
    """R^2 on noisy data against numpy (issue 16: an R^2 stuck at 1.0 passed the perfect line)."""
    rng = np.random.default_rng(3)
    xs = np.arange(1.0, 21.0)
    ys = 3.0 * xs + 2.0 + rng.normal(0.0, 6.0, xs.size)
    slope, intercept = np.polyfit(xs, ys, 1)
    r2 = np.corrcoef(xs, ys)[0, 1] ** 2  # R^2 of a least-squares line is the squared correlation
    fit = linear_fit(xs.tolist(), ys.tolist())
    assert 0.5 < r2 < 0.99  # noisy enough that "R^2 = 1" is caught
    assert fit.slope == pytest.approx(slope, rel=1e-9)
    assert fit.intercept == pytest.approx(intercept, rel=1e-9)
    assert fit.r2 == pytest.approx(r2, rel=1e-9)
    flat = linear_fit([1, 2, 3, 4], [5.0, 5.0, 5.0, 5.0])  # nothing to explain: a perfect fit
    assert (flat.slope, flat.intercept, flat.r2) == (0.0, 5.0, 1.0)
