"""Tests of helpers.accumulation (the gradient API) and helpers.accumulation_lab (instruments)."""

from __future__ import annotations

from functools import partial

import matplotlib
import pytest
import torch
import torch.nn.functional as F

from helpers import accumulation_lab as lab
from helpers.accumulation import (
    GradDiff,
    accumulated_grad,
    compare_grads,
    flat_grad,
    full_batch_grad,
    micro_batch_sizes,
)
from helpers.accumulation_lab import (
    angle_degrees,
    examples_per_second,
    gradient_error,
    group_gradient,
    micro_step_memory,
    plot_micro_step_memory,
    scatter_grads,
    show_gradient_error,
    throughput_sweep,
)
from helpers.data import image_batch, regression_batch, token_batch
from helpers.memory import saved_activation_bytes
from helpers.models import GPT, ConvNet, GPTConfig, ResidualMLP

matplotlib.use("Agg")


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def mlp(dtype: torch.dtype = torch.float32) -> ResidualMLP:
    torch.manual_seed(0)
    return ResidualMLP(8, 32, 2, 3).to(dtype)


def gpt(dtype: torch.dtype = torch.float32) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_heads=2, n_layers=2, dropout=0.0)
    return GPT(cfg).to(dtype).eval()


def mlp_case(dtype=torch.float32):
    x, y = regression_batch(24, 8, 3, seed=1)
    return mlp(dtype), F.mse_loss, x.to(dtype), y.to(dtype)


def gpt_case(dtype=torch.float32):
    x, y = token_batch(12, 16, 64, seed=2)
    return gpt(dtype), lm_loss, x, y


def conv_case(dtype=torch.float32):
    torch.manual_seed(0)
    model = ConvNet(3, 8, 2, 5, norm="group").to(dtype)
    x, y = image_batch(12, size=8, num_classes=5, seed=3)
    return model, F.cross_entropy, x.to(dtype), y


CASES = {"mlp": mlp_case, "gpt": gpt_case, "convnet": conv_case}


# -- equal gradients -------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("micro_batch", [1, 4, 5, 12])  # 5 leaves a partial last micro-batch
def test_scaled_accumulation_matches_full_batch_fp32(case, micro_batch):
    model, fn, x, y = CASES[case]()
    ref = full_batch_grad(model, fn, x, y)
    diff = compare_grads(ref, accumulated_grad(model, fn, x, y, micro_batch))
    assert diff.max_rel <= 1e-5, diff
    assert diff.cosine > 1 - 1e-9


@pytest.mark.parametrize("case", CASES)
def test_scaled_accumulation_matches_full_batch_fp64(case):
    model, fn, x, y = CASES[case](torch.float64)
    ref = full_batch_grad(model, fn, x, y)
    assert compare_grads(ref, accumulated_grad(model, fn, x, y, 3)).max_rel <= 1e-12


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("micro_batch", [2, 3, 4])
def test_unscaled_accumulation_is_k_times_larger(case, micro_batch):
    model, fn, x, y = CASES[case]()
    k = len(x) // micro_batch
    diff = compare_grads(full_batch_grad(model, fn, x, y),
                         accumulated_grad(model, fn, x, y, micro_batch, scale=False))
    assert abs(diff.norm_ratio - k) <= 1e-4
    assert diff.cosine > 1 - 1e-6


def test_dividing_by_k_is_wrong_with_a_partial_micro_batch():
    model, fn, x, y = mlp_case()
    ref = full_batch_grad(model, fn, x, y)
    model.zero_grad(set_to_none=True)
    pieces = list(zip(x.split(5), y.split(5), strict=True))  # 5, 5, 5, 5, 4
    for xb, yb in pieces:
        (fn(model(xb), yb) / len(pieces)).backward()
    assert compare_grads(ref, flat_grad(model)).max_rel > 1e-3


def test_gradients_are_cleared_before_and_after():
    model, fn, x, y = mlp_case()
    for p in model.parameters():
        p.grad = torch.full_like(p, 123.0)  # stale gradients must not leak in
    ref = full_batch_grad(model, fn, x, y)
    assert all(p.grad is None for p in model.parameters())
    for p in model.parameters():
        p.grad = torch.full_like(p, 123.0)
    acc = accumulated_grad(model, fn, x, y, 4)
    assert all(p.grad is None for p in model.parameters())
    assert compare_grads(ref, acc).max_rel <= 1e-5


def test_training_mode_and_rng_are_left_alone():
    model, fn, x, y = gpt_case()
    model.train()
    torch.manual_seed(7)
    state = torch.get_rng_state()
    full_batch_grad(model, fn, x, y)
    accumulated_grad(model, fn, x, y, 4)
    assert model.training
    assert torch.equal(state, torch.get_rng_state())  # dropout=0 draws nothing; no reseeding


def test_flat_grad_layout_and_zeros_for_missing_grads():
    model = mlp()
    n = sum(p.numel() for p in model.parameters())
    g = flat_grad(model)
    assert g.shape == (n,) and torch.count_nonzero(g) == 0
    model.out.weight.grad = torch.ones_like(model.out.weight)
    g = flat_grad(model)
    assert g.sum().item() == model.out.weight.numel()
    g.zero_()  # a copy: the model's grad is untouched
    assert model.out.weight.grad.sum().item() == model.out.weight.numel()


def test_compare_grads_fields():
    ref = torch.tensor([1.0, -2.0, 2.0])
    assert compare_grads(ref, ref) == GradDiff(0.0, 0.0, 1.0, 1.0)
    d = compare_grads(ref, 3 * ref)
    assert d.norm_ratio == pytest.approx(3.0) and d.cosine == pytest.approx(1.0)
    assert d.max_abs == pytest.approx(4.0) and d.max_rel == pytest.approx(2.0)
    assert compare_grads(ref, -ref).cosine == pytest.approx(-1.0)


def test_micro_batch_sizes():
    assert micro_batch_sizes(10, 4) == [4, 4, 2]
    assert micro_batch_sizes(8, 4) == [4, 4]
    assert micro_batch_sizes(3, 3) == [3]


# -- errors -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("micro_batch", "match"),
    [(0, "at least 1"), (-2, "at least 1"), (25, "larger than the batch"), (2.0, "must be an int"),
     (True, "must be an int")],
)
def test_accumulated_grad_rejects_bad_micro_batch(micro_batch, match):
    model, fn, x, y = mlp_case()
    with pytest.raises(ValueError, match=match):
        accumulated_grad(model, fn, x, y, micro_batch)


def test_accumulated_grad_rejects_empty_inputs():
    model, fn, _, _ = mlp_case()
    with pytest.raises(ValueError, match="empty"):
        accumulated_grad(model, fn, torch.zeros(0, 8), torch.zeros(0, 3), 1)


def test_accumulated_grad_rejects_mismatched_lengths():
    model, fn, x, y = mlp_case()
    with pytest.raises(ValueError, match="same length.*24 inputs and 23 targets"):
        accumulated_grad(model, fn, x, y[:-1], 4)
    with pytest.raises(ValueError, match="same length"):
        full_batch_grad(model, fn, x, y[:-1])


def test_other_bad_arguments():
    model, fn, x, y = mlp_case()
    with pytest.raises(ValueError, match="torch.Tensor"):
        accumulated_grad(model, fn, x.tolist(), y, 4)
    with pytest.raises(ValueError, match="nn.Module"):
        flat_grad("model")
    with pytest.raises(ValueError, match="same shape"):
        compare_grads(torch.ones(3), torch.ones(4))
    with pytest.raises(ValueError, match="non-zero"):
        compare_grads(torch.zeros(3), torch.ones(3))
    with pytest.raises(ValueError, match="larger than the batch"):
        micro_batch_sizes(3, 4)


# -- instruments and widgets -------------------------------------------------------------
def _memory_case():
    model, fn, x, y = gpt_case()
    batches = list(zip(x.split(4), y.split(4), strict=True))
    act = saved_activation_bytes(lambda: fn(model(batches[0][0]), batches[0][1]))
    model.zero_grad(set_to_none=True)
    return model, fn, batches, act


def test_micro_step_memory_flat_for_the_correct_loop_and_growing_for_leaks():
    model, fn, batches, act = _memory_case()
    k = len(batches)

    def correct(mark):
        for i, (x, y) in enumerate(batches):
            (fn(model(x), y) / k).backward()
            mark(f"step {i + 1}")

    def retain_and_keep(mark):
        kept = []
        for i, (x, y) in enumerate(batches):
            loss = fn(model(x), y)
            (loss / k).backward(retain_graph=True)
            kept.append(loss)
            mark(f"step {i + 1}")

    def sum_losses(mark):
        total = 0.0
        for i, (x, y) in enumerate(batches):
            total = total + fn(model(x), y) / k
            mark(f"step {i + 1}")
        total.backward()

    flat = micro_step_memory(correct, model)
    assert flat.labels == ["start", "step 1", "step 2", "step 3"]
    assert abs(flat.growth(1, -1)) <= 64  # only the scalar loss is replaced; batches are not counted
    assert flat.method == "cpu-tracker"
    leak = micro_step_memory(retain_and_keep, model)
    steps = [b - a for a, b in zip(leak.live_after[1:], leak.live_after[2:], strict=False)]
    assert min(steps) >= 0.8 * act
    summed = micro_step_memory(sum_losses, model)
    assert summed.growth(0, -1) >= 0.9 * k * act
    assert summed.peak_activations >= 0.7 * k * flat.peak_activations
    assert all(p.grad is None for p in model.parameters())


def test_micro_step_memory_rejects_non_callable():
    with pytest.raises(ValueError, match="callable"):
        micro_step_memory("loop", mlp())


def test_gradient_error_widget_function():
    diff, ref, cand = gradient_error(4, 3, True)
    assert diff.max_rel <= 1e-5 and ref.shape == cand.shape
    diff, _, _ = gradient_error(4, 3, False)
    assert abs(diff.norm_ratio - 3) <= 1e-4
    assert gradient_error(2, 5, True, seed=1)[0] == gradient_error(2, 5, True, seed=1)[0]
    with pytest.raises(ValueError, match="steps must be a positive int"):
        gradient_error(4, 0)


def test_widgets_and_plots_draw(capsys):
    show_gradient_error(2, 3, False)
    out = capsys.readouterr().out
    assert "norm_ratio 3.0000" in out and "effective batch B x K = 6" in out
    from helpers.plots import figure

    fig, (ax1, ax2) = figure(2)
    ref = torch.randn(10_000)
    scatter_grads(ax1, ref, 2 * ref, steps=2, max_points=100)
    assert len(ax1.collections[0].get_offsets()) == 100
    model, fn, batches, act = _memory_case()
    res = micro_step_memory(partial(lambda b, mark: mark("one"), batches), model)
    plot_micro_step_memory(ax2, {"noop": res}, unit_bytes=act)
    with pytest.raises(ValueError, match="unit_bytes"):
        plot_micro_step_memory(ax2, {"noop": res}, unit_bytes=0)
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_examples_per_second():
    model, fn, x, y = mlp_case()
    eps = examples_per_second(model, fn, x, y, 8, repeats=1)
    assert eps is not None and eps > 0
    with pytest.raises(ValueError, match="micro_batch"):
        examples_per_second(model, fn, x, y, 0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_equal_gradients_on_cuda():
    for make in (mlp_case, gpt_case):
        model, fn, x, y = make()
        model, x, y = model.cuda(), x.cuda(), y.cuda()
        ref = full_batch_grad(model, fn, x, y)
        assert compare_grads(ref, accumulated_grad(model, fn, x, y, 4)).max_rel <= 1e-5
        unscaled = compare_grads(ref, accumulated_grad(model, fn, x, y, 4, scale=False))
        assert abs(unscaled.norm_ratio - len(x) // 4) <= 1e-4


# -- the true gradient, throughput, sizes, protocol, checkers ----------------------------
def test_group_gradient_leaves_grad_alone_and_matches_full_batch():
    model, fn, x, y = mlp_case()
    batches = list(zip(x.split(5), y.split(5), strict=True))  # 5, 5, 5, 5, 4
    (fn(model(x[:3]), y[:3])).backward()
    before = flat_grad(model)
    g = group_gradient(model, fn, batches)
    assert torch.equal(flat_grad(model), before)  # .grad untouched
    model.zero_grad(set_to_none=True)
    assert compare_grads(full_batch_grad(model, fn, x, y), g).max_rel <= 1e-5
    assert angle_degrees(g, g) < 1e-3 and abs(angle_degrees(g, -g) - 180) < 1e-3
    with pytest.raises(ValueError, match="empty"):
        group_gradient(model, fn, [])


def test_throughput_sweep_reports_median_and_spread():
    model, fn, x, y = mlp_case()
    res = throughput_sweep(model, fn, x, y, [4, 24], rounds=3)
    for t in res.values():
        assert t is not None and t.rounds == 3 and t.low <= t.median <= t.high
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(ValueError, match="rounds"):
        throughput_sweep(model, fn, x, y, [4], rounds=0)
    with pytest.raises(ValueError, match="larger than the batch"):
        throughput_sweep(model, fn, x, y, [25])


def test_gpt_activation_formula_and_param_count():
    for cfg, b in [(GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_heads=2, n_layers=2, dropout=0.0), 3),
                   (lab.lesson_sizes("tiny").gpt, 2)]:
        torch.manual_seed(0)
        model = GPT(cfg)
        x, y = token_batch(b, cfg.seq_len, cfg.vocab_size, seed=0)
        act = saved_activation_bytes(lambda model=model, x=x, y=y: lm_loss(model(x), y))
        assert abs(act / lab.gpt_activation_bytes(cfg, b) - 1) <= 0.05
        assert lab.gpt_param_count(cfg) == sum(p.numel() for p in model.parameters())
    with pytest.raises(TypeError, match="GPTConfig"):
        lab.gpt_activation_bytes("cfg", 2)
    with pytest.raises(TypeError, match="micro_batch"):
        lab.gpt_activation_bytes(cfg, True)


@pytest.mark.parametrize("scale", ["tiny", "small", "medium", "full"])
def test_predicted_peak_fits_the_scale(scale):
    peak = lab.predicted_peak_bytes(scale)
    assert 0 < peak <= {"tiny": 1e9, "small": 1e9, "medium": 0.7 * 12e9, "full": 0.7 * 40e9}[scale]


def test_widget_latency_cases_run(capsys):
    cases = lab.widget_latency_cases("tiny", torch.device("cpu"))
    assert any(k.startswith("memory") for k in cases) and any(k.startswith("gradient") for k in cases)
    for fn in cases.values():
        fn()
    assert "effective batch B x K" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("check", "right", "wrong"),
    [
        (lab.check_exercise_1, (1.0,), (8.0,)),
        (lab.check_exercise_2, (1.0,), (8.0,)),
        (lab.check_exercise_3, ("keep logits",), ("keep predictions",)),
        (lab.check_exercise_4, ("c", "item"), ("b", "detach")),
    ],
)
def test_exercise_checkers(check, right, wrong, capsys):
    assert check(*right).startswith("Correct")
    assert check(*wrong).startswith("Not yet")
    assert check(*[None] * len(right)).startswith("Not yet")  # never raises on odd input
