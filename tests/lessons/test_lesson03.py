"""Tests of helpers.lessons.lesson03 (lesson 03): memory per micro-step, widgets, sizes, checkers."""

from __future__ import annotations

import matplotlib
import pytest
import torch
import torch.nn.functional as F

from helpers.core.data import regression_batch, token_batch
from helpers.core.training import lm_loss
from helpers.lessons import lesson03
from helpers.lessons.lesson03 import (
    gradient_error,
    plot_micro_step_memory,
    scatter_grads,
    show_gradient_error,
)
from helpers.measure import formulas
from helpers.measure.memory import micro_step_memory, saved_activation_bytes
from helpers.models.gpt import GPT, GPTConfig
from helpers.models.nets import ResidualMLP

matplotlib.use("Agg")


def mlp_case():
    torch.manual_seed(0)
    x, y = regression_batch(24, 8, 3, seed=1)
    return ResidualMLP(8, 32, 2, 3), F.mse_loss, x, y


# -- instruments and widgets -------------------------------------------------------------


def test_gradient_error_widget_function():
    diff, ref, cand = gradient_error(4, 3, True)
    assert diff.max_rel <= 1e-5 and ref.shape == cand.shape
    diff, _, _ = gradient_error(4, 3, False)
    assert abs(diff.norm_ratio - 3) <= 1e-4
    assert gradient_error(2, 5, True, seed=1)[0] == gradient_error(2, 5, True, seed=1)[0]
    with pytest.raises(ValueError, match="steps must be a positive int"):
        gradient_error(4, 0)


def test_gradient_error_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    state = torch.get_rng_state()
    gradient_error(2, 3, True)
    assert torch.equal(state, torch.get_rng_state())


def test_widgets_and_plots_draw(capsys):
    show_gradient_error(2, 3, False)
    out = capsys.readouterr().out
    assert "norm_ratio 3.0000" in out and "effective batch B x K = 6" in out
    assert "max relative error (max_rel)" in out
    from helpers.core.plots import figure

    fig, (ax1, ax2) = figure(2)
    ref = torch.randn(10_000)
    scatter_grads(ax1, ref, 2 * ref, steps=2, max_points=100)
    assert len(ax1.collections[0].get_offsets()) == 100
    model = ResidualMLP(8, 32, 2, 3)
    res = micro_step_memory(lambda mark: mark("one"), model)
    plot_micro_step_memory(ax2, {"noop": res}, unit_bytes=1024)
    with pytest.raises(ValueError, match="unit_bytes"):
        plot_micro_step_memory(ax2, {"noop": res}, unit_bytes=0)
    import matplotlib.pyplot as plt

    plt.close(fig)


# -- the true gradient, sizes, protocol, checkers ----------------------------


def test_gpt_activation_formula_and_param_count():
    for cfg, b in [(GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_heads=2, n_layers=2, dropout=0.0), 3),
                   (lesson03.lesson_sizes("tiny").gpt, 2)]:
        torch.manual_seed(0)
        model = GPT(cfg)
        x, y = token_batch(b, cfg.seq_len, cfg.vocab_size, seed=0)
        act = saved_activation_bytes(lambda model=model, x=x, y=y: lm_loss(model(x), y))
        assert abs(act / formulas.gpt_activation_bytes(cfg, b) - 1) <= 0.05
        assert formulas.gpt_param_count(cfg) == sum(p.numel() for p in model.parameters())
    with pytest.raises(TypeError, match="GPTConfig"):
        formulas.gpt_activation_bytes("cfg", 2)
    with pytest.raises(TypeError, match="micro_batch"):
        formulas.gpt_activation_bytes(cfg, True)


def test_widget_latency_cases_run(capsys):
    cases = lesson03.widget_latency_cases("tiny", torch.device("cpu"))
    assert cases and all(k.startswith("gradient") for k in cases)  # no loops given: no memory moves
    for fn in cases.values():
        fn()
    assert "effective batch B x K" in capsys.readouterr().out


def test_memory_widget_cases_run_the_loops_they_are_given(capsys):
    """The memory moves run the caller's loop (here one written in this test), not a copy of the lesson's."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        gpt = GPT(lesson03.lesson_sizes("tiny").gpt)
    calls = []

    def loop(batches, mark):
        calls.append(len(batches))
        for i, (x, y) in enumerate(batches):
            (lm_loss(gpt(x), y) / len(batches)).backward()
            mark(f"micro-step {i + 1}")

    cases = lesson03.widget_latency_cases("tiny", torch.device("cpu"), gpt, {"test loop": loop})
    memory = {k: fn for k, fn in cases.items() if k.startswith("memory")}
    assert len(memory) == 4
    for fn in memory.values():
        fn()
    z = lesson03.lesson_sizes("tiny")
    assert calls == [z.gpt_k, z.gpt_k, z.widget_k_max, z.widget_k_max]
    assert "effective batch B x K" in capsys.readouterr().out
    with pytest.raises(ValueError, match="both model and loops"):
        lesson03.widget_latency_cases("tiny", torch.device("cpu"), gpt)


@pytest.mark.parametrize(
    ("check", "right", "wrong"),
    [
        (lesson03.check_exercise_1, (1.0,), (8.0,)),
        (lesson03.check_exercise_2, (1.0,), (8.0,)),
        (lesson03.check_exercise_3, ("keep logits",), ("keep predictions",)),
        (lesson03.check_exercise_4, ("c", "item"), ("b", "detach")),
    ],
)
def test_exercise_checkers(check, right, wrong, capsys):
    assert check(*right).startswith("Correct")
    assert check(*wrong).startswith("Not yet")
    assert check(*[None] * len(right)).startswith("Not yet")  # never raises on odd input


def test_micro_step_figure_draws_coinciding_loops_once_and_labels_every_mark() -> None:
    from helpers.core.plots import figure
    from helpers.measure.memory import MicroStepMemory

    def run(values: list[int], labels: list[str]) -> MicroStepMemory:
        return MicroStepMemory(labels, values, max(values), 0, "tracker")

    steps = ["start", "micro-step 1", "micro-step 2"]
    fig, (ax,) = figure()
    plot_micro_step_memory(ax, {"correct": run([0, 10, 10], steps), "keep loss": run([0, 10, 10], steps),
                                "summed": run([0, 100, 200, 10], [*steps, "backward"])},
                           unit_bytes=100, references={"one micro-batch of logits": 0.4})
    assert [line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")] == [
        "correct = keep loss", "summed"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["start", "1", "2", "backward"]
    assert [t.get_text() for t in ax.texts] == ["one micro-batch of logits"]
    (bracket,) = ax.patches  # the offset, from the first loop's last mark (0.1) up by 0.4
    ys = [y for _, y in bracket.get_path().vertices]
    assert min(ys) == pytest.approx(0.1, abs=0.02) and max(ys) == pytest.approx(0.5, abs=0.02), ys
    import matplotlib.pyplot as plt

    plt.close(fig)
