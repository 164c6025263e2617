"""Tests of helpers.plan_report: a meta profile's plan, the card and margin, remedies, presets."""

from __future__ import annotations

import pytest

from helpers import plan, planner
from helpers.architectures import param_count
from helpers.meta_profile import Profiler
from helpers.plan_report import margin_line, plan_model, preset_profile, reported_card_bytes
from helpers.presets import parse_budget, preset_spec


def test_block_extrapolation_equals_the_full_profile() -> None:
    build, spec, _ = preset_spec("gpt2-small", 64)
    full = Profiler(build, spec, target="cuda")
    for ck in ("none", "blocks"):
        fast = preset_profile("gpt2-small", 64, ck)
        slow = full.memory_profile(ck, (1, 2))
        for b in (1, 3, 16):
            assert fast.predict_peak(b) == pytest.approx(slow.predict_peak(b), rel=1e-3)
        assert fast.floor_bytes == slow.floor_bytes


def test_a_budget_in_gb_stands_for_a_card_that_reports_gib() -> None:
    """A "24 GB" card reports about 24 GiB: a 10% margin of 24e9 bytes leaves 16% of it free (issue 21)."""
    assert reported_card_bytes(parse_budget("24GB")) == 24 * 2**30
    assert reported_card_bytes(parse_budget("24 GiB")) == 24 * 2**30  # already what it reports
    assert reported_card_bytes(23.5e9) == 23.5e9  # not a whole number of GB: taken as it is
    line = margin_line(24e9, 0.9 * 24e9)
    assert "24.00 GB (22.35 GiB)" in line and "10% of the budget" in line
    free = 1 - 0.9 * 24e9 / (24 * 2**30)
    assert f"{free:.0%} of a card sold as 24 GB" in line and f"{free:.0%}" == "16%"
    assert "--budget 24GiB" in line
    gib = margin_line(24 * 2**30, 0.9 * 24 * 2**30)
    assert "24.00 GiB" in gib and "of a card" not in gib
    assert margin_line(1e9, 1e9).endswith("(no margin)")


def test_report_remedies_save_what_the_hand_count_says() -> None:
    """fp32 Adam is 16 B/param; mixed precision 2 + 2 + 4 + 8 = 16 (no saving), pure bf16 8 (issue 21)."""
    build, spec, cfg = preset_spec("gpt2-small", 64)
    report = plan_model(Profiler(build, spec, target="cuda"), name="gpt2-small", budget_bytes=24e9,
                             effective_batch=8, check=False)
    n = param_count(cfg)
    assert not any(name.startswith("mixed precision") for name in report.remedies)
    assert report.remedies[planner.PURE_BF16] == pytest.approx(8 * n, rel=1e-3)
    assert any(note.startswith(planner.MIXED_PRECISION) and "16 B/param" in note for note in report.notes)


def test_plan_model_chooses_checkpointing_when_needed() -> None:
    build, spec, _ = preset_spec("gpt2-small", 1024)
    prof = Profiler(build, spec, target="cuda")
    plain, ckpt = (prof.memory_profile(ck, (1, 2)) for ck in ("none", "blocks"))
    low, high = ckpt.predict_peak(1, accumulation_steps=8), plain.predict_peak(1, accumulation_steps=8)
    assert low < high
    budget = (low + high) / 2 / 0.9  # plain micro-batch 1 misses, checkpointed fits
    report = plan_model(prof, name="gpt2-small", budget_bytes=budget, effective_batch=8)
    assert report.plan is not None and report.plan.checkpoint
    assert report.checked_peak_bytes == pytest.approx(report.plan.predicted_peak_bytes, rel=0.01)
    assert report.usable_bytes == pytest.approx(0.9 * budget)


LESSON00 = ["--preset", "gpt2-small", "--seq-len", "256", "--budget", "8GiB", "--effective-batch", "32",
            "--min-micro-batch", "4"]


def test_lesson00_command_gives_the_largest_plan_that_fits(capsys: pytest.CaptureFixture[str]) -> None:
    """PLANNER BUG: lesson 00's command printed NO PLAN while a smaller micro-batch fitted.

    Independently of the planner: fresh full profiles of every candidate (B x K, K >= 2 standing for any
    K >= 2) say which fit in 8 GiB less the 10% CUDA margin; the plan must be the largest of them.
    """
    assert plan.main(LESSON00) == 0
    out = capsys.readouterr().out
    assert "NO PLAN" not in out and "PLAN: " in out
    usable = 0.9 * 8 * 2**30
    build, spec, _ = preset_spec("gpt2-small", 256)
    fresh = Profiler(build, spec, target="cuda")
    fits = [b for b in (32, 16, 8, 4)
            if fresh.step(b, accumulation_steps=min(32 // b, 2)).peak_bytes <= usable]
    assert fits, "some micro-batch from 4 up fits in 8 GiB"
    b = fits[0]
    assert f"PLAN: {b} x {32 // b} " in out
