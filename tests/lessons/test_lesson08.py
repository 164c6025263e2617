"""Tests of helpers.lessons.lesson08: the follow-ups quote the ledger, the quiz, the widget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers.ledger import claim_lab, claims, review
from helpers.lessons import lesson08

FIGURES = {"C11": {"extra_share_of_step": 0.331}, "C24": {"flops_difference": 0.004}}
NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "08_review.ipynb"


def _ledger() -> review.Ledger:
    rows = [review.Row(c, True, float(i + 1), "u", "", 0.0, figures=FIGURES.get(c.id, {}))
            for i, c in enumerate(claims.CLAIMS)]
    return review.Ledger(rows, [], "cpu", torch.__version__, "small", "cpu-tracker")


def _markdown_cells() -> list[str]:
    cells = json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]


def test_followups_use_the_ledgers_numbers() -> None:
    ledger = _ledger()
    answers = lesson08.followup_answers(ledger)
    assert len(answers) == 3
    c13 = ledger.row("C13").value
    assert f"{c13:.1e}" in answers["Is accumulation exactly a bigger batch?"]
    c11 = ledger.row("C11").value
    assert f"{c11:.2f} of one forward of the checkpointed blocks" in answers["Can the two be combined?"]


def test_interview_answer_is_at_most_30_words_and_quotes_the_ledger() -> None:
    ledger = _ledger()
    answer = lesson08.interview_answer(ledger)
    assert lesson08.word_count(answer) <= lesson08.INTERVIEW_WORDS == 30, answer
    assert f"{ledger.row('C09').value:.1f}x less saved memory" in answer and "+33% FLOPs" in answer
    bare = review.Ledger([review.Row(c, True, 1.0, "u", "", 0.0) for c in claims.CLAIMS], [], "cpu",
                         torch.__version__, "small", "cpu-tracker")
    with pytest.raises(ValueError, match="extra_share_of_step"):
        lesson08.interview_answer(bare)  # a row without the measured figure is an error, not a typed number


def test_cheat_sheet_numbers_come_from_the_rows_they_name() -> None:
    ledger = _ledger()
    rows = lesson08.cheat_sheet_numbers(ledger)
    assert len(rows) >= 10
    for _, measured, ids in rows:
        first = ids.split(",")[0].strip()
        value = ledger.row(first).value
        specs = (".0f", ".1f", ".2f", ".4f", ".1e")
        assert any(f"{value:{spec}}" in measured for spec in specs), (ids, measured)
    assert "+33% of the step's FLOPs" in dict((r[2], r[1]) for r in rows)["C11"]


def test_the_notebook_holds_the_quiz_and_the_interview_path_as_markdown() -> None:
    """A saved notebook without outputs shows the quiz (answers folded) and the two-hour path."""
    markdown = _markdown_cells()
    assert lesson08.quiz_markdown() in markdown, "re-generate 08's quiz cell from lesson08.quiz_markdown()"
    quiz = lesson08.quiz_markdown()
    for q in lesson08.QUIZ:
        question, answer = quiz.split(f"**{q.id}.** {q.prompt}", 1)[1].split("<details>", 1)
        assert all(o in question for o in q.options)
        assert q.explanation in answer.split("</details>", 1)[0]
    assert any(lesson08.interview_path_markdown() in m for m in markdown)
    assert 110 <= sum(m for *_, m in lesson08.INTERVIEW_PATH) <= 130  # about two hours
    assert [n for n, *_ in lesson08.INTERVIEW_PATH] == ["01", "02", "03", "04", "06", "08"]


def test_which_one_first_quotes_the_planners_rule() -> None:
    """Lesson 08's answer and lesson 06's planner state one rule (issue 21), from one home."""
    from helpers.plan import planner

    answer = lesson08.followup_answers(_ledger())["Which one first?"]
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
    lab = claim_lab.Lab(torch.device("cpu"))
    scaled, raw = lesson08.accumulation_check(2, 3, lab)
    assert scaled.max_rel <= 1e-4 and raw.norm_ratio == pytest.approx(3.0, rel=1e-3)
    assert lesson08.explore_accumulation(2, 3, lab) is None
    out = capsys.readouterr().out
    assert "effective batch B x K = 2 x 3 = 6" in out and "3.000 = K" in out


def test_show_quiz_leaves_a_sentence_in_a_saved_notebook(monkeypatch: pytest.MonkeyPatch) -> None:
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, raw=False: shown.append(obj))
    box = lesson08.show_quiz()
    assert len(box.children) == len(lesson08.QUIZ)
    assert "run the notebook" in shown[0]["text/plain"] and "VBox" not in shown[0]["text/plain"]
