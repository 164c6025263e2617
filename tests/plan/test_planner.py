"""helpers.planner (lesson 06): profiles, the planner's rule and its refusals, estimators, remedies.

The planner is tested on models that are not the lesson's GPT: a residual MLP (measured for
real with `measure_phases` and with `measure_step`) and hand-made profiles.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from support.updates import mlp_adam, mlp_update

from helpers.measure import formulas, memory_profile
from helpers.measure.memory import StepMemory, measure_step
from helpers.models.gpt import GPTConfig
from helpers.plan import estimates, planner
from helpers.techniques.phases import PhaseMemory, measure_phases

MiB = 2**20


def _profile(**changes: float) -> memory_profile.MemoryProfile:
    """A hand-made profile: floor 100 MiB, 10 MiB per example, optimizer step at 110 MiB."""
    base = dict(floor_bytes=100 * MiB, gradient_bytes=25 * MiB, other_bytes=2 * MiB,
                other_bytes_per_example=0.0, activation_bytes_per_example=10 * MiB,
                activation_intercept_bytes=0.0, optimizer_peak_bytes=110 * MiB,
                optimizer_bytes_per_example=0.0, method="cpu-tracker")
    return memory_profile.MemoryProfile(**{**base, **changes})


PLAIN = _profile()
CKPT = _profile(activation_bytes_per_example=2 * MiB, label="checkpointed")


# -- a real profile of a model that is not the lesson's ---------------------------------------
def _mlp_measure(phases: bool):
    model, opt = mlp_adam()

    def measure(b: int):
        update = mlp_update(model, opt, b)
        try:
            if phases:
                return measure_phases(update, model=model, optimizer=opt)
            return measure_step(update, model=model, optimizer=opt)
        finally:
            opt.zero_grad(set_to_none=True)

    return measure


def test_fit_profile_predicts_held_out_sizes_of_an_mlp() -> None:
    measure = _mlp_measure(phases=True)
    profile = memory_profile.fit_profile(measure, (2, 4, 8))
    assert profile.method == "cpu-tracker" and profile.micro_batches == (2, 4, 8)
    assert profile.activation_bytes_per_example > 0
    for b in (3, 12):
        measured = measure(b)
        assert measured.peak_bytes == pytest.approx(profile.predict_peak(b), rel=0.10), b
        assert profile.binding_phase(b) == measured.binding_phase


def test_fit_profile_from_plain_step_memory() -> None:
    measure = _mlp_measure(phases=False)
    profile = memory_profile.fit_profile(measure, (4, 8, 16))
    assert measure(12).peak_bytes == pytest.approx(profile.predict_peak(12), rel=0.10)


def test_fit_profile_validates() -> None:
    measure = _mlp_measure(phases=True)
    with pytest.raises(ValueError, match="at least two distinct sizes"):
        memory_profile.fit_profile(measure, (4, 4))
    with pytest.raises(ValueError, match="positive int"):
        memory_profile.fit_profile(measure, (0, 2))
    with pytest.raises(TypeError):
        memory_profile.fit_profile(measure, (True, 2))
    with pytest.raises(TypeError, match="measure"):
        memory_profile.fit_profile(42, (1, 2))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="StepMemory"):
        memory_profile.fit_profile(lambda b: b, (1, 2))


def test_fit_profile_needs_two_forward_peaks_from_plain_step_memory() -> None:
    class Fake:
        def __init__(self, peak: int) -> None:
            self.peak_bytes = peak
            self.breakdown = {"parameters": peak, "gradients": 0, "optimizer_state": 0,
                              "activations": 0, "other": 0}
            self.method = "cpu-tracker"
            self.floor_bytes = peak

    with pytest.raises(ValueError, match="peaked in the forward pass"):
        memory_profile.fit_profile(lambda b: Fake(100), (1, 2))


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
    assert "Rule step 4" in plan.reason


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
    assert isinstance(info.value, planner.NoPlanError) and info.value.floor_bytes == 100 * MiB
    assert "budget of 90.0 MiB" in msg and "is 100.0 MiB" in msg and "below the floor" in msg
    assert " bytes" not in msg  # human units only, never a raw byte count
    for word in ("lesson 07", "optimizer state", "lower precision", "offload"):
        assert word in msg, word


def test_recommend_refuses_when_the_floor_fits_but_no_micro_batch_does() -> None:
    with pytest.raises(ValueError, match="the floor fits, but even micro-batch 1") as info:
        planner.recommend(105 * MiB, 32, PLAIN, CKPT)
    assert "is 100.0 MiB" in str(info.value) and info.value.budget_bytes == 105 * MiB


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
    cfg = GPTConfig(vocab_size=1024, seq_len=16, d_model=32, n_heads=2, n_layers=2, dropout=0.0)
    est = estimates.popular_estimates(cfg, 1000, 4, 64_000, checkpointed=False, planner_bytes=60_000)
    by = {e.name.split(" (")[0]: e for e in est}
    assert by["weights only"].predicted_bytes == 4000 and by["16 B/param"].predicted_bytes == 16_000
    assert by["18 B/param"].predicted_bytes == 18_000
    assert by["planner"].error == pytest.approx(-0.0625)
    assert all(e.leaves_out for e in est)
    # full recompute keeps one (s, b, h) input per layer: 4 bytes each in fp32
    s, h, n = cfg.seq_len, cfg.d_model, cfg.n_layers
    assert formulas.korthikanti_activation_bytes(cfg, 4, recompute=True) == n * s * 4 * h * 4
    assert formulas.korthikanti_activation_bytes(cfg, 4, recompute=False) > n * s * 4 * h * 4


def test_remedy_floors() -> None:
    rows = {r.remedy: r for r in estimates.remedy_floors(100, 100, 200, workers=(4,))}
    adam = rows["Adam, fp32 (measured)"]
    assert adam.floor_bytes == 400 and adam.saving_bytes == 0
    assert rows["SGD with momentum (one buffer)"].floor_bytes == 300
    assert rows["SGD, no momentum (no state)"].floor_bytes == 200
    assert rows[estimates.MIXED_PRECISION].floor_bytes == 400
    assert rows[estimates.PURE_BF16].floor_bytes == 200
    assert rows["persistent state sharded over 4 workers (FSDP / ZeRO-3)"].floor_bytes == 100
    assert rows["optimizer state sharded over 4 workers (ZeRO-1)"].floor_bytes == 250
    with pytest.raises(ValueError, match="workers"):
        estimates.remedy_floors(100, 100, 200, workers=(0,))


# Bytes per parameter, counted by hand (issue 21): fp32 weights 4, gradients 4, Adam's two moments 8;
# bf16 copies 2 each; mixed precision (bf16 autocast) keeps the fp32 weights, gradients and moments, and
# no persistent bf16 copy: its casts live as activations (issue 37: one breakdown, 4 + 4 + 8).
HAND_COUNTED = {
    "Adam, fp32 (measured)": 4 + 4 + 8,
    "SGD with momentum (one buffer)": 4 + 4 + 4,
    "SGD, no momentum (no state)": 4 + 4,
    estimates.MIXED_PRECISION: 4 + 4 + 8,
    estimates.PURE_BF16: 2 + 2 + 2 + 2,
    "bf16 Adam state (fp32 weights and gradients)": 4 + 4 + 2 + 2,
    estimates.EIGHT_BIT: 4 + 4 + 1 + 1,
    "optimizer state offloaded to CPU": 4 + 4,
    "optimizer state sharded over 8 workers (ZeRO-1)": 4 + 4 + 8 / 8,
    "persistent state sharded over 8 workers (FSDP / ZeRO-3)": 16 / 8,
}


def test_remedy_floors_against_hand_counted_bytes_per_parameter() -> None:
    n = 1_000_003  # parameters; the measured fp32 Adam floor is 4 + 4 + 8 bytes of each
    rows = estimates.remedy_floors(4 * n, 4 * n, 8 * n, workers=(8,))
    assert {r.remedy: r.floor_bytes / n for r in rows} == pytest.approx(HAND_COUNTED)
    by = {r.remedy: r for r in rows}
    assert by[estimates.MIXED_PRECISION].saving_bytes == 0  # no saving on the floor
    assert "16 B/param" in by[estimates.MIXED_PRECISION].caveat
    assert "4 (fp32 weights) + 4 (fp32 gradients) + 8" in by[estimates.MIXED_PRECISION].caveat
    assert "2 + 2" not in by[estimates.MIXED_PRECISION].caveat  # no second breakdown of the same mode
    pure = by[estimates.PURE_BF16].caveat
    assert "stochastic rounding" in pure and "Kahan" in pure
    fsdp = by["persistent state sharded over 8 workers (FSDP / ZeRO-3)"]
    assert "per-rank peak" in fsdp.caveat
    assert all(not r.caveat for r in rows if r.remedy.startswith(("Adam", "SGD", "optimizer")))
    eight = by[estimates.EIGHT_BIT]
    assert "estimate" in eight.remedy and "not a measurement" in eight.caveat


def test_remedy_rows_follow_the_precision_mode() -> None:
    """bf16 mixed precision measures fp32 state: the same rows, the mixed row keeps all of it
    (16 B/param, no saving). Pure bf16 measures 2 + 2 + 4: no precision row applies."""
    n = 1000
    mixed = {r.remedy: r for r in estimates.remedy_floors(4 * n, 4 * n, 8 * n, precision="bf16")}
    assert mixed[estimates.MIXED_PRECISION].floor_bytes == 16 * n
    assert "Adam, bf16 mixed precision (measured)" in mixed
    pure = {r.remedy: r for r in estimates.remedy_floors(2 * n, 2 * n, 4 * n, precision="pure-bf16")}
    assert estimates.MIXED_PRECISION not in pure and estimates.PURE_BF16 not in pure
    assert pure["Adam, pure bf16 (measured)"].floor_bytes == 8 * n
    with pytest.raises(ValueError, match="precision"):
        estimates.remedy_floors(1, 1, 1, precision="fp8")


# -- killing the survivors of the mutation run (issue 16) --------------------------------------
# A synthetic job in bytes, every number chosen by hand: floor 4000 (parameters 1000,
# gradients 1000, Adam state 2000); at the forward phase's peak activations 400 + 800 b and
# other 200 + 100 b, so the forward peak is 4600 + 900 b; the optimizer step peaks at 6000 + 200 b.
# At b = 1 the optimizer step binds (6200 > forward) and the forward peak sits in another regime
# (activations 600, other 300: off the line); at b = 2 the two phases tie at 6400 (forward wins
# ties, as in `PhaseMemory.binding_phase`); at b = 4 the forward pass binds (8200 > 6800).
def _state(optimizer_state: int = 2000) -> dict[str, int]:
    return {"parameters": 1000, "gradients": 1000, "optimizer_state": optimizer_state}


def _forward(b: int) -> dict[str, int]:
    acts, other = (600, 300) if b == 1 else (400 + 800 * b, 200 + 100 * b)
    return {**_state(), "activations": acts, "other": other}


def _phases(b: int, optimizer_state: int = 2000) -> PhaseMemory:
    fwd = {**_forward(b), "optimizer_state": optimizer_state}
    opt_peak = 6000 + 200 * b
    opt = {**_state(optimizer_state), "activations": 0, "other": opt_peak - 2000 - optimizer_state}
    fwd_peak = sum(fwd.values())
    peak, breakdown = (fwd_peak, fwd) if fwd_peak >= opt_peak else (opt_peak, opt)
    return PhaseMemory(peak_bytes=peak, breakdown=breakdown, device="cpu", method="cpu-tracker",
                       forward_peak_bytes=fwd_peak, forward_breakdown=fwd,
                       optimizer_peak_bytes=opt_peak, optimizer_breakdown=opt)


def _step(b: int) -> StepMemory:
    """A plain StepMemory of the job: b = 1 peaks in the optimizer step, holding 20 bytes of activations."""
    if b == 1:  # 20 of 6200 bytes are activations (0.3%): an optimizer-step peak
        return StepMemory(6200, {**_state(), "activations": 20, "other": 2180}, "cpu", "cpu-tracker")
    return StepMemory(4600 + 900 * b, _forward(b), "cpu", "cpu-tracker")


def test_fit_profile_default_sizes_and_the_binding_sizes_of_a_phase_memory() -> None:
    """The forward line goes through b = 2 and 4 only (where the forward phase binds, the tie
    included); the optimizer line through all three sizes; the defaults are sizes (1, 2, 4), no label."""
    calls: list[int] = []

    def measure(b: int) -> PhaseMemory:
        calls.append(b)
        return _phases(b)

    profile = memory_profile.fit_profile(measure)
    assert calls == [1, 2, 4] and profile.micro_batches == (1, 2, 4) and profile.label == ""
    assert profile.activation_bytes_per_example == pytest.approx(800)
    assert profile.activation_intercept_bytes == pytest.approx(400)
    assert profile.other_bytes_per_example == pytest.approx(100)
    assert profile.other_bytes == pytest.approx(200)
    assert profile.optimizer_bytes_per_example == pytest.approx(200)
    assert profile.optimizer_peak_bytes == pytest.approx(6000)
    assert (profile.floor_bytes, profile.gradient_bytes, profile.method) == (4000, 1000, "cpu-tracker")
    assert profile.predict_peak(8) == 4600 + 900 * 8  # a size it never saw


def test_fit_profile_with_exactly_two_sizes_fits_both_lines() -> None:
    profile = memory_profile.fit_profile(_phases, (2, 4), label="two")
    assert profile.activation_bytes_per_example == pytest.approx(800)
    assert profile.optimizer_bytes_per_example == pytest.approx(200)  # a line through 6400 and 6800
    assert profile.optimizer_peak_bytes == pytest.approx(6000)
    assert profile.label == "two"


def test_fit_profile_reads_an_optimizer_peak_from_step_memory() -> None:
    """b = 1 holds almost no activations: it is the optimizer step's peak, a constant 6200."""
    profile = memory_profile.fit_profile(_step, (1, 2, 4))
    assert profile.optimizer_peak_bytes == 6200 and profile.optimizer_bytes_per_example == 0
    assert profile.activation_bytes_per_example == pytest.approx(800)
    assert profile.activation_intercept_bytes == pytest.approx(400)
    assert profile.optimizer_peak(16) == 6200


def test_fit_profile_without_an_optimizer_peak_from_step_memory() -> None:
    profile = memory_profile.fit_profile(_step, (2, 4))
    assert profile.optimizer_peak_bytes == 0 and profile.optimizer_bytes_per_example == 0
    assert profile.predict_peak(8) == 4600 + 900 * 8


def test_fit_profile_with_mixed_step_and_phase_memory() -> None:
    """A StepMemory that peaks in the forward pass binds there; b = 1 (a PhaseMemory) does not."""
    profile = memory_profile.fit_profile(lambda b: _phases(b) if b == 1 else _step(b), (1, 2, 4))
    assert profile.activation_bytes_per_example == pytest.approx(800)
    assert profile.activation_intercept_bytes == pytest.approx(400)
    assert profile.optimizer_peak_bytes == 6200


def test_fit_profile_checks_that_the_floor_stays_put() -> None:
    # 2% more optimizer state at b = 2: a different model or optimizer
    with pytest.raises(ValueError, match="floor changed"):
        memory_profile.fit_profile(lambda b: _phases(b, 2000 + 80 * (b == 2)), (1, 2, 4))
    # 0.5% is measurement noise
    profile = memory_profile.fit_profile(lambda b: _phases(b, 2000 + 20 * (b == 2)), (1, 2, 4))
    assert profile.floor_bytes == 4020


def test_fit_profile_refuses_a_result_without_peak_bytes() -> None:
    class BreakdownOnly:
        breakdown = _forward(2)

    with pytest.raises(TypeError, match="StepMemory or PhaseMemory"):
        memory_profile.fit_profile(lambda b: BreakdownOnly(), (1, 2))


def test_fit_profile_names_micro_batches_in_its_error() -> None:
    with pytest.raises(ValueError, match=r"^micro_batches\[i\] must"):
        memory_profile.fit_profile(_phases, (0, 2))


def test_profile_per_example_terms_and_defaults() -> None:
    # hand arithmetic in MiB: 100 + 2 + 1 * 4 + 10 * 4 and 110 + 3 * 4
    assert _profile(other_bytes_per_example=1 * MiB).forward_peak(4) == 146 * MiB
    assert _profile(optimizer_bytes_per_example=3 * MiB).optimizer_peak(4) == 122 * MiB
    assert PLAIN.micro_batches == () and PLAIN.label == ""
    with pytest.raises(ValueError, match="^b must"):
        PLAIN.activations(0)
    with pytest.raises(ValueError, match="^b must"):
        PLAIN.optimizer_peak(0)


def test_binding_phase_on_a_tie_is_forward() -> None:
    # forward 100 + 10 * 2 = 120 MiB = the optimizer step's 120 MiB
    tie = _profile(other_bytes=0.0, optimizer_peak_bytes=120 * MiB)
    assert tie.forward_peak(2) == tie.optimizer_peak(2) == 120 * MiB
    assert tie.binding_phase(2) == "forward"


def test_crossover_where_the_phase_peaks_meet() -> None:
    """Each crossover is checked against the phase peaks themselves at that micro-batch."""
    with_other = _profile(other_bytes_per_example=2 * MiB, optimizer_peak_bytes=138 * MiB)
    assert with_other.crossover == pytest.approx(3.0)  # 102 + 12 b = 138
    assert with_other.forward_peak(3) == with_other.optimizer_peak(3)
    with_intercept = _profile(activation_intercept_bytes=4 * MiB, optimizer_peak_bytes=136 * MiB)
    assert with_intercept.crossover == pytest.approx(3.0)  # 106 + 10 b = 136
    assert with_intercept.forward_peak(3) == with_intercept.optimizer_peak(3)
    assert _profile(activation_bytes_per_example=0.0).crossover == math.inf  # both flat
    slow = memory_profile.MemoryProfile(
        floor_bytes=100, gradient_bytes=0, other_bytes=0.0, other_bytes_per_example=0.0,
        activation_bytes_per_example=0.5, activation_intercept_bytes=0.0, optimizer_peak_bytes=101.0,
        optimizer_bytes_per_example=0.0, method="cpu-tracker")
    assert slow.crossover == pytest.approx(2.0)  # 100 + b / 2 = 101 at b = 2


@pytest.mark.parametrize("obj", [
    PLAIN,
    planner.Plan(4, 8, False, 1, "r"),
    estimates.Estimate("e", 1.0, 1, "x"),
    estimates.RemedyFloor("r", 1.0, 0.0),
], ids=lambda o: type(o).__name__)
def test_result_objects_are_frozen(obj: object) -> None:
    name = next(iter(vars(obj)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(obj, name, None)


def test_plan_describe_and_budget_default() -> None:
    plan = planner.Plan(4, 8, False, 2**30, "r")
    assert plan.budget_bytes == 0.0
    assert plan.describe() == "4 x 8 (predicted peak 1.0 GiB)"  # exactly 1 GiB is shown in GiB
    ckpt = planner.Plan(8, 4, True, 118 * MiB, "r")
    assert ckpt.describe() == "8 x 4, checkpointed (predicted peak 118.0 MiB)"


def test_recommend_reason_with_accumulation() -> None:
    plan = planner.recommend(150 * MiB, 32, PLAIN, CKPT)
    assert plan.reason == ("Micro-batch 4: it is the largest micro-batch from 1 up, dividing 32, that fits "
                           "without checkpointing, so accumulate 8 micro-steps and spend no recompute "
                           "(predicted peak 142.0 MiB of 150.0 MiB). Rule step 4: "
                           + planner.DECISION_RULE[3])
    assert plan.budget_bytes == 150 * MiB and plan.describe() == "4 x 8 (predicted peak 142.0 MiB)"


def test_recommend_a_peak_equal_to_the_budget_fits() -> None:
    plan = planner.recommend(142 * MiB, 32, PLAIN)  # 102 + 10 * 4 = 142 MiB exactly
    assert (plan.micro_batch, plan.predicted_peak_bytes) == (4, 142 * MiB)


def test_recommend_min_micro_batch_equal_to_the_effective_batch() -> None:
    # one pass of 32: no gradients alive yet at the forward peak, 100 + 2 + 320 - 25 = 397 MiB
    plan = planner.recommend(1.5 * 2**30, 32, PLAIN, min_micro_batch=32)
    assert (plan.micro_batch, plan.accumulation_steps, plan.predicted_peak_bytes) == (32, 1, 397 * MiB)
    assert plan.reason == ("Micro-batch 32: the whole effective batch fits in one pass, so there is nothing "
                           "to accumulate (predicted peak 397.0 MiB of 1.5 GiB). Rule step 4: "
                           + planner.DECISION_RULE[3])


def test_recommend_reason_with_checkpointing() -> None:
    plan = planner.recommend(130 * MiB, 32, PLAIN, CKPT, min_micro_batch=8)
    assert plan.reason == ("Micro-batch 8 with checkpointing: without it even micro-batch 8 would peak at "
                           "182.0 MiB, over the 130.0 MiB budget; checkpointing brings micro-batch 8 to "
                           "118.0 MiB, and 4 accumulation steps make the batch of 32. Rule step 5: "
                           + planner.DECISION_RULE[4])
    assert type(plan.accumulation_steps) is int and plan.accumulation_steps == 4


def _refusal(*args: object, **kwargs: object) -> str:
    with pytest.raises(ValueError, match="^Nothing fits") as info:
        planner.recommend(*args, **kwargs)
    return str(info.value)


def test_recommend_refusal_names_each_prediction() -> None:
    # budget = floor: the floor fits; micro-batch 1 needs 112 MiB plain, and checkpointed its
    # forward peak (104 MiB) is below the optimizer step's 110 MiB, which alone is over the budget
    msg = _refusal(100 * MiB, 32, PLAIN, CKPT)
    assert ("the floor fits, but even micro-batch 1 does not (predicted 112.0 MiB without "
            "checkpointing, 110.0 MiB with it), and the optimizer step alone peaks at "
            "110.0 MiB. Accumulation") in msg
    assert f"lower the floor. Rule step 2: {planner.DECISION_RULE[1]} Remedies" in msg
    msg = _refusal(105 * MiB, 32, PLAIN)
    assert "even micro-batch 1 does not (predicted 112.0 MiB), and the optimizer step" in msg
    msg = _refusal(90 * MiB, 32, PLAIN, CKPT)
    assert ("is 100.0 MiB, and the budget is below the floor itself. Accumulation and "
            "checkpointing only shrink activations; they never lower the floor. Rule step 2: ") in msg
    # a single candidate size, taken in one pass (no gradients yet): 397 MiB; the optimizer step
    # (110 MiB) fits, so the minimum micro-batch is what stops it (rule step 3)
    msg = _refusal(300 * MiB, 32, PLAIN, min_micro_batch=32)
    assert "even micro-batch 32 does not (predicted 397.0 MiB). " in msg
    assert (f"Rule step 3: {planner.DECISION_RULE[2]} A minimum below 32 may fit, at the cost of "
            "throughput; otherwise shrink the model state.") in msg
    # the floor and the optimizer step fit, micro-batch 1 does not, and no minimum is to blame
    cheap_step = _profile(optimizer_peak_bytes=101 * MiB)
    msg = _refusal(105 * MiB, 32, cheap_step)
    assert "optimizer step alone" not in msg and "Rule step" not in msg
    assert "Even one example's activations do not fit beside the floor; shrink the model state." in msg


def test_korthikanti_estimate_by_hand() -> None:
    """sbh(34 + 5as/h) bytes per layer in 16-bit with 1-byte dropout masks; in fp32 without
    dropout: 64 sbh + 4 as^2 b (2 sbh and 5 as^2 b of masks and dropout output go); with
    dropout 66 sbh + 9 as^2 b; full recompute keeps a 4 sbh input per layer."""
    s, h, a, n, b = 8, 16, 2, 3, 2
    sbh, as2b = s * b * h, a * s * s * b  # 256 and 256
    no_dropout = GPTConfig(seq_len=s, d_model=h, n_heads=a, n_layers=n, dropout=0.0)
    dropout = GPTConfig(seq_len=s, d_model=h, n_heads=a, n_layers=n, dropout=0.1)
    assert formulas.korthikanti_activation_bytes(no_dropout, b, recompute=False) == n * (64 * sbh + 4 * as2b)
    assert formulas.korthikanti_activation_bytes(dropout, b, recompute=False) == n * (66 * sbh + 9 * as2b)
    est = {e.name: e for e in estimates.popular_estimates(no_dropout, 1000, b, 100_000, checkpointed=False)}
    korth = est["16 B/param + Korthikanti (sbh(34 + 5as/h) per layer)"]
    assert korth.predicted_bytes == 16_000 + 3 * 17_408
    assert korth.leaves_out.endswith("the gradient of the logits, optimizer temporaries")
    est = {e.name: e for e in estimates.popular_estimates(no_dropout, 1000, b, 100_000, checkpointed=True)}
    korth = est["16 B/param + Korthikanti (full recompute, 2sbh per layer)"]
    assert korth.predicted_bytes == 16_000 + n * 4 * sbh
    assert korth.leaves_out.endswith(
        "the gradient of the logits, one block's recomputed internals during backward, optimizer temporaries")


def test_remedy_floors_default_workers_and_every_row() -> None:
    rows = {r.remedy: r.floor_bytes for r in estimates.remedy_floors(100, 100, 200)}
    assert rows == {
        "Adam, fp32 (measured)": 400,
        "SGD with momentum (one buffer)": 300,
        "SGD, no momentum (no state)": 200,
        estimates.MIXED_PRECISION: 400,
        estimates.PURE_BF16: 200,
        "bf16 Adam state (fp32 weights and gradients)": 300,
        estimates.EIGHT_BIT: 250,
        "optimizer state offloaded to CPU": 200,
        "optimizer state sharded over 2 workers (ZeRO-1)": 300,
        "persistent state sharded over 2 workers (FSDP / ZeRO-3)": 200,
        "optimizer state sharded over 4 workers (ZeRO-1)": 250,
        "persistent state sharded over 4 workers (FSDP / ZeRO-3)": 100,
    }


@pytest.mark.parametrize(("args", "name"), [
    ((0, 100, 200), "parameters"), ((100, 0, 200), "gradients"), ((100, 100, 0), "optimizer_state"),
])
def test_remedy_floors_names_the_bad_argument(args: tuple[int, int, int], name: str) -> None:
    with pytest.raises(ValueError, match=f"^{name} must"):
        estimates.remedy_floors(*args)
    with pytest.raises(ValueError, match=r"^workers\[i\] must"):
        estimates.remedy_floors(100, 100, 200, workers=(2, 0))


def test_gb_is_decimal() -> None:
    assert planner.GB == 10**9  # the explainer's gigabytes are decimal


# -- one rule, stated the same way everywhere (issue 21) ---------------------------------------
def test_decision_rule_is_numbered_and_ends_with_its_corollary() -> None:
    text = planner.decision_rule()
    for i, step in enumerate(planner.DECISION_RULE, 1):
        assert f"{i}. {step}" in text
    assert text.endswith(planner.RULE_COROLLARY)
    assert "min_micro_batch" in planner.DECISION_RULE[2] and "03 §7" in planner.DECISION_RULE[2]
    assert "no FLOPs" in planner.DECISION_RULE[3] and "Only if none fits" in planner.DECISION_RULE[4]
    for note in planner.RULE_REFINEMENTS:  # between the steps and the corollary
        assert text.index(planner.DECISION_RULE[-1]) < text.index(note) < text.index(planner.RULE_COROLLARY)


def test_the_refinements_name_selective_checkpointing_and_sharded_accumulation() -> None:
    """Issue 37: the rule missed selective checkpointing (Korthikanti; Transformers' every_n_layers) and
    the all-gather every extra micro-step costs under FSDP / ZeRO-3, each with the lesson that measures it."""
    selective, sharded = planner.RULE_REFINEMENTS
    assert "70%" in selective and "lesson 02 §5" in selective and "every_n_layers" in selective
    assert "all-gathers" in sharded and "FSDP" in sharded and "lesson 07" in sharded


@pytest.mark.parametrize("notebook", ["00_start_here.ipynb", "06_combine_and_choose.ipynb"])
def test_lessons_restate_the_refinements_word_for_word(notebook: str) -> None:
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "notebooks" / notebook
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    markdown = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    for note in planner.RULE_REFINEMENTS:
        assert note in markdown, (notebook, note)


@pytest.mark.parametrize("notebook", ["06_combine_and_choose.ipynb", "09_plan_your_model.ipynb"])
def test_lessons_restate_the_rule_word_for_word(notebook: str) -> None:
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "notebooks" / notebook
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    markdown = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    for step in (*planner.DECISION_RULE, planner.RULE_COROLLARY):
        assert step in markdown, (notebook, step)


def test_k1_forward_peak_follows_the_accumulation_line_less_the_gradients() -> None:
    """PLANNER BUG (lesson 00): a one-step line fitted where the one-step peak sits at the end of backward
    grows too slowly; K = 1 at a large micro-batch must follow the K >= 2 line less the gradients.

    Worked by hand: floor 1,000 (of it gradients 300), activations 100 per example, no other; a one-step
    line 1,200 + 10 b. At b = 50: K >= 2 peak 1,000 + 5,000 = 6,000; less the gradients 5,700; the
    one-step line says 1,700. The larger, 5,700, is the K = 1 peak (the fix; before it, 1,700). At
    b = 2: 1,200 - 300 = 900, the floor 1,000, the one-step line 1,220: the one-step line holds.
    """
    p = memory_profile.MemoryProfile(
        floor_bytes=1000, gradient_bytes=300, other_bytes=0, other_bytes_per_example=0,
        activation_bytes_per_example=100, activation_intercept_bytes=0, optimizer_peak_bytes=1100,
        optimizer_bytes_per_example=0, method="hand", single_step_bytes=1200,
        single_step_bytes_per_example=10)
    assert p.forward_peak(50, accumulation_steps=2) == 6000
    assert p.forward_peak(50, accumulation_steps=1) == 5700
    assert p.forward_peak(2, accumulation_steps=1) == 1220
    assert p.predict_peak(2, accumulation_steps=1) == 1220
    no_line = dataclasses.replace(p, single_step_bytes=0, single_step_bytes_per_example=0)
    assert no_line.forward_peak(2, accumulation_steps=1) == 1000  # the floor, once every gradient exists


def test_recommend_skips_a_candidate_that_fails_its_check() -> None:
    """A candidate the fit says fits but the check puts over the budget is skipped; the next one is tried.

    The profile predicts 1,000 + 10 b for every size, so with a budget of 1,200 it says 16 fits
    (1,160). The check says 16 x 2 peaks at 1,300 (over) and 8 x 4 at 1,150 (fits): the plan is 8 x 4,
    never a refusal.
    """
    p = _profile(floor_bytes=1000, gradient_bytes=0, other_bytes=0, other_bytes_per_example=0,
                 activation_bytes_per_example=10, activation_intercept_bytes=0, optimizer_peak_bytes=0,
                 optimizer_bytes_per_example=0)
    checked = {16: 1300, 8: 1150, 4: 1100, 2: 1050, 1: 1020}
    calls = []

    def verify(b: int, k: int, ckpt: bool) -> int:
        calls.append((b, k, ckpt))
        return checked[b]

    plan = planner.recommend(1200, 32, p, min_micro_batch=1, verify=verify)
    assert (plan.micro_batch, plan.accumulation_steps, plan.checkpoint) == (8, 4, False)
    assert calls == [(16, 2, False), (8, 4, False)]  # 32 is over by the fit itself: never checked
    assert "16 x 2 was predicted at" in plan.reason and "checked at" in plan.reason
    with pytest.raises(ValueError, match="Skipped"):
        planner.recommend(1200, 32, p, min_micro_batch=16, verify=verify)
