"""helpers.review: the claims ledger command, its failure handling, and the quiz's answers.

The claims, their checks and the lab they share are tested in `tests/ledger/test_claims.py`,
`test_claim_checks.py`, `test_claim_lab.py` and `test_framework_checks.py`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers.ledger import claim_lab, claims, review
from helpers.ledger.claim_lab import Evidence
from helpers.ledger.claims import Claim

ROOT = Path(__file__).resolve().parents[2]


def _claim(cid: str, run, needs: str = "") -> Claim:  # noqa: ANN001
    return Claim(cid, f"claim {cid}", "03 §2", "a fake check", run, needs=needs)


def _boom(lab: claim_lab.Lab) -> Evidence:
    raise RuntimeError("the instrument broke")


FAKE = (
    _claim("X1", lambda lab: Evidence(True, 1.0, "units", "fine")),
    _claim("X2", _boom),
    _claim("X3", lambda lab: Evidence(False, 0.5, "units", "too small")),
    _claim("X4", lambda lab: Evidence(True, 2.0, "units", "fine")),
    _claim("X5", lambda lab: Evidence(True, 2.0, "units", "fine"), needs="helpers.no_such_lesson"),
)


def test_a_raising_check_is_a_failed_row_and_the_ledger_goes_on() -> None:
    ledger = review.run_ledger(progress=False, claims=FAKE)
    by_id = {r.claim.id: r for r in ledger.rows}
    assert by_id["X1"].passed and by_id["X4"].passed  # X4 ran after the raising X2
    assert not by_id["X2"].passed and by_id["X2"].error == "RuntimeError: the instrument broke"
    assert not by_id["X3"].passed and by_id["X3"].value == 0.5
    assert [c.id for c in ledger.pending] == ["X5"]
    assert not ledger.passed
    table = review.format_table(ledger)
    assert "X2   FAIL" in table and "the instrument broke" in table and "X5   wait" in table
    assert "2 passed, 2 failed, 1 waiting" in table


def test_a_count_of_one_reads_in_the_singular() -> None:
    def shown(value: float, unit: str) -> str:
        return review.format_table(review.run_ledger(progress=False, claims=(
            _claim("X1", lambda lab: Evidence(True, value, unit, "fine")),)))

    assert "1 forward of the checkpointed blocks" in shown(1.0, "forwards of the checkpointed blocks")
    assert "1 micro-batch of activations" in shown(1.0, "micro-batches of activations per micro-step")
    assert "1 sync in 4 micro-steps" in shown(1.0, "syncs in 4 micro-steps")
    assert "1 clip per update" in shown(1.0, "clips per update")
    assert "2 clips per update" in shown(2.0, "clips per update")
    assert "0.998 forwards of" in shown(0.998, "forwards of the checkpointed blocks")
    assert "1 x parameters" in shown(1.0, "x parameters")


def test_main_exit_status(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                          tmp_path: Path) -> None:
    monkeypatch.setattr(review, "CLAIMS", FAKE)
    assert review.main(["--only", "X1,X4", "--no-progress"]) == 0
    assert "2 passed, 0 failed" in capsys.readouterr().out
    assert review.main(["--only", "x3", "--no-progress"]) == 1  # ids are case-insensitive
    assert "X3   FAIL" in capsys.readouterr().out
    md = tmp_path / "ledger.md"
    assert review.main(["--no-progress", "--markdown", str(md)]) == 1
    text = md.read_text()
    headers = ("- device: cpu", f"- torch: {torch.__version__}", "- scale: ", "- memory method: cpu-tracker")
    assert all(h in text for h in headers), text[:300]
    assert "| X2 |" in text and "RuntimeError: the instrument broke" in text and "**FAIL**" in text
    assert review.main(["--only", "C99", "--no-progress"]) == 2
    assert "C99" in capsys.readouterr().err


def test_real_claims_subset_pass_here() -> None:
    ledger = review.run_ledger(["C13", "C14", "C12"], progress=False)
    assert ledger.passed, review.format_table(ledger)
    assert ledger.row("C14").value == pytest.approx(4.0, rel=1e-3)
    assert ledger.row("C13").value <= 1e-4


def test_readme_key_figures_come_from_the_ledger() -> None:
    text = (ROOT / "README.md").read_text()
    block = text.split(review.README_START, 1)[1].split(review.README_END, 1)[0]
    assert "python -m helpers.review --readme README.md" in block
    for c in claims.CLAIMS:
        assert f"| {c.id} | {c.text} | {c.lesson} |" in block, c.id
