"""helpers.techniques.update_memory: one accumulation update measured whole, its table rows and the sweep."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from helpers.core.data import token_batch
from helpers.core.training import lm_loss
from helpers.measure.formulas import linear_fit
from helpers.models.gpt import GPTConfig, explainer_model, seeded_gpt
from helpers.techniques.update_memory import activation_sweep, breakdown_for, measure_config, measure_update

CPU = torch.device("cpu")
TINY = GPTConfig(vocab_size=5, seq_len=3, d_model=4, n_heads=2, n_layers=2, dropout=0.0)


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


def test_measure_update_takes_one_true_sgd_step_and_restores_the_model() -> None:
    """After measuring, the weights are those of plain SGD (lr 1e-3) computed here on full batches:
    the warm-up step on micro-batch 0 (its loss / K), then one step on micro-batches 0 and 1 together
    (their mean loss = the accumulated loss / K). The previous block wrapper is back, no gradient left."""
    model = seeded_gpt(TINY, CPU)
    reference = seeded_gpt(TINY, CPU)
    seen: list[str] = []

    def plain(block: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return block(x)

    def wrapped(block: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        seen.append("wrapped")
        return block(x)

    model.block_wrapper = plain
    measure_update(model, micro_batch=1, steps=2, optimizer="sgd", block_wrapper=wrapped)
    assert seen and model.block_wrapper is plain
    assert all(p.grad is None for p in model.parameters())

    x0, y0 = token_batch(1, TINY.seq_len, TINY.vocab_size, seed=0)
    x1, y1 = token_batch(1, TINY.seq_len, TINY.vocab_size, seed=1)
    for idx, targets, factor in ((x0, y0, 0.5), (torch.cat([x0, x1]), torch.cat([y0, y1]), 1.0)):
        grads = torch.autograd.grad(lm_loss(reference(idx), targets), list(reference.parameters()))
        with torch.no_grad():
            for p, g in zip(reference.parameters(), grads, strict=True):
                p -= 1e-3 * factor * g
    start = seeded_gpt(TINY, CPU)
    for p, q, p0 in zip(model.parameters(), reference.parameters(), start.parameters(), strict=True):
        torch.testing.assert_close(p - p0, q - p0, rtol=1e-3, atol=1e-9)


def test_breakdown_for_defaults_to_adam_and_the_sweep_shows_progress(
    capsys: pytest.CaptureFixture, optimizer_state_bytes: Callable[[torch.nn.Module, str], int]
) -> None:
    model = seeded_gpt(TINY, CPU)
    adam_state = optimizer_state_bytes(seeded_gpt(TINY, CPU), "adam")
    assert breakdown_for(model, 2).breakdown["optimizer_state"] == adam_state
    sweep = activation_sweep(model, [1, 2])  # two sizes are enough for a line; a bar by default
    assert list(sweep) == [1, 2]
    assert re.search(r"(^|\r)micro-batch sweep: 100%", capsys.readouterr().err)
    activation_sweep(model, [1, 2], progress=False)
    assert capsys.readouterr().err == ""
