"""Tests of helpers.lessons.lesson05: sizes, figures, the widget and the exercise checkers."""

from __future__ import annotations

import math

import matplotlib
import matplotlib.pyplot as plt
import pytest
import torch
import torch.nn.functional as F
from support.fixtures import L, V, token_samples

from helpers.core.device import SCALES
from helpers.core.training import IGNORE_INDEX
from helpers.lessons.lesson05 import (
    ERROR_FLOOR,
    check_exercise_1,
    check_exercise_2,
    check_exercise_3,
    check_exercise_4,
    draw_errors,
    lesson_sizes,
    plot_training_curves,
    show_token_report,
    widget_latency_cases,
)
from helpers.measure.formulas import predicted_step_peak_bytes
from helpers.measure.memory import measure_step
from helpers.techniques.accumulation import compare_grads
from helpers.techniques.token_loss import (
    MicroBatch,
    count_valid_tokens,
    pad_sequences,
    split_micro_batches,
    variable_length_sequences,
)
from helpers.techniques.tokens import fixed_step, full_batch_step, naive_step, tiny_lm

matplotlib.use("Agg")

@pytest.fixture(scope="module")
def model(tiny_token_lm: torch.nn.Module) -> torch.nn.Module:
    return tiny_token_lm



# -- sizes and the per-lesson protocol -----------------------------------------------------
def test_sizes_exist_for_every_scale_and_fit_the_widget() -> None:
    for scale in SCALES:
        sizes = lesson_sizes(scale)
        assert sizes.n_seqs % sizes.curve_k == 0 and sizes.n_seqs % sizes.k_spread == 0
        assert (sizes.n_seqs // 4) % sizes.k_local == 0  # 4 simulated workers
        assert sizes.largest_batch >= sizes.n_seqs
        assert sizes.config().dropout == 0.0
    with pytest.raises(ValueError, match="scale='huge'"):
        lesson_sizes("huge")


@pytest.mark.parametrize("scale", ["tiny", "small"])
def test_predicted_step_peak_matches_the_cpu_tracker(scale: str) -> None:
    sizes = lesson_sizes(scale)
    m = tiny_lm(vocab_size=sizes.vocab_size, max_len=sizes.max_len, d_model=sizes.d_model,
                n_layers=sizes.n_layers)
    opt = torch.optim.Adam(m.parameters())
    n = sizes.largest_batch
    batch = pad_sequences(variable_length_sequences(n, sizes.max_len, sizes.vocab_size, spread=0.0))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(m(batch.input_ids).flatten(0, 1), batch.labels.flatten(),
                        ignore_index=IGNORE_INDEX).backward()  # the logits are not held
        opt.step()

    step()  # Adam's state exists from here on, as in a training run
    measured = measure_step(step, model=m, optimizer=opt)
    predicted = predicted_step_peak_bytes(sizes.config(), n)
    assert measured.method == "cpu-tracker"
    assert 0.9 * predicted <= measured.peak_bytes <= 1.02 * predicted, (measured.peak_bytes, predicted)


def test_widget_cases_cover_every_control_and_draw() -> None:
    cases = widget_latency_cases("tiny", torch.device("cpu"))
    names = set(cases)
    assert {"B=1", "K=1", "spread 0", "spread 1"} <= names
    assert any(n.startswith("B=") and n != "B=1" for n in names)
    assert any(n.startswith("K=") and n != "K=1" for n in names)
    before = plt.get_fignums()
    for fn in cases.values():
        fn()
    assert plt.get_fignums() == before, "every move closes its figure"
    with pytest.raises(ValueError, match="scale='huge'"):
        widget_latency_cases("huge", torch.device("cpu"))


def test_show_token_report_prints_the_effective_batch(model: torch.nn.Module,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    before = set(plt.get_fignums())  # another test in this process may have left one open
    r = show_token_report(model, 2, 4, 0.75, seed=1)
    out = capsys.readouterr().out
    assert "effective batch B x K = 2 x 4 = 8" in out
    assert f"{r.naive.max_rel:.2e}" in out
    assert set(plt.get_fignums()) <= before  # its figure is closed


def test_draw_errors_marks_exact_zeros() -> None:
    fig, ax = plt.subplots()
    try:
        draw_errors(ax, [1, 2, 4], {"naive": [0.0, 1e-2, 2e-2], "fixed": [0.0, 3e-7, 4e-7]})
        labels = [t.get_text() for t in ax.legend().get_texts()]
        assert f"exact 0 (drawn at {ERROR_FLOOR:.0e})" in labels and labels.count("naive") == 1
        assert ax.get_yscale() == "log" and ax.get_ylim()[0] < ERROR_FLOOR
        with pytest.raises(ValueError, match="floor"):
            draw_errors(ax, [1], {"naive": [0.0]}, floor=0.0)
    finally:
        plt.close(fig)


def test_training_curves() -> None:
    fig = plot_training_curves({"full": [1.0, 0.5], "naive": [1.1, 0.6], "fixed": [1.0, 0.5]},
                               {"naive": [1e-2, 2e-2], "fixed": [0.0, 1e-7]})
    assert len(fig.axes) == 2
    plt.close(fig)
    with pytest.raises(ValueError, match="at least one"):
        plot_training_curves({}, {})


# -- exercise checkers: the answers they expect are the measured ones ------------------------
def test_exercise_1_sorting_makes_the_naive_error_larger(model: torch.nn.Module) -> None:
    for seed in (0, 1, 2):
        samples = token_samples(16, spread=1.0, seed=seed)
        by_length = sorted(samples, key=lambda s: len(s[0]))
        full = full_batch_step(model, samples).grad
        errors = [compare_grads(full, naive_step(model, split_micro_batches(s, 4)).grad).max_rel
                  for s in (samples, by_length)]
        assert errors[1] > errors[0], (seed, errors)
        fixed = fixed_step(model, split_micro_batches(by_length, 4)).grad
        assert compare_grads(full, fixed).max_rel <= 1e-5
    assert check_exercise_1(" Larger").startswith("Correct")
    for wrong in ("smaller", "same", "bigger", 3):
        assert not check_exercise_1(wrong).startswith("Correct")
    assert check_exercise_1(None).startswith("Not answered")


def test_exercise_2_padding_only_micro_batch_and_group(model: torch.nn.Module) -> None:
    mbs = split_micro_batches(token_samples(), 2)
    mbs[1] = MicroBatch(mbs[1].input_ids, torch.full_like(mbs[1].labels, IGNORE_INDEX))
    naive = naive_step(model, mbs)
    assert math.isnan(naive.loss), "the empty micro-batch's token mean is 0 / 0"
    assert torch.isfinite(naive.grad).all(), "what check_exercise_2's answer says about torch today"
    assert not math.isnan(fixed_step(model, mbs).loss)
    try:
        count_valid_tokens([torch.full((2, 3), IGNORE_INDEX)])
        raised = False
    except ValueError:
        raised = True
    assert raised
    assert check_exercise_2(naive.loss, raised).count("Correct") == 2
    assert "Correct" not in check_exercise_2(0.3, False)
    assert check_exercise_2(None, True).startswith("Not answered")


def test_exercise_3_equal_token_shards(model: torch.nn.Module) -> None:
    samples = variable_length_sequences(8, L, V, spread=0.0, seed=4)  # equal lengths, equal counts
    w = 4
    shards = [split_micro_batches(samples[2 * i: 2 * i + 2], 1) for i in range(w)]
    total = sum(count_valid_tokens([mb.labels for mb in s]) for s in shards)
    full = full_batch_step(model, samples).grad

    def reduced(**kwargs: object) -> torch.Tensor:
        return torch.stack([fixed_step(model, s, **kwargs).grad for s in shards]).mean(0)

    match = {
        "own count per worker": compare_grads(full, reduced()).max_rel <= 1e-5,
        "global count, no x W": compare_grads(full, reduced(num_items_in_batch=total)).max_rel <= 1e-5,
        "global count, x W": compare_grads(
            full, reduced(num_items_in_batch=total, scale=float(w))).max_rel <= 1e-5,
    }
    truth = {name for name, ok in match.items() if ok}
    assert check_exercise_3(truth).startswith("Correct")
    assert check_exercise_3(list(truth)).startswith("Correct")
    assert not check_exercise_3({"global count, x W"}).startswith("Correct")
    assert not check_exercise_3(set(match)).startswith("Correct")
    assert not check_exercise_3("global count, x W").startswith("Correct")
    assert check_exercise_3(None).startswith("Not answered")


def test_exercise_4_accepts_the_per_sequence_loss_only() -> None:
    def per_sequence(logits: torch.Tensor, labels: torch.Tensor, n_seqs: int) -> torch.Tensor:
        tok = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX,
                              reduction="none").view(labels.shape)
        return (tok.sum(1) / (labels != IGNORE_INDEX).sum(1)).sum() / n_seqs

    def token_mean_over_k(logits: torch.Tensor, labels: torch.Tensor, n_seqs: int) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(),
                               ignore_index=IGNORE_INDEX) * labels.shape[0] / n_seqs

    def broken(logits: torch.Tensor, labels: torch.Tensor, n_seqs: int) -> torch.Tensor:
        raise RuntimeError("oops")

    assert check_exercise_4(per_sequence).startswith("Correct")
    assert check_exercise_4(token_mean_over_k).startswith("Not yet")
    assert "RuntimeError: oops" in check_exercise_4(broken)
    assert "scalar" in check_exercise_4(lambda lg, lb, n: lg.sum(-1))
    assert check_exercise_4(42).startswith("Pass a function")
    assert check_exercise_4(None).startswith("Not answered")
