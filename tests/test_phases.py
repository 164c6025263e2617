"""helpers.phases (lesson 06): an update measured phase by phase, and the measurer the lesson sweeps."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import phases
from helpers.accumulation import compare_grads, flat_grad, full_batch_grad
from helpers.data import regression_batch, token_batch
from helpers.models import GPTConfig, ResidualMLP, seeded_gpt
from helpers.planner_lab import lesson_model
from helpers.training import lm_loss

CPU = torch.device("cpu")


def _mlp_phases(b: int) -> phases.PhaseMemory:
    torch.manual_seed(0)
    model = ResidualMLP(d_in=64, width=256, depth=3, d_out=8)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = [regression_batch(16 * b, 64, 8, seed=i) for i in range(2)]

    def update() -> None:
        opt.zero_grad(set_to_none=True)
        for x, y in batches:
            (F.mse_loss(model(x), y) / 2).backward()
        opt.step()

    update()  # warm-up: Adam's state exists
    return phases.measure_phases(update, model=model, optimizer=opt)


def test_phase_memory_reads_like_step_memory() -> None:
    m = _mlp_phases(2)
    assert m.peak_bytes == max(m.forward_peak_bytes, m.optimizer_peak_bytes)
    assert sum(m.breakdown.values()) == m.peak_bytes
    assert m.floor_bytes > 0 and m.binding_phase in ("forward", "optimizer")
    assert m.method == "cpu-tracker" and m.optimizer_peak_bytes > 0


def test_measure_phases_validates() -> None:
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match="update"):
        phases.measure_phases(42, model=model, optimizer=opt)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="optimizer"):
        phases.measure_phases(lambda: None, model=model, optimizer="adam")  # type: ignore[arg-type]


def test_update_measurer_validates() -> None:
    model = lesson_model("tiny", CPU)
    with pytest.raises(TypeError, match="GPT"):
        phases.UpdateMeasurer(torch.nn.Linear(2, 2))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="checkpointed"):
        phases.UpdateMeasurer(model, checkpointed=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="optimizer='lion'"):
        phases.UpdateMeasurer(model, optimizer="lion")
    with pytest.raises(ValueError, match="micro_batch"):
        phases.UpdateMeasurer(model)(0)


def test_checkpointing_lowers_the_measured_forward_peak() -> None:
    model = lesson_model("tiny", CPU)
    plain = phases.UpdateMeasurer(model)
    ckpt = phases.UpdateMeasurer(model, checkpointed=True, optimizer=plain.optimizer)
    a, b = plain(8), ckpt(8)
    assert b.forward_breakdown["activations"] < a.forward_breakdown["activations"]
    assert model.block_wrapper is None, "the measurer puts the model's block wrapper back"


def test_accumulate_update_steps_on_the_full_batch_gradient() -> None:
    # K = 4 micro-batches of 2 sequences: the gradient at the optimizer step must be the gradient
    # of the mean loss over all 8 sequences, taken in one forward and backward (dropout off).
    model = seeded_gpt(GPTConfig(vocab_size=32, seq_len=16, d_model=16, n_heads=2, n_layers=2,
                                 dropout=0.0), CPU)
    batches = [token_batch(2, 16, 32, seed=i) for i in range(4)]
    inputs = torch.cat([idx for idx, _ in batches])
    targets = torch.cat([t for _, t in batches])
    expected = full_batch_grad(model, lm_loss, inputs, targets)  # before the update moves weights
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    captured: list[torch.Tensor] = []
    opt.register_step_pre_hook(lambda *_: captured.append(flat_grad(model)))
    phases.accumulate_update(model, opt, batches)
    assert len(captured) == 1
    assert compare_grads(expected, captured[0]).max_rel <= 1e-5
