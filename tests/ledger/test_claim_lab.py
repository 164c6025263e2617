"""helpers.ledger.claim_lab (lesson 08): the lab's models are the lessons' own, built once per ledger run."""

from __future__ import annotations

import pytest
import torch

from helpers.ledger import claim_lab, review


def test_headline_claims_run_on_the_lessons_own_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ledger reports the lessons' numbers: C09/C11 on lesson 02's GPT, C08/C25 on 01's (issue 21)."""
    monkeypatch.delenv("LESSONS_SCALE", raising=False)  # `make check` runs beside the tiny notebooks
    from helpers.ledger.claim_lab import LESSON_MODEL_CLAIMS
    from helpers.models.gpt import deep_gpt_setup as gpt_setup
    from helpers.models.gpt import explainer_config

    lab = claim_lab.Lab(torch.device("cpu"), scale="tiny")
    assert lab.lesson_model("01").cfg == explainer_config("tiny")
    assert lab.lesson_model("01") is lab.lesson_model("01")  # built once per ledger run
    assert lab.lesson_model("02").cfg == gpt_setup("tiny")[0]
    with pytest.raises(ValueError, match="lesson"):
        lab.lesson_model("06")
    assert claim_lab.Lab(torch.device("cpu")).scale == "small"  # the CPU's lesson scale
    assert LESSON_MODEL_CLAIMS == {"C08": "01", "C09": "02", "C11": "02", "C25": "01"}
    ledger = review.run_ledger(list(LESSON_MODEL_CLAIMS), progress=False)
    assert ledger.passed, review.format_table(ledger)
    for r in ledger.rows:
        assert f"lesson {LESSON_MODEL_CLAIMS[r.claim.id]}'s model" in r.detail, r.detail
