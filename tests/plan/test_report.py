"""Tests of helpers.plan.report: a meta profile's plan, the card and margin, remedies, presets.

The preset profiles (`helpers.plan.preset_profiles`) and the peak envelope they are made of
(`helpers.plan.peak_envelope`) are tested in `tests/plan/test_preset_profiles.py` and
`tests/plan/test_peak_envelope.py`.
"""

from __future__ import annotations

import functools
import re

import pytest
from support.architectures import TINY

from helpers.core.data import BatchSpec
from helpers.meta.profiler import Profiler
from helpers.models.architecture_config import param_count
from helpers.models.architectures import CausalLM
from helpers.plan import cli, estimates
from helpers.plan.cards import cublas_workspace_bytes
from helpers.plan.presets import parse_budget, preset_spec
from helpers.plan.report import _count, margin_line, plan_model, reported_card_bytes


def test_a_budget_in_gb_names_what_cards_sold_so_report() -> None:
    """A "24 GB" budget is 24e9 bytes; the line gives the margin's share of 24 GiB and the range that cards
    sold as 24 GB really report (21.96 GiB for an L4 up to 23.99 for an RTX 4090), never "about 24 GiB"
    (issue 39)."""
    assert reported_card_bytes(parse_budget("24GB")) == 24 * 2**30
    assert reported_card_bytes(parse_budget("24 GiB")) == 24 * 2**30  # already what it reports
    assert reported_card_bytes(23.5e9) == 23.5e9  # not a whole number of GB: taken as it is
    line = margin_line(24e9, 0.9 * 24e9)
    assert line.startswith("budget 24 GB (decimal, as cards are sold) = 22.4 GiB, planning within 20.1 GiB")
    assert "10% of the budget" in line and "16% of 24.0 GiB" in line and "reports about" not in line
    assert "cards sold as 24 GB report 22.0 GiB (L4) to 24.0 GiB (RTX4090): --gpu L4" in line
    gib = margin_line(24 * 2**30, 0.9 * 24 * 2**30)
    assert gib.startswith("budget 24.0 GiB, planning within 21.6 GiB") and " GB" not in gib
    assert margin_line(1e9, 1e9).endswith("(no margin)")


def test_report_remedies_save_what_the_hand_count_says() -> None:
    """fp32 Adam is 16 B/param; mixed precision 4 + 4 + 8 = 16 (no saving), pure bf16 8 (issues 21, 37)."""
    build, spec, cfg = preset_spec("gpt2-small", 64)
    report = plan_model(Profiler(build, spec, target="cuda"), name="gpt2-small", budget_bytes=24e9,
                             effective_batch=8, check=False)
    n = param_count(cfg)
    assert not any(name.startswith("mixed precision") for name in report.remedies)
    assert report.remedies[estimates.PURE_BF16] == pytest.approx(8 * n, rel=1e-3)
    assert any(note.startswith(estimates.MIXED_PRECISION) and "16 B/param" in note for note in report.notes)


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
    assert cli.main(LESSON00) == 0
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


def test_the_report_prints_one_byte_convention_and_whole_column_names(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Every size in the report is format_bytes' (one decimal), the columns are not cut, and a small
    model's parameter count is not "0.000 B" (issue 24)."""
    assert (_count(1_235_814_400), _count(124_439_808), _count(12_345), _count(850)) == (
        "1.24 B", "124.4 M", "12.3 k", "850")
    assert cli.main(["--preset", "gpt2-small", "--seq-len", "64", "--budget", "1GiB",
                      "--effective-batch", "8", "--target", "cpu"]) == 0
    text = capsys.readouterr().out
    sizes = re.findall(r"(\d+(?:\.\d+)?) (?:KiB|MiB|GiB)\b", text)
    assert sizes and all(re.fullmatch(r"\d+\.\d", n) for n in sizes), sorted(set(sizes))[:5]
    assert "optimizer state" in text and "optimizer_s " not in text and "0.000 B" not in text
    assert re.search(r" \d+ bytes", text) is None and " GB" not in text  # a GiB budget: no decimal GB


def test_a_cpu_plan_says_which_thread_count_it_holds_for() -> None:
    """Kernels' own CPU buffers are per thread: the plan names the count it measured them at."""
    import torch

    build, spec = functools.partial(CausalLM, TINY["gpt2"]), BatchSpec.lm(64, 4096)
    before = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            report = plan_model(Profiler(build, spec, target="cpu"), name="tiny", budget_bytes=8e9,
                                effective_batch=4, checkpoint="none", check=False)
            assert report.cpu_threads == n and report.to_dict()["cpu_threads"] == n
            assert f"planned for {n} intra-op thread" in report.table()
        cuda = plan_model(Profiler(build, spec, target="cuda"), name="tiny", budget_bytes=8e9,
                          effective_batch=4, checkpoint="none", check=False)
        assert cuda.to_dict()["cpu_threads"] is None and "intra-op thread" not in cuda.table()
        # the cuBLAS workspaces: planned beside a CUDA target's tensors (sm80: 2 x 8.125 MiB), none on CPU
        assert report.workspace_bytes == 0 and report.to_dict()["cuda_workspace_bytes"] == 0
        plan = cuda.to_dict()["plan"]
        assert cuda.workspace_bytes == cublas_workspace_bytes(80, "") == 2 * (8 * 2**20 + 128 * 1024)
        assert plan["predicted_allocated_bytes"] == plan["predicted_peak_bytes"] + cuda.workspace_bytes
    finally:
        torch.set_num_threads(before)


def test_the_report_never_prints_a_negative_size_per_example() -> None:
    """Each mode's "each example adds" is the peak's growth per example between two full meta steps around
    the plan's B (K = 2); the fit's activation and other slopes alone can be negative (GPT-2 small, fp32,
    128 tokens: other is about -245 MiB per example), and their sum said 52 MiB where full steps grow by
    about 233 MiB per example, so neither is printed as the growth (issue 39)."""
    build, spec, _ = preset_spec("gpt2-small", 128)
    profiler = Profiler(build, spec, "adam", target="cuda", precision="fp32")
    report = plan_model(profiler, name="gpt2-small", budget_bytes=parse_budget("80GiB"), effective_batch=8)
    plain = report.profiles["plain"]
    assert plain.other_bytes_per_example < 0  # the case this guards: a slope that is negative alone
    text = report.table()
    assert re.search(r"-\d+(?:\.\d+)? (?:B|KiB|MiB|GiB)\b", text) is None
    b = report.plan.micro_batch
    lo, hi = max(b, 2) // 2, max(b, 2)
    grown = (profiler.step(hi, accumulation_steps=2).peak_bytes
             - profiler.step(lo, accumulation_steps=2).peak_bytes) / (hi - lo)
    line = rf"plain: floor [^,]+, each example adds (\d+\.\d) MiB to the peak \(from B = {lo} to {hi}"
    printed = re.search(line, text)
    assert printed and abs(float(printed[1]) * 2**20 - grown) <= 2**20 / 20, (printed, grown / 2**20)
