"""Tests of helpers.accumulation (core): the gradient API, its checks and `cleared_grads`."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from helpers.core.data import image_batch, regression_batch, token_batch
from helpers.core.training import cleared_grads, lm_loss, trainable_params
from helpers.core.validate import ArgTypeError
from helpers.models.gpt import GPT, GPTConfig
from helpers.models.nets import ConvNet, ResidualMLP
from helpers.techniques.accumulation import (
    GradDiff,
    accumulated_grad,
    angle_degrees,
    check_batch,
    check_micro_batch,
    compare_grads,
    flat_grad,
    full_batch_grad,
    group_gradient,
    weight_distance,
)
from helpers.techniques.tokens import tiny_lm


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
    assert compare_grads(ref, ref) == GradDiff(0.0, 0.0, 1.0, 1.0, 0.0)
    d = compare_grads(ref, 3 * ref)
    assert d.norm_ratio == pytest.approx(3.0) and d.cosine == pytest.approx(1.0)
    assert d.max_abs == pytest.approx(4.0) and d.max_rel == pytest.approx(2.0)
    assert d.l2_rel == pytest.approx(2.0)
    assert compare_grads(ref, -ref).cosine == pytest.approx(-1.0)


def test_max_rel_and_l2_rel_are_different_metrics():
    ref = torch.tensor([4.0, 0.0, 0.0, 0.0])
    one_entry_off = torch.tensor([4.0, 0.0, 0.0, 3.0])
    d = compare_grads(ref, one_entry_off)
    assert d.max_rel == pytest.approx(3.0 / 4.0)  # worst entry / largest reference entry
    assert d.l2_rel == pytest.approx(3.0 / 4.0)  # ||diff|| / ||ref||
    spread = torch.tensor([4.0, 1.0, 1.0, 1.0])  # three entries off by 1
    d = compare_grads(ref, spread)
    assert d.max_rel == pytest.approx(1 / 4) and d.l2_rel == pytest.approx(3**0.5 / 4)


def test_l2_rel_is_computed_in_float64():
    torch.manual_seed(0)
    ref = torch.randn(1000)
    cand = ref + 1e-7 * torch.randn(1000)
    expected = (cand.double() - ref.double()).norm().item() / ref.double().norm().item()
    assert compare_grads(ref, cand).l2_rel == expected


def test_cleared_grads_clears_on_entry_and_exit_even_on_error():
    model, fn, x, y = mlp_case()
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    with cleared_grads(model) as m:
        assert m is model and all(p.grad is None for p in model.parameters())
        fn(model(x), y).backward()
        assert all(p.grad is not None for p in model.parameters())
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(RuntimeError, match="boom"), cleared_grads(model):
        fn(model(x), y).backward()
        raise RuntimeError("boom")
    assert all(p.grad is None for p in model.parameters())


def test_public_checks():
    model, _, x, y = mlp_case()
    assert len(trainable_params(model)) == len(list(model.parameters()))
    assert check_batch(x, y) == 24
    assert check_micro_batch(24, 24) == 24
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no parameters that require grad"):
        trainable_params(model)
    with pytest.raises(ValueError, match="0-d tensor"):
        check_batch(torch.tensor(1.0), y)
    with pytest.raises(TypeError, match="micro_batch"):
        check_micro_batch(True, 4)


# -- errors -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("micro_batch", "match"),
    [(0, "positive int"), (-2, "positive int"), (25, "larger than the batch"), (2.0, "positive int"),
     (True, "positive int")],
)
def test_accumulated_grad_rejects_bad_micro_batch(micro_batch, match):
    model, fn, x, y = mlp_case()
    with pytest.raises(ValueError, match=match):
        accumulated_grad(model, fn, x, y, micro_batch)
    if not isinstance(micro_batch, int) or isinstance(micro_batch, bool):
        with pytest.raises(ArgTypeError):
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
        check_micro_batch(4, 3)


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


def test_accumulated_grad_matches_the_notebooks_loop():
    """Lesson 03 writes this loop itself; the helper the lessons check against must agree with it."""
    model, fn, x, y = mlp_case()
    model.zero_grad(set_to_none=True)
    n = x.shape[0]
    for xb, yb in zip(x.split(10), y.split(10), strict=True):  # the notebook's loop: 10, 10, 4
        (fn(model(xb), yb) * xb.shape[0] / n).backward()
    by_hand = flat_grad(model)
    model.zero_grad(set_to_none=True)
    torch.testing.assert_close(accumulated_grad(model, fn, x, y, 10), by_hand, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(accumulated_grad(model, fn, x, y, 12, scale=False),
                               2 * full_batch_grad(model, fn, x, y), rtol=1e-5, atol=1e-6)


def test_compare_grads_with_a_zero_candidate():
    """A zero gradient (a frozen model, a forgotten backward) has cosine 0, not 1 and not an error."""
    ref = torch.tensor([3.0, 4.0])
    d = compare_grads(ref, torch.zeros(2))
    assert d.cosine == 0.0 and d.norm_ratio == 0.0 and d.max_abs == 4.0 and d.l2_rel == 1.0



def test_batch_errors_name_the_bad_argument():
    """The message starts with the argument that is wrong, so a learner knows which one to fix."""
    x, y = torch.zeros(4, 2), torch.zeros(4)
    with pytest.raises(ValueError, match="^inputs must be a torch.Tensor, got list"):
        check_batch([0.0] * 4, y)
    with pytest.raises(ValueError, match="^targets must be a torch.Tensor, got list"):
        check_batch(x, [0.0] * 4)
    with pytest.raises(ValueError, match="^inputs must have a batch dimension, got a 0-d tensor"):
        check_batch(torch.tensor(1.0), y)
    with pytest.raises(ValueError, match="^targets must have a batch dimension, got a 0-d tensor"):
        check_batch(x, torch.tensor(1.0))


def test_grad_diff_cannot_be_changed_after_the_fact():
    d = compare_grads(torch.tensor([3.0, 4.0]), torch.tensor([3.0, 4.0]))
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.max_rel = 0.5  # type: ignore[misc]
    assert d.max_rel == 0.0 and d.cosine == pytest.approx(1.0)


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


def test_weight_distance_of_two_runs() -> None:
    model = tiny_lm(vocab_size=16, max_len=8, d_model=16, n_layers=1, seed=0)
    other = tiny_lm(vocab_size=16, max_len=8, d_model=16, n_layers=1, seed=1)
    assert weight_distance(model, model) == 0.0
    assert weight_distance(other, model) > 0.1
    with pytest.raises(ValueError, match="differ in size"):
        weight_distance(tiny_lm(vocab_size=16, max_len=8, d_model=32, n_layers=1), model)
    ref, run = torch.nn.Linear(2, 1, bias=False), torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        ref.weight.copy_(torch.tensor([[3.0, 4.0]]))
        run.weight.copy_(torch.tensor([[3.0, 0.0]]))
    assert weight_distance(run, ref) == pytest.approx(4 / 5)  # ||(0, -4)|| / ||(3, 4)||, not 4 / 3


# -- Killing tests for the mutation run (new survivors) ---------------------------------------------------


def test_angle_degrees_clamps_a_cosine_rounded_past_one() -> None:
    """(0.1, 0.1, 0.3) with itself has a float64 cosine of 1.0000000000000002 (and -1.0000000000000002
    with its negation): the angle is still 0 and 180 degrees, not a math domain error."""
    v = torch.tensor([0.1, 0.1, 0.3])
    assert compare_grads(v, v).cosine > 1.0 and compare_grads(v, -v).cosine < -1.0  # the rounding
    assert angle_degrees(v, v) == 0.0
    assert angle_degrees(v, -v) == 180.0


def test_group_gradient_gives_zeros_for_a_trainable_parameter_the_loss_never_uses() -> None:
    """A trainable parameter outside the forward pass has no gradient: its slice is zeros, and the
    used weight's slice is torch's own gradient of the mean loss."""
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.used = torch.nn.Linear(3, 1, bias=False)
    model.unused = torch.nn.Parameter(torch.ones(2))
    model.forward = lambda x: model.used(x)
    x, y = torch.randn(4, 3), torch.randn(4, 1)
    got = group_gradient(model, F.mse_loss, [(x[:2], y[:2]), (x[2:], y[2:])])
    want = torch.autograd.grad(F.mse_loss(model.used(x), y), model.used.weight)[0].reshape(-1)
    assert [p.shape for p in trainable_params(model)] == [(2,), (1, 3)]  # the unused one comes first
    assert torch.equal(got[:2], torch.zeros(2)) and torch.allclose(got[2:], want, atol=1e-6)
