"""helpers.planner (lesson 06): profiles, the planner's rule and its refusals, estimators, remedies.

The planner is tested on models that are not the lesson's GPT: a residual MLP (measured for
real with `measure_phases` and with `measure_step`) and hand-made profiles.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from helpers import planner
from helpers.data import regression_batch
from helpers.memory import measure_step
from helpers.models import ResidualMLP
from helpers.phases import measure_phases
from helpers.planner_lab import lesson_config

MiB = 2**20


def _profile(**changes: float) -> planner.MemoryProfile:
    """A hand-made profile: floor 100 MiB, 10 MiB per example, optimizer step at 110 MiB."""
    base = dict(floor_bytes=100 * MiB, gradient_bytes=25 * MiB, other_bytes=2 * MiB,
                other_bytes_per_example=0.0, activation_bytes_per_example=10 * MiB,
                activation_intercept_bytes=0.0, optimizer_peak_bytes=110 * MiB,
                optimizer_bytes_per_example=0.0, method="cpu-tracker")
    return planner.MemoryProfile(**{**base, **changes})


PLAIN = _profile()
CKPT = _profile(activation_bytes_per_example=2 * MiB, label="checkpointed")


# -- a real profile of a model that is not the lesson's ---------------------------------------
def _mlp_measure(phases: bool):
    torch.manual_seed(0)
    model = ResidualMLP(d_in=64, width=256, depth=3, d_out=8)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def measure(b: int):
        batches = [regression_batch(16 * b, 64, 8, seed=i) for i in range(2)]

        def update() -> None:
            opt.zero_grad(set_to_none=True)
            for x, y in batches:
                (F.mse_loss(model(x), y) / 2).backward()
            opt.step()

        update()  # warm-up: Adam's state exists
        try:
            if phases:
                return measure_phases(update, model=model, optimizer=opt)
            return measure_step(update, model=model, optimizer=opt)
        finally:
            opt.zero_grad(set_to_none=True)

    return measure


def test_fit_profile_predicts_held_out_sizes_of_an_mlp() -> None:
    measure = _mlp_measure(phases=True)
    profile = planner.fit_profile(measure, (2, 4, 8))
    assert profile.method == "cpu-tracker" and profile.micro_batches == (2, 4, 8)
    assert profile.activation_bytes_per_example > 0
    for b in (3, 12):
        measured = measure(b)
        assert measured.peak_bytes == pytest.approx(profile.predict_peak(b), rel=0.10), b
        assert profile.binding_phase(b) == measured.binding_phase


def test_fit_profile_from_plain_step_memory() -> None:
    measure = _mlp_measure(phases=False)
    profile = planner.fit_profile(measure, (4, 8, 16))
    assert measure(12).peak_bytes == pytest.approx(profile.predict_peak(12), rel=0.10)


def test_fit_profile_validates() -> None:
    measure = _mlp_measure(phases=True)
    with pytest.raises(ValueError, match="at least two distinct sizes"):
        planner.fit_profile(measure, (4, 4))
    with pytest.raises(ValueError, match="positive int"):
        planner.fit_profile(measure, (0, 2))
    with pytest.raises(TypeError):
        planner.fit_profile(measure, (True, 2))
    with pytest.raises(TypeError, match="measure"):
        planner.fit_profile(42, (1, 2))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="StepMemory"):
        planner.fit_profile(lambda b: b, (1, 2))


def test_fit_profile_needs_two_forward_peaks_from_plain_step_memory() -> None:
    class Fake:
        def __init__(self, peak: int) -> None:
            self.peak_bytes = peak
            self.breakdown = {"parameters": peak, "gradients": 0, "optimizer_state": 0,
                              "activations": 0, "other": 0}
            self.method = "cpu-tracker"
            self.floor_bytes = peak

    with pytest.raises(ValueError, match="peaked in the forward pass"):
        planner.fit_profile(lambda b: Fake(100), (1, 2))


# -- the profile's arithmetic ------------------------------------------------------------------
def test_profile_phases_and_crossover() -> None:
    # forward: 100 + 2 + 10 b MiB; optimizer: 110 MiB -> crossover at b = 0.8
    assert PLAIN.forward_peak(1) == 112 * MiB
    assert PLAIN.predict_peak(1) == 112 * MiB and PLAIN.binding_phase(1) == "forward"
    assert PLAIN.crossover == pytest.approx(0.8)
    assert CKPT.crossover == pytest.approx(4.0)
    assert CKPT.binding_phase(2) == "optimizer" and CKPT.predict_peak(2) == 110 * MiB
    # K = 1: no gradients alive yet when the activations peak, but never below the floor
    assert PLAIN.forward_peak(4, accumulation_steps=1) == (100 + 2 + 40 - 25) * MiB
    assert CKPT.forward_peak(1, accumulation_steps=1) == 100 * MiB
    assert _profile(optimizer_bytes_per_example=20 * MiB).crossover == math.inf


# -- recommend: the rule -----------------------------------------------------------------------
def test_recommend_takes_the_largest_plain_micro_batch() -> None:
    plan = planner.recommend(150 * MiB, 32, PLAIN, CKPT)  # 102 + 10b <= 150 -> b <= 4.8 -> 4
    assert (plan.micro_batch, plan.accumulation_steps, plan.checkpoint) == (4, 8, False)
    assert plan.predicted_peak_bytes == 142 * MiB and plan.effective_batch == 32
    assert "largest micro-batch" in plan.reason and plan.reason.endswith(".")


def test_recommend_no_accumulation_when_the_batch_fits() -> None:
    plan = planner.recommend(10_000 * MiB, 32, PLAIN)
    assert (plan.micro_batch, plan.accumulation_steps, plan.checkpoint) == (32, 1, False)
    assert "nothing to accumulate" in plan.reason


def test_recommend_checkpoints_only_when_no_plain_micro_batch_fits() -> None:
    # plain: 8 needs 182 MiB; checkpointed: 32 in one pass 141, 16 needs 134, 8 needs 118
    plan = planner.recommend(130 * MiB, 32, PLAIN, CKPT, min_micro_batch=8)
    assert (plan.micro_batch, plan.accumulation_steps, plan.checkpoint) == (8, 4, True)
    assert "checkpointing" in plan.reason


def test_recommend_refuses_below_the_floor_and_names_the_remedies() -> None:
    with pytest.raises(ValueError, match="Nothing fits") as info:
        planner.recommend(90 * MiB, 32, PLAIN, CKPT)
    msg = str(info.value)
    assert str(100 * MiB) in msg and "below the floor" in msg
    for word in ("lesson 07", "optimizer state", "lower precision", "offload"):
        assert word in msg, word


def test_recommend_refuses_when_the_floor_fits_but_no_micro_batch_does() -> None:
    with pytest.raises(ValueError, match="the floor fits, but even micro-batch 1") as info:
        planner.recommend(105 * MiB, 32, PLAIN, CKPT)
    assert str(100 * MiB) in str(info.value)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"budget_bytes": 0}, ValueError, "budget_bytes"),
    ({"budget_bytes": -5.0}, ValueError, "budget_bytes"),
    ({"effective_batch": 0}, ValueError, "effective_batch"),
    ({"effective_batch": True}, TypeError, "effective_batch"),
    ({"min_micro_batch": 0}, ValueError, "min_micro_batch"),
    ({"min_micro_batch": 64}, ValueError, "larger than effective_batch"),
    ({"plain": "not a profile"}, TypeError, "plain must be a MemoryProfile"),
    ({"checkpointed": 3}, TypeError, "checkpointed must be a MemoryProfile"),
])
def test_recommend_validates(kwargs: dict, error: type, match: str) -> None:
    args = {"budget_bytes": 150 * MiB, "effective_batch": 32, "plain": PLAIN, "checkpointed": CKPT,
            "min_micro_batch": 1, **kwargs}
    with pytest.raises(error, match=match):
        planner.recommend(**args)


# -- estimators and remedies -------------------------------------------------------------------
def test_popular_estimates() -> None:
    cfg = lesson_config("tiny")
    est = planner.popular_estimates(cfg, 1000, 4, 64_000, checkpointed=False, planner_bytes=60_000)
    by = {e.name.split(" (")[0]: e for e in est}
    assert by["weights only"].predicted_bytes == 4000 and by["16 B/param"].predicted_bytes == 16_000
    assert by["18 B/param"].predicted_bytes == 18_000
    assert by["planner"].error == pytest.approx(-0.0625)
    assert all(e.leaves_out for e in est)
    # full recompute keeps one (s, b, h) input per layer: 4 bytes each in fp32
    s, h, n = cfg.seq_len, cfg.d_model, cfg.n_layers
    assert planner.korthikanti_activation_bytes(cfg, 4, recompute=True) == n * s * 4 * h * 4
    assert planner.korthikanti_activation_bytes(cfg, 4, recompute=False) > n * s * 4 * h * 4


def test_remedy_floors() -> None:
    rows = {r.remedy: r for r in planner.remedy_floors(100, 100, 200, workers=(4,))}
    adam = rows["Adam, fp32 (measured)"]
    assert adam.floor_bytes == 400 and adam.saving_bytes == 0
    assert rows["SGD with momentum (one buffer)"].floor_bytes == 300
    assert rows["SGD, no momentum (no state)"].floor_bytes == 200
    assert rows["bf16 parameters and gradients, fp32 Adam state"].floor_bytes == 300
    assert rows["everything sharded over 4 workers (FSDP / ZeRO-3)"].floor_bytes == 100
    assert rows["optimizer state sharded over 4 workers (ZeRO-1)"].floor_bytes == 250
    with pytest.raises(ValueError, match="workers"):
        planner.remedy_floors(100, 100, 200, workers=(0,))
