"""Tests for helpers.techniques.pitfalls (lesson 04): the claims at tiny sizes, and every ValueError.

Mixed precision (`helpers.techniques.amp`) is tested in `tests/techniques/test_amp.py`; its arguments'
checks stay here, in the table of every ValueError.
"""

from __future__ import annotations

import matplotlib
import pytest
import torch
import torch.nn.functional as F

from helpers.core import training
from helpers.core.data import image_batch, regression_batch
from helpers.measure import formulas
from helpers.models.nets import ConvNet, DropoutMLP, ResidualMLP
from helpers.techniques import amp, pitfalls
from helpers.techniques.accumulation import accumulated_grad, compare_grads, full_batch_grad

matplotlib.use("Agg")
TINY = dict(width=4, depth=2, size=8)


# -- BatchNorm -----------------------------------------------------------------------
def test_batchnorm_error_shrinks_and_vanishes_at_full_batch() -> None:
    curve = pitfalls.norm_error_curve("batch", batch=16, micro_batches=[1, 4, 16], **TINY)
    assert curve[1] > 0.05
    assert curve[1] > curve[4] > curve[16]
    assert curve[16] < 1e-6


@pytest.mark.parametrize(("norm", "mode"), [("group", "train"), ("layer", "train"),
                                            ("none", "train"), ("batch", "eval"),
                                            ("batch", "frozen")])
def test_fixes_restore_the_match(norm: str, mode: str) -> None:
    curve = pitfalls.norm_error_curve(norm, batch=16, micro_batches=[1, 4], mode=mode, **TINY)
    assert max(curve.values()) < 1e-5, curve


def test_norm_error_curve_is_repeatable() -> None:
    a = pitfalls.norm_error_curve("batch", batch=8, **TINY)
    b = pitfalls.norm_error_curve("batch", batch=8, **TINY)
    assert a == b
    assert list(a) == [1, 2, 4, 8]


def test_frozen_mode_freezes_batchnorm_only() -> None:
    model = pitfalls.set_norm_mode(ConvNet(width=4, depth=1), "frozen")
    bn = model.blocks[0][1]
    assert model.training and not bn.training
    assert not bn.weight.requires_grad and model.head.weight.requires_grad


def test_ghost_batch_matches_accumulation_not_full_batch() -> None:
    model = ConvNet(width=4, depth=2).train()
    x, y = image_batch(16, size=8)
    ghost = pitfalls.ghost_batch_grad(model, F.cross_entropy, x, y, 4)
    acc = accumulated_grad(model, F.cross_entropy, x, y, 4)
    full = full_batch_grad(model, F.cross_entropy, x, y)
    assert compare_grads(acc, ghost).l2_rel < 1e-5
    assert compare_grads(full, ghost).l2_rel > 0.01


def test_running_stats_count_every_micro_batch() -> None:
    model = ConvNet(width=4, depth=1).train()
    x, _ = image_batch(16, size=8)
    with torch.no_grad():
        for chunk in x.split(4):
            model(chunk)
    stats = pitfalls.batchnorm_buffers(model)
    assert stats["num_batches_tracked"].tolist() == [4.0]
    assert stats["running_mean"].shape == (4,)


def test_default_micro_batches() -> None:
    assert pitfalls.default_micro_batches(12) == [1, 2, 4, 12]
    assert pitfalls.default_micro_batches(1) == [1]


# -- Dropout -------------------------------------------------------------------------
def test_dropout_masks_are_the_only_cause() -> None:
    full, acc = pitfalls.dropout_grads(4, shared_masks=False, batch=16)
    assert compare_grads(full, acc).l2_rel > 0.05
    full, acc = pitfalls.dropout_grads(4, shared_masks=True, batch=16)
    assert compare_grads(full, acc).l2_rel < 1e-5


@pytest.mark.parametrize(
    "call",
    [
        lambda: pitfalls.norm_error_curve("batch", batch=8, **TINY),
        lambda: pitfalls.norm_error_curve("batch", batch=8, mode="eval", **TINY),
        lambda: pitfalls.dropout_grads(4, shared_masks=False, batch=8),
        lambda: pitfalls.dropout_grads(4, shared_masks=True, batch=8),
    ],
)
def test_helpers_leave_the_global_rng_alone(call) -> None:
    torch.manual_seed(123)
    state = torch.get_rng_state()
    first = call()
    assert torch.equal(state, torch.get_rng_state())
    torch.manual_seed(7)  # a different global stream gives the same numbers
    second = call()
    if isinstance(first, dict):
        assert first == second
    else:
        assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def test_dropout_grads_match_a_seed_everything_run() -> None:
    """The private random state gives the numbers that reseeding the global one gave."""
    from helpers.core.device import seed_everything

    seed_everything(0)
    model = DropoutMLP(16, 32, 1, n_dropout=2).train()
    x, y = regression_batch(16, 16, 1, seed=0)
    seed_everything(1)
    full = full_batch_grad(model, F.mse_loss, x, y)
    seed_everything(1)
    acc = accumulated_grad(model, F.mse_loss, x, y, 4)
    got_full, got_acc = pitfalls.dropout_grads(4, shared_masks=False, batch=16)
    assert torch.equal(full, got_full) and torch.equal(acc, got_acc)


def test_dropout_mlp_eval_is_deterministic() -> None:
    model = DropoutMLP(4, 8, 1).eval()
    x = torch.randn(3, 4)
    assert torch.equal(model(x), model(x))
    masks = model.draw_masks(3)
    assert len(masks) == 2 and masks[0].shape == (3, 8) and masks[0].dtype == torch.bool


# -- Scheduler -----------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 2, 4])
def test_warmup_ends_k_times_earlier_per_micro_step(k: int) -> None:
    right = pitfalls.lr_schedule(k, per="update", micro_batch=2, updates=16, warmup=4)
    wrong = pitfalls.lr_schedule(k, per="micro", micro_batch=2, updates=16, warmup=4)
    assert right.warmup_end_examples == 4 * k * 2
    assert right.warmup_end_examples == k * wrong.warmup_end_examples
    assert right.warnings == []
    assert len(wrong.warnings) == (1 if k > 1 else 0)
    assert len(right.lrs) == len(right.examples) == 16
    if k > 1:
        assert wrong.lrs[-1] == 0.0 and min(right.lrs[:-1]) > 0.0


def test_warmup_cosine_shape() -> None:
    f = training.warmup_cosine(4, 12)
    assert [f(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(11) == 0.0 and f(100) == 0.0
    assert 0.0 < f(7) < 1.0


def test_first_update_at_zero_counts_from_one() -> None:
    wrong = pitfalls.lr_schedule(4, per="micro", updates=24, warmup=8)
    right = pitfalls.lr_schedule(4, per="update", updates=24, warmup=8)
    n = wrong.first_update_at_zero()
    assert wrong.lrs[n - 1] == 0.0 and wrong.lrs[n - 2] > 0.0
    assert right.first_update_at_zero() == 24


# -- widgets, sizes, protocol and checkers --------------------------------------------


# -- bad arguments -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: pitfalls.norm_error_curve("instance", batch=8), "norm='instance'"),
        (lambda: pitfalls.norm_error_curve("batch", batch=0), "batch must be"),
        (lambda: pitfalls.norm_error_curve("batch", batch=8, micro_batches=[9]), "micro_batches"),
        (lambda: pitfalls.norm_error_curve("batch", batch=8, mode="half"), "mode='half'"),
        (lambda: pitfalls.norm_error_curve("batch", batch=8, width=0), "width must be"),
        (lambda: pitfalls.set_norm_mode(ConvNet(), "off"), "mode='off'"),
        (lambda: pitfalls.ghost_batch_grad(ConvNet(), F.cross_entropy,
                                           *image_batch(4, size=4), 8), "larger than"),
        (lambda: pitfalls.ghost_batch_grad(ConvNet(), F.cross_entropy,
                                           *image_batch(4, size=4), 0), "ghost must be"),
        (lambda: pitfalls.batchnorm_buffers(ConvNet(norm="group")), "no BatchNorm"),
        (lambda: DropoutMLP(4, 8, 1, p=1.0), "p must be"),
        (lambda: DropoutMLP(4, 0, 1), "width must be"),
        (lambda: DropoutMLP(4, 8, 1)(torch.ones(2, 4), [torch.ones(2, 8)]), "need 2"),
        (lambda: pitfalls.dropout_grads(8, shared_masks=True, batch=4), "larger than"),
        (lambda: training.warmup_cosine(8, 8), "must exceed"),
        (lambda: training.warmup_cosine(0, 8), "warmup_steps must be"),
        (lambda: pitfalls.lr_schedule(0), "accum_steps must be"),
        (lambda: pitfalls.lr_schedule(2, per="epoch"), "per='epoch'"),
        (lambda: pitfalls.lr_schedule(2, updates=8, warmup=8), "smaller than"),
        (lambda: amp.amp_update(ResidualMLP(8, 16, 1, 1), F.mse_loss,
                                *regression_batch(4, 8), 2, order="late"), "order='late'"),
        (lambda: amp.amp_update(ResidualMLP(8, 16, 1, 1), F.mse_loss,
                                *regression_batch(4, 8), 5), "larger than"),
        (lambda: amp.amp_update(ResidualMLP(8, 16, 1, 1), F.mse_loss,
                                *regression_batch(4, 8), 2, max_norm=0.0), "max_norm"),
        (lambda: amp.amp_update(ResidualMLP(8, 16, 1, 1), F.mse_loss,
                                *regression_batch(4, 8), 2, init_scale=-1.0), "init_scale"),
        (lambda: amp.amp_update(ResidualMLP(8, 16, 1, 1), F.mse_loss,
                                *regression_batch(4, 8), 2, loss_weight=0.0), "loss_weight"),
        (lambda: formulas.convnet_activation_bytes(0, width=4, depth=1, size=4), "batch must be"),
        (lambda: pitfalls.dropout_grads(2, shared_masks=True, batch=4, seed=-1), "seed must be"),
    ],
)
def test_bad_arguments_raise_value_error(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize(
    "call",
    [
        lambda: pitfalls.norm_error_curve("batch", batch=8.0),
        lambda: pitfalls.lr_schedule(True),
        lambda: DropoutMLP(4, 8, 1, p="0.5"),
        lambda: amp.amp_update(ResidualMLP(8, 16, 1, 1), F.mse_loss,
                               *regression_batch(4, 8), 2, loss_weight=True),
    ],
)
def test_wrong_types_raise_type_error(call) -> None:
    with pytest.raises(TypeError):
        call()


