"""helpers.measure.memory_profile (lesson 06): the phase profile's arithmetic and `fit_profile`.

`fit_profile` is tested on a model that is not the lesson's GPT: a residual MLP, measured for real
with `measure_phases` and with `measure_step`, then asked for sizes it never saw; and on synthetic
jobs whose every byte is chosen by hand. The arithmetic is checked on hand-made profiles
(`tests/support/profiles.py`).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from support.profiles import CKPT, PLAIN, MiB, hand_profile
from support.updates import mlp_adam, mlp_update

from helpers.measure import memory_profile
from helpers.measure.memory import StepMemory, measure_step
from helpers.techniques.phases import PhaseMemory, measure_phases


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
    assert hand_profile(optimizer_bytes_per_example=20 * MiB).crossover == math.inf


def test_profile_per_example_terms_and_defaults() -> None:
    # hand arithmetic in MiB: 100 + 2 + 1 * 4 + 10 * 4 and 110 + 3 * 4
    assert hand_profile(other_bytes_per_example=1 * MiB).forward_peak(4) == 146 * MiB
    assert hand_profile(optimizer_bytes_per_example=3 * MiB).optimizer_peak(4) == 122 * MiB
    assert PLAIN.micro_batches == () and PLAIN.label == ""
    with pytest.raises(ValueError, match="^b must"):
        PLAIN.activations(0)
    with pytest.raises(ValueError, match="^b must"):
        PLAIN.optimizer_peak(0)


def test_binding_phase_on_a_tie_is_forward() -> None:
    # forward 100 + 10 * 2 = 120 MiB = the optimizer step's 120 MiB
    tie = hand_profile(other_bytes=0.0, optimizer_peak_bytes=120 * MiB)
    assert tie.forward_peak(2) == tie.optimizer_peak(2) == 120 * MiB
    assert tie.binding_phase(2) == "forward"


def test_crossover_where_the_phase_peaks_meet() -> None:
    """Each crossover is checked against the phase peaks themselves at that micro-batch."""
    with_other = hand_profile(other_bytes_per_example=2 * MiB, optimizer_peak_bytes=138 * MiB)
    assert with_other.crossover == pytest.approx(3.0)  # 102 + 12 b = 138
    assert with_other.forward_peak(3) == with_other.optimizer_peak(3)
    with_intercept = hand_profile(activation_intercept_bytes=4 * MiB, optimizer_peak_bytes=136 * MiB)
    assert with_intercept.crossover == pytest.approx(3.0)  # 106 + 10 b = 136
    assert with_intercept.forward_peak(3) == with_intercept.optimizer_peak(3)
    assert hand_profile(activation_bytes_per_example=0.0).crossover == math.inf  # both flat
    slow = memory_profile.MemoryProfile(
        floor_bytes=100, gradient_bytes=0, other_bytes=0.0, other_bytes_per_example=0.0,
        activation_bytes_per_example=0.5, activation_intercept_bytes=0.0, optimizer_peak_bytes=101.0,
        optimizer_bytes_per_example=0.0, method="cpu-tracker")
    assert slow.crossover == pytest.approx(2.0)  # 100 + b / 2 = 101 at b = 2


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


# -- killing the survivors of the second mutation run ------------------------------------------
# Hand-made profiles in MiB for the loop with and without `del predictions` (`released`):
# kept: forward 102 + 11 b, optimizer 110 + 3 b; released: forward 102 + 6.5 b, optimizer 120 + b.
RELEASED = hand_profile(activation_bytes_per_example=6 * MiB, other_bytes_per_example=0.5 * MiB,
                        optimizer_peak_bytes=120 * MiB, optimizer_bytes_per_example=1 * MiB)
KEPT = hand_profile(other_bytes_per_example=1 * MiB, optimizer_bytes_per_example=3 * MiB,
                    released=RELEASED)  # type: ignore[arg-type]


def test_keep_output_defaults_to_the_loop_as_written() -> None:
    """Every phase method predicts the kept loop by default and the released one with keep_output=False."""
    assert KEPT.forward_peak(4) == 146 * MiB and KEPT.forward_peak(4, keep_output=False) == 128 * MiB
    assert KEPT.optimizer_peak(4) == 122 * MiB and KEPT.optimizer_peak(4, keep_output=False) == 124 * MiB
    assert KEPT.predict_peak(4) == 146 * MiB and KEPT.predict_peak(4, keep_output=False) == 128 * MiB
    # b = 2: kept forward 124 > optimizer 116; released forward 115 < optimizer 122
    assert KEPT.binding_phase(2) == "forward"
    assert KEPT.binding_phase(2, keep_output=False) == "optimizer"


def test_held_output_bytes_is_the_difference_of_the_two_loops() -> None:
    """held_output_bytes(4) = 146 - 128 MiB; per example 10 + 1 - 6 - 0.5 MiB; both 0 without `released`."""
    assert KEPT.held_output_bytes(4) == 18 * MiB
    assert KEPT.held_output_bytes_per_example == pytest.approx(4.5 * MiB)
    assert PLAIN.released is None and PLAIN.held_output_bytes_per_example == 0.0
    assert PLAIN.held_output_bytes(4) == 0
    assert PLAIN.predict_peak(4, keep_output=False) == PLAIN.predict_peak(4) == 142 * MiB


def test_forward_peak_names_b_in_its_error() -> None:
    """forward_peak(0) is refused with an error that names `b`."""
    with pytest.raises(ValueError, match="^b must be a positive int"):
        PLAIN.forward_peak(0)


def test_a_hand_profile_has_no_one_step_line() -> None:
    """Without a measured one-step line both of its fields are 0, as documented."""
    assert (PLAIN.single_step_bytes, PLAIN.single_step_bytes_per_example) == (0.0, 0.0)


def _record(b: int, acts: int, other: int, optimizer: int, first: int = 0,
            released: PhaseMemory | None = None) -> PhaseMemory:
    """A PhaseMemory of a job with floor 4000 (1000 parameters, 1000 gradients, 2000 Adam state)."""
    fwd = {**_state(), "activations": acts, "other": other}
    opt = {**_state(), "activations": 0, "other": optimizer - 4000}
    fwd_peak = sum(fwd.values())
    peak, breakdown = (fwd_peak, fwd) if fwd_peak >= optimizer else (optimizer, opt)
    return PhaseMemory(peak_bytes=peak, breakdown=breakdown, device="cpu", method="cpu-tracker",
                       forward_peak_bytes=fwd_peak, forward_breakdown=fwd, optimizer_peak_bytes=optimizer,
                       optimizer_breakdown=opt, first_step_peak_bytes=first, released=released)


# The optimizer step binds at the largest size: b = 1 forward 5500 > 5000; b = 2 a tie at 6400;
# b = 4 the optimizer step's 9000, its forward peak (6400) off the line 4600 + 900 b. One-step
# peaks 4800, 5200 (on 4400 + 400 b) and 5000 at b = 4.
_LATE = {1: (1200, 300, 5000, 4800), 2: (2000, 400, 6400, 5200), 4: (2000, 400, 9000, 5000)}


def _late(b: int) -> PhaseMemory:
    return _record(b, *_LATE[b])


def test_fit_profile_lines_through_the_small_sizes_where_the_forward_phase_binds() -> None:
    """Forward and one-step lines go through b = 1 and 2 (a tie binds), not the optimizer-bound b = 4."""
    profile = memory_profile.fit_profile(_late, (1, 2, 4))
    assert profile.activation_bytes_per_example == pytest.approx(800)
    assert profile.activation_intercept_bytes == pytest.approx(400)
    assert profile.other_bytes_per_example == pytest.approx(100)
    assert profile.other_bytes == pytest.approx(200)
    assert profile.forward_peak(3) == 4000 + (200 + 300) + (400 + 2400)
    assert profile.single_step_bytes == pytest.approx(4400)
    assert profile.single_step_bytes_per_example == pytest.approx(400)


def test_fit_profile_raises_the_optimizer_line_to_its_highest_point() -> None:
    """A least-squares optimizer line through 5000, 6400, 9000 is raised to touch 6400 at b = 2."""
    profile = memory_profile.fit_profile(_late, (1, 2, 4))
    assert profile.optimizer_peak(2) == 6400
    for b in (1, 4):
        assert profile.optimizer_peak(b) >= _late(b).optimizer_peak_bytes, b
    assert profile.optimizer_bytes_per_example == pytest.approx(9300 / 7)  # sxy 6200 / sxx 14/3


def test_fit_profile_step_memory_forward_peaks_bind_beside_a_phase_memory() -> None:
    """StepMemory forward peaks at b = 1, 2 set the line; the optimizer-bound PhaseMemory at b = 4 not."""
    def measure(b: int) -> PhaseMemory | StepMemory:
        m = _late(b)
        return m if b == 4 else StepMemory(m.forward_peak_bytes, m.forward_breakdown, "cpu", "cpu-tracker")

    profile = memory_profile.fit_profile(measure, (1, 2, 4))
    assert profile.activation_bytes_per_example == pytest.approx(800)
    assert profile.activation_intercept_bytes == pytest.approx(400)


def test_fit_profile_raises_the_forward_line_to_a_smaller_binding_size() -> None:
    """Line through b = 2, 4 (6400, 8200); b = 1 measured 5700, 200 above it: other_bytes 200 + 200."""
    def measure(b: int) -> StepMemory:
        acts, other = {1: (1200, 500), 2: (2000, 400), 4: (3600, 600)}[b]
        return StepMemory(4000 + acts + other, {**_state(), "activations": acts, "other": other},
                          "cpu", "cpu-tracker")

    profile = memory_profile.fit_profile(measure, (1, 2, 4))
    assert profile.other_bytes_per_example == pytest.approx(100)
    assert profile.other_bytes == pytest.approx(400)
    assert profile.activation_bytes_per_example == pytest.approx(800)
    assert (profile.predict_peak(1), profile.predict_peak(2), profile.predict_peak(4)) == (5700, 6600, 8400)


@pytest.mark.parametrize(("optimizer_at_1", "one_base"), [(4900, 4600), (5000, 4400)])
def test_fit_profile_raises_the_one_step_line_only_above_the_optimizer_step(
        optimizer_at_1: int, one_base: int) -> None:
    """One-step line 4400 + 400 b through b = 2, 4; b = 1's 5000 raises it by 200 only above the optimizer."""
    first = {1: 5000, 2: 5200, 4: 6000}
    optimizer = {1: optimizer_at_1, 2: 5100, 4: 5300}
    profile = memory_profile.fit_profile(
        lambda b: _record(b, 400 + 800 * b, 200 + 100 * b, optimizer[b], first[b]), (1, 2, 4))
    assert profile.single_step_bytes_per_example == pytest.approx(400)
    assert profile.single_step_bytes == pytest.approx(one_base)
    # K = 1 at b = 1: max(5500 - 1000, floor 4000, the one-step line)
    assert profile.forward_peak(1, accumulation_steps=1) == one_base + 400


def test_fit_profile_one_step_line_from_two_sizes() -> None:
    """Two sizes with one-step peaks 5200 and 6000 give the line 4400 + 400 b."""
    first = {2: 5200, 4: 6000}
    profile = memory_profile.fit_profile(
        lambda b: _record(b, 400 + 800 * b, 200 + 100 * b, 5000, first[b]), (2, 4))
    assert profile.single_step_bytes == pytest.approx(4400)
    assert profile.single_step_bytes_per_example == pytest.approx(400)
    assert profile.forward_peak(8, accumulation_steps=1) == 4000 + 1000 + 6800 - 1000  # 10800 > 4400 + 3200


def test_fit_profile_without_one_step_peaks_has_no_one_step_line() -> None:
    """PhaseMemory without first-step peaks: both one-step fields 0, K = 1 is the line less the gradients."""
    profile = memory_profile.fit_profile(_phases, (1, 2, 4))
    assert (profile.single_step_bytes, profile.single_step_bytes_per_example) == (0.0, 0.0)
    assert profile.forward_peak(4, accumulation_steps=1) == 8200 - 1000


def test_fit_profile_fits_the_released_loop() -> None:
    """Released records (activations 400 + 500 b) give `released`; the kept loop holds 300 B per example."""
    def measure(b: int) -> PhaseMemory:
        released = _record(b, 400 + 500 * b, 200 + 100 * b, 5000)
        return _record(b, 400 + 800 * b, 200 + 100 * b, 5000, released=released)

    profile = memory_profile.fit_profile(measure, (1, 2, 4))
    assert profile.released is not None
    assert profile.released.activation_bytes_per_example == pytest.approx(500)
    assert profile.held_output_bytes_per_example == pytest.approx(300)
    assert profile.predict_peak(4, keep_output=False) == 4000 + 600 + 2400
    assert profile.held_output_bytes(4) == 1200
