"""helpers.lessons.lesson10: sizes, the predicted peak against measured peaks, widgets, exercise checkers."""

from __future__ import annotations

import os

import matplotlib
import pytest
import torch

from helpers.core.device import SCALES
from helpers.core.training import lm_loss, warmup_cosine
from helpers.frameworks import compiled, installed
from helpers.lessons import lesson10 as lab
from helpers.measure.memory import measure_step
from helpers.models.gpt import seeded_gpt
from helpers.techniques import tradeoffs

matplotlib.use("Agg")
CI = os.environ.get("CI", "").lower() == "true"
needs_accelerate = pytest.mark.skipif(bool(installed.missing("accelerate")) and not CI,
                                      reason="needs the frameworks extra (accelerate)")


def test_sizes_exist_at_every_scale() -> None:  # their fit to each scale: tests/test_scales.py
    for scale in SCALES:
        s = lab.lesson_sizes(scale)
        assert s.micro_batch <= s.widget_b and s.k <= s.widget_k and s.ce_chunk < s.ce_tokens


@pytest.mark.parametrize("scale", ["tiny", "small"])
def test_predicted_peak_is_above_the_largest_measured_experiments(scale: str) -> None:
    s = lab.lesson_sizes(scale)
    predicted = lab.predicted_peak_bytes(scale)
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(s.ce_tokens, s.d_model, generator=gen, requires_grad=True)
    head = torch.nn.Module()
    head.weight = torch.nn.Parameter(torch.randn(s.ce_vocab, s.d_model, generator=gen) * 0.02)
    labels = torch.randint(0, s.ce_vocab, (s.ce_tokens,), generator=gen)
    ce_step = lambda: tradeoffs.full_cross_entropy(hidden, head.weight, labels).backward()  # noqa: E731
    ce = measure_step(ce_step, model=head)
    gpt = seeded_gpt(lab.gpt_config(s), "cpu")
    x = torch.randint(0, s.vocab, (s.widget_b, s.seq_len), generator=gen)
    opt = torch.optim.Adam(gpt.parameters())

    def step() -> None:
        lm_loss(gpt(x), x.roll(-1, 1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # Adam's state exists from here on
    gpt_peak = measure_step(step, model=gpt, optimizer=opt).peak_bytes
    assert predicted >= max(ce.peak_bytes, gpt_peak), (predicted, ce.peak_bytes, gpt_peak)
    assert predicted <= 3 * max(ce.peak_bytes, gpt_peak)  # safe, but not a blind overestimate


def test_plot_pareto_draws_every_point() -> None:
    pts = [compiled.RecomputePoint(f"compiled, budget {b:g}", int(1e6 * (1 + b)), int(2e6 * (1 - b)), 0,
                                   True, b) for b in (1.0, 0.0)]
    eager = [compiled.RecomputePoint("eager", 900_000, 0, 0, False)]
    fig = lab.plot_pareto(pts, eager, highlight=pts[0])
    ax = fig.axes[0]
    assert "MiB" in ax.get_ylabel() and len(ax.get_legend().get_texts()) == 3
    matplotlib.pyplot.close(fig)


@needs_accelerate
def test_accumulate_widget_prints_the_effective_batch_and_both_errors(capsys) -> None:
    syncs, naive, recipe = lab.accumulate_errors(3, 2, scale="tiny")
    assert syncs == [False, True] and naive > 1e-4 and recipe <= 1e-5
    lab.show_accumulate(3, 2, scale="tiny")
    out = capsys.readouterr().out
    assert "effective batch B x K = 3 x 2 = 6" in out and ". S" in out


def test_without_the_frameworks_the_widget_keeps_b_and_k_and_the_effective_batch(capsys, monkeypatch) -> None:
    """Issue 37 (part B): with Transformers and Accelerate hidden from import, widget 1 still takes B and K,
    prints the effective batch line, and measures lesson 05's two loops."""
    import sys

    for name in ("transformers", "accelerate"):
        monkeypatch.setitem(sys.modules, name, None)  # `import transformers` raises; find_spec says absent
    assert installed.missing("transformers", "accelerate") == ["transformers", "accelerate"]
    naive, fixed = lab.loop_errors(3, 2, scale="tiny")
    assert naive > 1e-4 and fixed <= 1e-5, (naive, fixed)
    lab.show_accumulate(3, 2, scale="tiny")
    out = capsys.readouterr().out
    assert "effective batch B x K = 3 x 2 = 6" in out and "Accelerate is not installed" in out
    lab.show_accumulate(1, 1, scale="tiny")  # the sliders' lower ends
    assert "effective batch B x K = 1 x 1 = 1" in capsys.readouterr().out


def test_the_notebooks_b_and_k_sliders_are_offered_whatever_is_installed() -> None:
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "notebooks" / "10_frameworks_and_compiler.ipynb"
    cells = ["".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
             if c["cell_type"] == "code"]
    sliders = [c for c in cells if 'description="accumulation steps (K)"' in c]
    assert sliders and all('description="micro-batch size (B)"' in c for c in sliders)
    assert not any(line.startswith("if ") for c in sliders for line in c.splitlines()), sliders  # no guard


@needs_accelerate
def test_widget_latency_cases_each_run(capsys) -> None:
    cases = lab.widget_latency_cases("tiny", torch.device("cpu"))
    assert {"B=1", "K=1", "budget 0", "budget 1"} <= set(cases)
    for fn in cases.values():
        fn()
    assert "activation_memory_budget = 0" in capsys.readouterr().out


def test_budget_explorer_reuses_the_curve_and_caches() -> None:
    s = lab.lesson_sizes("tiny")
    first = lab.BudgetExplorer(s, torch.device("cpu"), [])
    p = first.point(s.micro_batch, 1.0)
    second = lab.BudgetExplorer(s, torch.device("cpu"), [p])
    assert second.point(s.micro_batch, 1.0) is p  # no second compile for what the curve measured
    assert first.point(s.micro_batch, 1.0) is p  # cached
    with pytest.raises(ValueError, match="budget"):
        first.point(1, 2.0)


@pytest.mark.skipif(bool(installed.missing("transformers")) and not CI, reason="needs transformers")
def test_exercise_1_asks_the_installed_scheduler() -> None:
    assert lab.check_exercise_1(None).startswith("Not answered")
    assert lab.check_exercise_1(0.5).startswith("Correct")  # linear decay over 2 steps, no warmup
    assert lab.check_exercise_1(1.0).startswith("Not quite")


def test_exercises_2_to_4() -> None:
    s = lab.lesson_sizes("small")
    right = s.lr * warmup_cosine(4 * s.k)(s.k)
    assert lab.check_exercise_2(right).startswith("Correct")
    assert "what Lightning does" in lab.check_exercise_2(s.lr * warmup_cosine(4 * s.k)(1))
    assert lab.check_exercise_2("x").startswith("Not answered")
    assert lab.check_exercise_3("PREFER_SAVE").startswith("Correct")
    assert lab.check_exercise_3(torch.utils.checkpoint.CheckpointPolicy.PREFER_SAVE).startswith("Correct")
    assert lab.check_exercise_3("MUST_SAVE").startswith("Not quite")
    assert lab.check_exercise_3("SAVE_ALL").startswith("Answer with")
    assert lab.check_exercise_4(s.k).startswith("Correct") and lab.check_exercise_4(1).startswith("Not quite")
