"""helpers.techniques.amp (lesson 04): mixed precision with accumulation, the right order and the wrong ones.

Every update is held against the same update in float32 (`amp=False`); the arguments' checks are
with lesson 04's others in `tests/techniques/test_pitfalls.py`.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers.core.data import regression_batch
from helpers.models.nets import ResidualMLP
from helpers.techniques import amp
from helpers.techniques.accumulation import compare_grads


# -- Mixed precision -----------------------------------------------------------------
def _amp_setup() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    model = ResidualMLP(8, 16, 1, 1)
    x, y = regression_batch(16, 8, 1, seed=3)
    return model, x, y


def test_amp_orders_table() -> None:
    assert amp.AMP_ORDERS == ("correct", "unscale_each", "update_each", "unscale_update_each",
                              "clip_before_unscale")


def test_amp_dtype() -> None:
    assert amp.amp_dtype("cpu") == torch.float16
    assert amp.amp_dtype("cuda") == torch.float16


def test_amp_correct_order_matches_float32() -> None:
    model, x, y = _amp_setup()
    ref = amp.amp_update(model, F.mse_loss, x, y, 4, amp=False)
    out = amp.amp_update(model, F.mse_loss, x, y, 4)
    assert out.error is None and not out.skipped
    assert compare_grads(ref.applied, out.applied).l2_rel < 3e-2


def test_amp_wrong_orders_raise_or_shrink() -> None:
    model, x, y = _amp_setup()
    ref = amp.amp_update(model, F.mse_loss, x, y, 4, amp=False)
    assert "already been called" in amp.amp_update(
        model, F.mse_loss, x, y, 4, order="unscale_each").error
    assert "No inf checks" in amp.amp_update(
        model, F.mse_loss, x, y, 4, order="update_each").error
    for order in ("unscale_update_each", "clip_before_unscale"):
        out = amp.amp_update(model, F.mse_loss, x, y, 4, order=order)
        assert compare_grads(ref.applied, out.applied).norm_ratio < 1e-2, order


def test_clip_before_unscale_sees_the_scaled_norm() -> None:
    model, x, y = _amp_setup()
    ref = amp.amp_update(model, F.mse_loss, x, y, 4, amp=False)
    out = amp.amp_update(model, F.mse_loss, x, y, 4, order="clip_before_unscale")
    assert out.scale == 2.0**10
    assert abs(out.clip_norm / (out.scale * ref.clip_norm) - 1) < 1e-2
    assert abs(out.applied.norm().item() * out.scale - 1.0) < 1e-2  # max_norm / S


def test_fp16_underflow_without_scaler() -> None:
    model, x, y = _amp_setup()
    under = amp.fp16_underflow(model, F.mse_loss, x, y, 4, loss_weight=1e-5)
    assert under.zeroed_plain >= 0.05 * under.nonzero, under
    assert under.zeroed_scaled <= 0.1 * under.zeroed_plain, under
    assert under.error_plain > 10 * under.error_scaled and under.scale == 2.0**16


@pytest.mark.cuda
def test_amp_fp16_on_cuda() -> None:
    model, x, y = _amp_setup()
    model, x, y = model.cuda(), x.cuda(), y.cuda()
    ref = amp.amp_update(model, F.mse_loss, x, y, 4, amp=False)
    out = amp.amp_update(model, F.mse_loss, x, y, 4)
    assert out.error is None and not out.skipped
    assert compare_grads(ref.applied, out.applied).l2_rel < 1e-2
