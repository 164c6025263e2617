"""Tests of helpers.lessons.lesson09: the predicted peak against the real run, the widget, exercises."""

from __future__ import annotations

import functools

import pytest

from helpers.core.data import BatchSpec
from helpers.lessons import lesson09
from helpers.meta.profiler import Profiler
from helpers.models.architecture_config import param_count
from helpers.models.gpt import GPT
from helpers.plan.planner import recommend
from helpers.plan.preset_profiles import preset_profile
from helpers.plan.presets import PRESETS


def test_predicted_peak_matches_the_real_check_run() -> None:
    cfg = lesson09.check_config("tiny")
    real = Profiler(functools.partial(GPT, cfg), BatchSpec.lm(cfg.seq_len, cfg.vocab_size), device="cpu")
    measured = real.step(lesson09.CHECK_MICRO_BATCH).peak_bytes
    assert lesson09.predicted_peak_bytes("tiny") == pytest.approx(measured, rel=0.01)


def test_show_plan_prints_the_effective_batch(capsys: pytest.CaptureFixture[str]) -> None:
    lesson09.show_plan("gpt2-small", 256, 2, 4, True, 24.0)
    out = capsys.readouterr().out
    assert "effective batch B x K = 2 x 4 = 8" in out


def test_estimators_figure_draws_the_card_as_it_reports_and_the_plan_limit() -> None:
    """--budget 24GB (24e9 bytes) is a card sold as 24 GB: it reports at most 24 GiB (dashed), and the planner
    plans within 24e9 less the 10% margin = 21.6e9 bytes = 20.1 GiB (dotted). A budget in GiB is the card."""
    import matplotlib.pyplot as plt

    profiles = {"gpt2-small": {"none": preset_profile("gpt2-small", 128, "none")}}
    n = param_count(PRESETS["gpt2-small"])
    fig = lesson09.estimators_figure(profiles, n, budget_bytes=24e9)
    (ax,) = fig.axes
    assert sorted(line.get_ydata()[0] for line in ax.lines) == pytest.approx([21.6e9 / 2**30, 24.0])
    labels = [t.get_text() for t in ax.texts]
    assert labels == ["card: at most 24.0 GiB\n(sold as 24 GB)", "plan within 20.1 GiB"]
    plt.close(fig)
    fig = lesson09.estimators_figure(profiles, n, budget_bytes=24 * 2**30, cuda_margin=0.0)
    assert [t.get_text() for t in fig.axes[0].texts] == ["card: 24.0 GiB", "plan within 24.0 GiB"]
    plt.close(fig)


def test_exercise_checkers() -> None:
    floor = preset_profile("llama-3.1-8b", 4096, "none").floor_bytes / 1e9
    assert lesson09.check_exercise_1(floor).startswith("Correct")
    assert lesson09.check_exercise_1(10.0).startswith("Not yet")
    assert "number" in lesson09.check_exercise_1("lots")
    plain, ckpt = preset_profile("gpt2-xl", 1024, "none"), preset_profile("gpt2-xl", 1024, "blocks")
    p = recommend(36e9, 32, plain, ckpt)
    assert lesson09.check_exercise_2(p.micro_batch, p.accumulation_steps, p.checkpoint).startswith("Correct")
    assert lesson09.check_exercise_2(32, 1, False).startswith(("Not yet", "Close"))
    saved = lesson09.per_example_bytes(plain) - lesson09.per_example_bytes(ckpt)
    assert saved > 0
    assert lesson09.check_exercise_3(saved).startswith("Correct")
    assert lesson09.check_exercise_3(1.0).startswith("Not yet")
    assert "number" in lesson09.check_exercise_3(None)


def test_logits_memory_with_and_without_chunking() -> None:
    """Hand count: the full loss holds the logits, their log-softmax and their gradient (3 x 4 MiB at
    128 tokens x 8,192 vocabulary in fp32); chunked, one chunk's logits and the weight's gradient."""
    ce = lesson09.logits_memory()
    assert ce["logits"] == 128 * 8192 * 4
    assert ce["full"] == pytest.approx(3 * ce["logits"], rel=0.01)
    assert ce["chunked"] < 0.6 * ce["full"]
