"""helpers.plan.planner (lesson 06): the planner's rule, its reasons and its refusals.

The planner is tested on hand-made profiles (`tests/support/profiles.py`). The profiles themselves
(`helpers.measure.memory_profile`) are tested in `tests/measure/test_memory_profile.py`, the
estimators and remedies (`helpers.plan.estimates`) in `tests/plan/test_estimates.py`.
"""

from __future__ import annotations

import dataclasses

import pytest
from support.profiles import CKPT, PLAIN, MiB, hand_profile

from helpers.plan import estimates, planner


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


# -- killing the survivors of the mutation run (issue 16) --------------------------------------
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
    cheap_step = hand_profile(optimizer_peak_bytes=101 * MiB)
    msg = _refusal(105 * MiB, 32, cheap_step)
    assert "optimizer step alone" not in msg and "Rule step" not in msg
    assert "Even one example's activations do not fit beside the floor; shrink the model state." in msg


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


def test_recommend_skips_a_candidate_that_fails_its_check() -> None:
    """A candidate the fit says fits but the check puts over the budget is skipped; the next one is tried.

    The profile predicts 1,000 + 10 b for every size, so with a budget of 1,200 it says 16 fits
    (1,160). The check says 16 x 2 peaks at 1,300 (over) and 8 x 4 at 1,150 (fits): the plan is 8 x 4,
    never a refusal.
    """
    p = hand_profile(floor_bytes=1000, gradient_bytes=0, other_bytes=0, other_bytes_per_example=0,
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
