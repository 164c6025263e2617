"""Tests of helpers.measure.formulas: every memory formula against an independent count or a measurement."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers.core.data import image_batch, regression_batch, token_batch
from helpers.core.training import lm_loss
from helpers.measure import formulas
from helpers.measure.formulas import (
    activation_bytes_per_example,
    held_logits_bytes_per_example,
    linear_fit,
    predicted_update_peak_bytes,
)
from helpers.models.gpt import GPT, GPTConfig, explainer_config, explainer_model, seeded_gpt
from helpers.models.nets import ConvNet, ResidualMLP
from helpers.techniques.update_memory import ConfigMemory, activation_sweep, measure_update

CPU = torch.device("cpu")


def test_linear_fit() -> None:
    fit = linear_fit([1, 2, 3, 4], [3, 5, 7, 9])
    assert fit.slope == pytest.approx(2) and fit.intercept == pytest.approx(1) and fit.r2 == pytest.approx(1)
    with pytest.raises(ValueError, match="distinct"):
        linear_fit([2, 2], [1, 3])
    with pytest.raises(ValueError, match="equal-length"):
        linear_fit([1, 2], [1])


# -- the drawn budget, the formulas, the shortcut (issue 10/11 items of lesson 01) -------------


def test_formula_matches_the_tracker_at_tiny() -> None:
    model = explainer_model("tiny", CPU)
    sweep = activation_sweep(model, [2, 3, 4], progress=False)
    fit = linear_fit(list(sweep), [m.breakdown["activations"] for m in sweep.values()])
    # at the peak the activations are what autograd saved plus the logits the loop's variable holds
    held = held_logits_bytes_per_example(model.cfg)
    assert fit.slope == pytest.approx(activation_bytes_per_example(model.cfg) + held, rel=0.01)
    for b, m in sweep.items():
        assert m.peak_bytes == pytest.approx(predicted_update_peak_bytes(model.cfg, b), rel=0.01)
    one_step = measure_update(model, micro_batch=2, steps=1)
    assert one_step.breakdown["gradients"] == 0
    assert one_step.peak_bytes == pytest.approx(predicted_update_peak_bytes(model.cfg, 2, steps=1), rel=0.01)
    sgd = measure_update(model, micro_batch=2, steps=2, optimizer="sgd")
    predicted_sgd = predicted_update_peak_bytes(model.cfg, 2, optimizer="sgd")
    assert sgd.peak_bytes == pytest.approx(predicted_sgd, rel=0.01)


def test_formula_refuses_other_models() -> None:
    with pytest.raises(ValueError, match="dropout=0.0"):
        activation_bytes_per_example(GPTConfig(dropout=0.1))
    with pytest.raises(ValueError, match="fused_attention"):
        predicted_update_peak_bytes(GPTConfig(dropout=0.0, fused_attention=True), 2)
    with pytest.raises(TypeError, match="GPTConfig"):
        activation_bytes_per_example({"d_model": 64})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="micro_batch"):
        predicted_update_peak_bytes(explainer_config("tiny"), 0)


def test_linear_fit_on_noisy_data_matches_numpy() -> None:
    """R^2 on noisy data against numpy (issue 16: an R^2 stuck at 1.0 passed the perfect line)."""
    rng = np.random.default_rng(3)
    xs = np.arange(1.0, 21.0)
    ys = 3.0 * xs + 2.0 + rng.normal(0.0, 6.0, xs.size)
    slope, intercept = np.polyfit(xs, ys, 1)
    r2 = np.corrcoef(xs, ys)[0, 1] ** 2  # R^2 of a least-squares line is the squared correlation
    fit = linear_fit(xs.tolist(), ys.tolist())
    assert 0.5 < r2 < 0.99  # noisy enough that "R^2 = 1" is caught
    assert fit.slope == pytest.approx(slope, rel=1e-9)
    assert fit.intercept == pytest.approx(intercept, rel=1e-9)
    assert fit.r2 == pytest.approx(r2, rel=1e-9)
    flat = linear_fit([1, 2, 3, 4], [5.0, 5.0, 5.0, 5.0])  # nothing to explain: a perfect fit
    assert (flat.slope, flat.intercept, flat.r2) == (0.0, 5.0, 1.0)


# -- issue 16: survivors of the mutation run, killed with independent values ------------------
TINY = GPTConfig(vocab_size=5, seq_len=3, d_model=4, n_heads=2, n_layers=2, dropout=0.0)
OTHER = GPTConfig(vocab_size=7, seq_len=5, d_model=8, n_heads=2, n_layers=3, dropout=0.0)


def _gpt(cfg: GPTConfig) -> GPT:
    return seeded_gpt(cfg, CPU, seed=0)


def _saved_float_bytes(model: GPT, b: int) -> int:
    """Float32 bytes autograd saves for one forward + loss, counted by torch's saved-tensor hooks.

    Each storage counts once; parameters and scalars (the loss) are left out, as are the int64
    token ids, positions and targets (the formula counts float32 activations only).
    """
    cfg = model.cfg
    idx, targets = token_batch(b, cfg.seq_len, cfg.vocab_size, seed=0)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in params and t.dtype == torch.float32 and t.dim() > 0:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lm_loss(model(idx), targets)
    return sum(seen.values())


@pytest.mark.parametrize("cfg", [TINY, OTHER], ids=["L2", "L3"])
def test_activation_formula_equals_what_autograd_saves(cfg: GPTConfig) -> None:
    """Exact, on configs small enough that the LayerNorm statistics (2s per norm) weigh in."""
    model = _gpt(cfg)
    one, two = _saved_float_bytes(model, 1), _saved_float_bytes(model, 2)
    assert two == 2 * one  # everything counted scales with the batch
    assert activation_bytes_per_example(cfg) == one




def test_predicted_peak_terms_match_independent_counts(
    optimizer_state_bytes: Callable[[torch.nn.Module, str], int],
) -> None:
    """Each term of the predicted peak against a count that does not use the formula.

    - per example: the saved float32 activations (hooks) plus the logits' and their log-softmax's
      gradients, each the size of the logits (the model's output);
    - gradients: the parameters' bytes, present only from the second micro-step on;
    - optimizer state: what torch's own optimizers keep after a step (Adam: two tensors per
      parameter and a float32 step counter per tensor; momentum SGD: one buffer; SGD: nothing);
    - fixed: the causal-mask buffers (bool, L s^2), the int64 positions (s) and two float32 loss
      scalars: 2*3*3 + 8*3 + 2*4 = 50 bytes for TINY.
    """
    model = _gpt(TINY)
    params = sum(p.nbytes for p in model.parameters())
    idx, _ = token_batch(1, TINY.seq_len, TINY.vocab_size, seed=0)
    with torch.no_grad():
        logits_bytes = model(idx).nbytes

    def pred(b: int, optimizer: str = "sgd", steps: int = 1) -> int:
        return predicted_update_peak_bytes(TINY, b, optimizer=optimizer, steps=steps)

    per_example = pred(2) - pred(1)
    # saved by autograd, the logits held by the loop's `predictions` variable, and two logits-sized gradients
    assert per_example == _saved_float_bytes(model, 1) + logits_bytes + 2 * logits_bytes
    assert held_logits_bytes_per_example(TINY) == logits_bytes
    fixed = pred(1) - per_example - params  # SGD, one micro-step: no gradients, no state
    masks = sum(b.nbytes for b in model.buffers())
    assert masks == TINY.n_layers * TINY.seq_len**2
    assert fixed == masks + torch.arange(TINY.seq_len).nbytes + 2 * 4 == 50
    assert pred(1, steps=2) - pred(1) == params  # the gradients
    for optimizer in ("sgd-momentum", "adam", "adamw"):
        state = optimizer_state_bytes(model, optimizer)
        assert pred(1, optimizer) - pred(1) == state, optimizer
    assert optimizer_state_bytes(model, "adam") == 2 * params + 4 * len(list(model.parameters()))


def test_result_rows_are_frozen() -> None:
    row = ConfigMemory(2, 4, 10, 5, 3, 2, "cpu-tracker")
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.peak_bytes = 0  # type: ignore[misc]
    fit = linear_fit([1, 2], [1, 2])
    with pytest.raises(dataclasses.FrozenInstanceError):
        fit.r2 = 0.5  # type: ignore[misc]


def _exact_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares slope and R^2 in exact rational arithmetic."""
    x, y = [Fraction(v) for v in xs], [Fraction(v) for v in ys]
    xm, ym = sum(x) / len(x), sum(y) / len(y)
    sxy = sum((a - xm) * (b - ym) for a, b in zip(x, y, strict=True))
    sxx = sum((a - xm) ** 2 for a in x)
    syy = sum((b - ym) ** 2 for b in y)
    return float(sxy / sxx), float(sxy * sxy / (sxx * syy))


def test_linear_fit_is_exact_on_a_large_floor_and_on_small_values() -> None:
    """Bytes sit on a large floor (~1e9): the centred sums keep the slope to 1e-12 of the exact one.
    Values below 1 (total variance < 1) still get their true R^2, not 1."""
    xs = [0.1 * i for i in range(1, 9)]
    ys = [1e9 + 3.0 * i + 0.1 * ((i * 7) % 5) for i in range(8)]
    slope, _ = _exact_fit(xs, ys)
    assert linear_fit(xs, ys).slope == pytest.approx(slope, rel=1e-12)
    small_x = [1.0, 2.0, 3.0, 4.0, 5.0]
    small_y = [0.10, 0.35, 0.22, 0.51, 0.40]
    slope, r2 = _exact_fit(small_x, small_y)
    fit = linear_fit(small_x, small_y)
    assert 0.3 < r2 < 0.9
    assert fit.slope == pytest.approx(slope, rel=1e-12) and fit.r2 == pytest.approx(r2, rel=1e-12)


def test_activation_formulas_match_measurement() -> None:
    from helpers.measure.memory import saved_activation_bytes

    model = ConvNet(3, 16, 3, 10, norm="batch")
    x, y = image_batch(8, size=8)
    act = saved_activation_bytes(lambda: F.cross_entropy(model(x), y))
    pred = formulas.convnet_activation_bytes(8, width=16, depth=3, size=8)
    assert act <= pred <= 1.1 * act, (act, pred)
    mlp = ResidualMLP(32, 64, 2, 1)
    x, y = regression_batch(16, 32, 1)
    act = saved_activation_bytes(lambda: F.mse_loss(mlp(x), y))
    pred = formulas.mlp_activation_bytes(16, d_in=32, width=64, depth=2)
    assert act <= pred <= 1.1 * act, (act, pred)


# -- mutation survivors (fresh run): published counts written out by hand for TINY ------------
# TINY: V=5, s=3, h=4, a=2, L=2. Per block, by hand: 2*2h (two LayerNorms) + 3h^2+3h (qkv)
# + h^2+h (proj) + 4h^2+4h (fc_in) + 4h^2+h (fc_out) = 16+60+20+80+68 = 244; embeddings (V+s)h = 32,
# final LayerNorm 2h = 8, untied head hV = 20: 32 + 2*244 + 8 + 20 = 548.
TINY_PARAMS = 548


def test_gpt_param_count_by_hand_and_by_torch() -> None:
    """gpt_param_count(TINY) is the hand count 548 and the numel of the built model."""
    assert formulas.gpt_param_count(TINY) == TINY_PARAMS
    assert sum(p.numel() for p in _gpt(TINY).parameters()) == TINY_PARAMS


def test_gpt_activation_bytes_is_korthikanti_without_dropout_by_hand() -> None:
    """Korthikanti 34sbh + 5as^2b less the dropout terms (32sbh + 2as^2b, 16-bit), + 2sbh + sbV, by hand."""
    # b=2: sbh = 24, as^2b = 36, sbV = 30. fp32 (x2 of the 16-bit bytes): layer = 64*24 + 4*36 = 1680;
    # L layers = 3360; final LayerNorm in/out and log-softmax: 4*(2*24 + 30) = 312.
    assert formulas.gpt_activation_bytes(TINY, 2) == 3360 + 312
    # 16-bit: layer = 32*24 + 2*36 = 840, L layers = 1680, plus 2*(48 + 30) = 156
    assert formulas.gpt_activation_bytes(TINY, 2, dtype_bytes=2) == 1680 + 156


def test_gpt_step_peak_bytes_by_hand() -> None:
    """16 bytes/param + (L+1) fp32 Korthikanti layers (4-byte masks) + three logits, written out for b=2."""
    # no dropout: layer = 64*24 + 4*36 = 1680 (see above); logits 3 * b*s*V * 4 = 3*30*4 = 360
    assert formulas.gpt_step_peak_bytes(TINY, 2) == 16 * TINY_PARAMS + 3 * 1680 + 360 == 14168
    # dropout 0.5: fp32 acts 64 sbh + two 4-byte sbh masks (8 sbh) = 72*24 = 1728; softmax, its
    # 4-byte mask and the dropout output: 12*36 = 432; layer = 2160
    drop = dataclasses.replace(TINY, dropout=0.5)
    assert formulas.gpt_step_peak_bytes(drop, 2) == 16 * TINY_PARAMS + 3 * 2160 + 360 == 15608


def test_predicted_step_peak_bytes_by_hand() -> None:
    """16 bytes/param + per sequence the activations (by hand: 1956 B) and two sV float gradients."""
    # elements per example: L(16sh + as^2) + 2sh + 2(2L+1)s + sV = 2*(192+18) + 24 + 30 + 15 = 489
    assert activation_bytes_per_example(TINY) == 4 * 489 == 1956
    per_seq = 1956 + 2 * 4 * 3 * 5
    assert formulas.predicted_step_peak_bytes(TINY, 2) == 16 * TINY_PARAMS + 2 * per_seq == 12920


def test_convnet_formulas_by_hand_and_by_torch() -> None:
    """ConvNet activations and parameters with the default 3 input channels and 10 classes, by hand."""
    # per image: size^2 (in + 2 width depth) + width = 16 * (3 + 12) + 3 = 243; batch 2, fp32
    assert formulas.convnet_activation_bytes(2, width=3, depth=2, size=4) == 2 * 243 * 4
    # bias-free 3x3 convs 9w(in + w(d-1)) = 9*3*(3+6) = 243, BatchNorm 2wd = 18, head w*10 + 10 = 40
    assert formulas.convnet_param_count(3, 3) == 243 + 18 + 40
    assert sum(p.numel() for p in ConvNet(3, 3, 3, 10).parameters()) == 301
    assert formulas.convnet_param_count(5, 4, in_channels=2, classes=7) == sum(
        p.numel() for p in ConvNet(2, 5, 4, 7).parameters())


CONVNET_ARGS = {"batch": 2, "width": 3, "depth": 2, "size": 4, "in_channels": 3, "dtype_bytes": 4}
MLP_ARGS = {"n": 2, "d_in": 3, "width": 4, "depth": 2, "expansion": 4, "dtype_bytes": 4}


@pytest.mark.parametrize(("fn", "name"), [*(("convnet_activation_bytes", n) for n in CONVNET_ARGS),
                                          *(("mlp_activation_bytes", n) for n in MLP_ARGS)])
def test_activation_formulas_name_the_bad_argument(fn: str, name: str) -> None:
    """A zero argument is refused with a message that starts with its own name."""
    kwargs = dict(CONVNET_ARGS if fn.startswith("convnet") else MLP_ARGS)
    kwargs[name] = 0
    first = kwargs.pop(next(iter(kwargs)))
    with pytest.raises(ValueError, match=f"^{name} must"):
        getattr(formulas, fn)(first, **kwargs)
