"""Tests of helpers.lessons.lesson08: the follow-ups quote the ledger, the quiz, the widget."""

from __future__ import annotations

import pytest
import torch

from helpers import review
from helpers.lessons import lesson08


def test_followups_use_the_ledgers_numbers() -> None:
    rows = [review.Row(c, True, float(i + 1), "u", "", 0.0) for i, c in enumerate(review.CLAIMS)]
    ledger = review.Ledger(rows, [], "cpu", torch.__version__, "small", "cpu-tracker")
    answers = lesson08.followup_answers(ledger)
    assert len(answers) == 3
    c13 = ledger.row("C13").value
    assert f"{c13:.1e}" in answers["Is accumulation exactly a bigger batch?"]
    c11 = ledger.row("C11").value
    assert f"{c11:.2f} of one forward of the checkpointed blocks" in answers["Can the two be combined?"]
    assert f"{c11:.2f} of one here" in lesson08.interview_answer(ledger)


def test_which_one_first_quotes_the_planners_rule() -> None:
    """Lesson 08's answer and lesson 06's planner state one rule (issue 21), from one home."""
    from helpers import planner

    rows = [review.Row(c, True, float(i + 1), "u", "", 0.0) for i, c in enumerate(review.CLAIMS)]
    ledger = review.Ledger(rows, [], "cpu", torch.__version__, "small", "cpu-tracker")
    answer = lesson08.followup_answers(ledger)["Which one first?"]
    for i, step in enumerate(planner.DECISION_RULE, 1):
        assert f"{i}. {step}" in answer
    assert answer.endswith(planner.RULE_COROLLARY)
    assert "If activations dominate, checkpoint" not in answer
    for claim in ("C05", "C06", "C11", "C24", "C26"):
        assert f"{claim})" in answer


def test_quiz_answers() -> None:
    assert 6 <= len(lesson08.QUIZ) <= 10
    for q in lesson08.QUIZ:
        assert 0 <= q.answer < len(q.options)
        right = lesson08.check_answer(q.id, q.answer)
        assert right.correct and right.message.startswith("Correct") and f"lesson {q.lesson}" in right.message
        wrong = lesson08.check_answer(q.id, (q.answer + 1) % len(q.options))
        assert not wrong.correct and q.options[q.answer] in wrong.message
    with pytest.raises(ValueError, match="question_id"):
        lesson08.check_answer("Q99", 0)
    with pytest.raises(ValueError, match="option index"):
        lesson08.check_answer("Q1", 7)
    with pytest.raises(ValueError, match="option index"):
        lesson08.check_answer("Q1", True)


def test_quiz_widget_builds() -> None:
    box = lesson08.quiz_widget()
    assert len(box.children) == len(lesson08.QUIZ)


def test_explore_widget_prints_the_effective_batch_and_checks(capsys: pytest.CaptureFixture[str]) -> None:
    lab = review.Lab(torch.device("cpu"))
    scaled, raw = lesson08.accumulation_check(2, 3, lab)
    assert scaled.max_rel <= 1e-4 and raw.norm_ratio == pytest.approx(3.0, rel=1e-3)
    assert lesson08.explore_accumulation(2, 3, lab) is None
    out = capsys.readouterr().out
    assert "effective batch B x K = 2 x 3 = 6" in out and "3.000 = K" in out
