"""Unit tests for helpers.checkpointing (lesson 02), at tiny sizes."""

from __future__ import annotations

import contextlib
import functools
import warnings

import matplotlib.pyplot as plt
import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import CheckpointPolicy, checkpoint

from helpers import checkpointing as ckpt
from helpers.data import image_batch, token_batch
from helpers.device import seed_everything
from helpers.memory import new_live_bytes, saved_activation_bytes
from helpers.models import GPT, ConvNet, GPTConfig, explainer_model
from helpers.training import lm_loss

B, S, H, A = 2, 16, 16, 2


def _gpt(n_layers: int = 4, dropout: float = 0.1) -> tuple[GPT, torch.Tensor, torch.Tensor]:
    seed_everything(0)
    model = GPT(GPTConfig(vocab_size=32, seq_len=S, d_model=H, n_heads=A, n_layers=n_layers,
                          dropout=dropout))
    idx, targets = token_batch(B, S, 32)
    return model, idx, targets


def _loss(model: GPT, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return lm_loss(model(idx), targets)


def test_count_flops_linear() -> None:
    lin = torch.nn.Linear(8, 4, bias=False)
    assert ckpt.count_flops(lambda: lin(torch.randn(3, 8))) == 2 * 3 * 8 * 4
    with pytest.raises(ValueError, match="callable"):
        ckpt.count_flops(42)  # type: ignore[arg-type]


def test_block_wrapper_arguments() -> None:
    assert ckpt.make_block_wrapper("none") is None
    with pytest.raises(ValueError, match="policy"):
        ckpt.make_block_wrapper("some")
    with pytest.raises(ValueError, match="every"):
        ckpt.make_block_wrapper("full", every=0)


def test_full_and_selective_checkpointing() -> None:
    model, idx, targets = _gpt(n_layers=4)
    saved, extra, grads = {}, {}, {}
    for policy in ckpt.POLICIES:  # none, full, save-matmuls, attention-core
        model.block_wrapper = ckpt.make_block_wrapper(policy)
        saved[policy] = saved_activation_bytes(lambda: _loss(model, idx, targets))

        def step() -> None:
            _loss(model, idx, targets).backward()

        extra[policy] = ckpt.count_flops(step)
        model.zero_grad(set_to_none=True)
        seed_everything(1)
        step()
        grads[policy] = torch.cat([p.grad.flatten() for p in model.parameters()])
        model.zero_grad(set_to_none=True)
    model.block_wrapper = None
    for selective in ("save-matmuls", "attention-core"):
        assert saved["full"] < saved[selective] < saved["none"]
        assert extra["none"] < extra[selective] < extra["full"]
        torch.testing.assert_close(grads[selective], grads["none"])
    torch.testing.assert_close(grads["full"], grads["none"])


def test_every_other_block_lands_between() -> None:
    model, idx, targets = _gpt(n_layers=4)
    saved = {}
    for every in (1, 2):
        model.block_wrapper = ckpt.make_block_wrapper("full", every=every)
        saved[every] = saved_activation_bytes(lambda: _loss(model, idx, targets))
    model.block_wrapper = None
    plain = saved_activation_bytes(lambda: _loss(model, idx, targets))
    assert saved[1] < saved[2] < plain


def test_inference_saves_nothing() -> None:
    model, idx, _ = _gpt(n_layers=2)
    for policy in ("none", "full"):
        model.block_wrapper = ckpt.make_block_wrapper(policy)
        with torch.no_grad():
            assert new_live_bytes(lambda: model(idx)) == 0


def test_chain_arguments() -> None:
    with pytest.raises(ValueError, match="kind"):
        ckpt.make_chain(4, 8, "conv")
    with pytest.raises(ValueError, match="positive"):
        ckpt.make_chain(0, 8)
    chain = ckpt.make_chain(4, 8)
    with pytest.raises(ValueError, match="segments"):
        ckpt.segment_sweep(chain, torch.randn(2, 8), [0])
    with pytest.raises(ValueError, match="segments"):
        ckpt.segment_sweep(chain, torch.randn(2, 8), [5])
    with pytest.raises(ValueError, match="segments"):
        ckpt.segment_cost(1, 1, 4, 5)
    with pytest.raises(ValueError):
        ckpt.divisors(0)


def test_sqrt_n_optimum_for_equal_layers() -> None:
    n = 16
    chain = ckpt.make_chain(n, 16, "linear")
    x = torch.randn(8, 16)
    a, b = ckpt.chain_layer_costs(chain, x)
    assert a == b
    ks = ckpt.divisors(n)
    assert ks == [1, 2, 4, 8, 16]
    points = ckpt.segment_sweep(chain, x, ks)
    best = min(points, key=lambda p: p.saved_bytes)
    assert best.segments == 4
    # checkpoint_sequential with k equal segments keeps k - 1 boundaries + the last segment
    for p in points:
        assert p.saved_bytes == (p.segments - 1) * b + a * n // p.segments
        assert p.peak_bytes >= p.saved_bytes


def test_mlp_chain_prefers_more_segments() -> None:
    chain = ckpt.make_chain(16, 16, "mlp")
    x = torch.randn(8, 16)
    a, b = ckpt.chain_layer_costs(chain, x)
    assert 5 < a / b < 7
    points = ckpt.segment_sweep(chain, x, ckpt.divisors(16))
    assert min(points, key=lambda p: p.saved_bytes).segments == 8


def test_batchnorm_double_update_and_fix() -> None:
    images, labels = image_batch(8, size=8)

    def counts(context_fn: object | None) -> int:
        seed_everything(0)
        net = ConvNet(3, 4, 2, 10, norm="batch")
        kwargs = {} if context_fn is None else {"context_fn": lambda: context_fn(net)}
        net.block_wrapper = lambda block, x: checkpoint(block, x, use_reentrant=False, **kwargs)
        F.cross_entropy(net(images), labels).backward()
        return int(net.blocks[0][1].num_batches_tracked)

    assert counts(None) == 2
    assert counts(lambda net: (contextlib.nullcontext(), ckpt.freeze_batchnorm_stats(net))) == 1


def test_freeze_batchnorm_restores_momentum() -> None:
    net = ConvNet(3, 4, 1, 10, norm="batch")
    bn = net.blocks[0][1]
    with ckpt.freeze_batchnorm_stats(net):
        assert bn.momentum == 0.0
        bn(torch.randn(4, 4, 3, 3))
    assert bn.momentum == 0.1 and int(bn.num_batches_tracked) == 0


def test_trade_off_lab_widget_function() -> None:
    lab = ckpt.TradeOffLab(explainer_model("tiny", torch.device("cpu")), repeats=1)
    plain, ckpt_row = lab.measure(2, 4, False), lab.measure(2, 4, True)
    assert plain.effective_batch == ckpt_row.effective_batch == 8
    assert ckpt_row.memory.breakdown["activations"] < plain.memory.breakdown["activations"]
    assert plain.extra_flops == 0 < ckpt_row.extra_flops
    assert ckpt_row.flops_per_update == 2 * lab.measure(2, 2, True).flops_per_update  # linear in K
    assert lab.measure(2, 8, True).memory == ckpt_row.memory  # peak flat in K (cached from K = 2)
    assert ckpt_row.label == "2 x 4, checkpointed"
    with pytest.raises(ValueError, match="micro_batch"):
        lab.measure(0, 4, False)
    with pytest.raises(TypeError, match="steps"):
        lab.measure(2, True, False)
    with pytest.raises(TypeError):
        ckpt.TradeOffLab(torch.nn.Linear(2, 2))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="checkpointed must be a bool"):
        lab.measure(2, 4, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="optimizer='lion'"):
        ckpt.TradeOffLab(lab.model, optimizer="lion")
    with pytest.raises(ValueError, match="repeats"):
        ckpt.TradeOffLab(lab.model, repeats=0)
    lab.show(2, 4, True)
    plt.close("all")


def test_widget_latency_cases_cover_every_control() -> None:
    cases = ckpt.widget_latency_cases("tiny", torch.device("cpu"))
    assert {"B=2", "K=1", "checkpoint on"} <= set(cases)
    assert any(name.startswith("K=") and name != "K=1" for name in cases)
    cases["checkpoint on"]()
    plt.close("all")
    with pytest.raises(ValueError, match="scale"):
        ckpt.widget_latency_cases("huge", torch.device("cpu"))


@pytest.mark.parametrize("scale, limit", [("medium", 0.7 * 12e9), ("full", 0.7 * 40e9)])
def test_predicted_peak_fits_the_scale_class(scale: str, limit: float) -> None:
    assert 0 < ckpt.predicted_peak_bytes(scale) <= limit


def test_predicted_peak_bounds_the_measured_gpt_step() -> None:
    cfg, b = ckpt.gpt_setup("tiny")
    seed_everything(0)
    model = GPT(cfg)
    idx, targets = token_batch(b, cfg.seq_len, cfg.vocab_size)
    opt = torch.optim.Adam(model.parameters())

    def step() -> None:
        opt.zero_grad(set_to_none=False)
        _loss(model, idx, targets).backward()
        opt.step()

    step()
    from helpers.memory import measure_step

    measured = measure_step(step, model=model, optimizer=opt).peak_bytes
    assert measured <= ckpt.predicted_peak_bytes("tiny")
    with pytest.raises(ValueError, match="scale"):
        ckpt.predicted_peak_bytes("xl")


def _reentrant_call(block: torch.nn.Module, x: torch.Tensor, *, reentrant: bool) -> torch.Tensor:
    return ckpt.checkpoint_with(block, x, reentrant=reentrant)


def test_reentrant_trap_with_frozen_embeddings() -> None:
    model, idx, targets = _gpt(n_layers=2, dropout=0.0)
    model.tok.requires_grad_(False)
    model.pos.requires_grad_(False)
    missing = {}
    for reentrant in (False, True):
        model.block_wrapper = functools.partial(_reentrant_call, reentrant=reentrant)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _loss(model, idx, targets).backward()
        missing[reentrant] = (ckpt.params_without_grad(model), [str(w.message) for w in caught])
        model.zero_grad(set_to_none=True)
    assert missing[False] == ([], [])
    assert len(missing[True][0]) == 24 and all(n.startswith("blocks.") for n in missing[True][0])
    assert any("requires_grad=True" in m for m in missing[True][1])
    with pytest.raises(TypeError, match="reentrant"):
        ckpt.checkpoint_with(model.blocks[0], torch.randn(1, S, H), reentrant=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ckpt.params_without_grad("model")  # type: ignore[arg-type]


def test_segment_sizes_uneven_last_segment() -> None:
    assert ckpt.segment_sizes(9, 5) == [1, 1, 1, 1, 5]
    assert ckpt.segment_sizes(16, 4) == [4, 4, 4, 4]
    chain = ckpt.make_chain(9, 16)
    x = torch.randn(4, 16)
    a, b = ckpt.chain_layer_costs(chain, x)
    for k in (3, 5):
        (point,) = ckpt.segment_sweep(chain, x, [k])
        assert point.saved_bytes == (k - 1) * b + ckpt.segment_sizes(9, k)[-1] * a
    with pytest.raises(ValueError, match="segments"):
        ckpt.segment_sizes(9, 10)


def test_interleaved_times_shape_and_arguments() -> None:
    calls: list[str] = []
    times = ckpt.interleaved_times({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                                   repeats=3, warmup=1)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]  # warm-up, then alternating order
    for t in times.values():
        assert t.runs == 3 and t.low <= t.median <= t.high
        assert "min-max" in t.describe()
    assert times["a"].scaled(2).median == 2 * times["a"].median
    with pytest.raises(ValueError, match="repeats"):
        ckpt.interleaved_times({"a": lambda: None}, repeats=0)
    with pytest.raises(ValueError):
        ckpt.interleaved_times({})


def test_exercise_checkers() -> None:
    assert ckpt.check_exercise_1(109).startswith("Correct")
    assert ckpt.check_exercise_1(60).startswith("Hint")
    assert ckpt.check_exercise_1("a lot").startswith("Hint")

    def softmax_only(ctx: object, op: object, *args: object, **kwargs: object) -> CheckpointPolicy:
        if op is torch.ops.aten._softmax.default:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    assert ckpt.check_exercise_2(softmax_only).startswith("Correct")
    assert ckpt.check_exercise_2(ckpt.save_matmul_outputs).startswith("Hint")
    assert ckpt.check_exercise_2(None).startswith("Hint")
    assert ckpt.check_exercise_2(lambda *a, **k: 1 / 0).startswith("Hint")
    assert ckpt.check_exercise_3(2.0).startswith("Correct")
    assert ckpt.check_exercise_3(1).startswith("Hint")
    assert ckpt.check_exercise_3(None).startswith("Hint")
    assert ckpt.check_exercise_4(2, 1).startswith("Correct")
    assert ckpt.check_exercise_4(2, 2).startswith("Half right")
    assert ckpt.check_exercise_4(1, 1).startswith("Hint")
    assert ckpt.check_exercise_4(None, 1).startswith("Hint")


@pytest.mark.cuda
def test_cuda_trade_off_checkpointing_lowers_allocator_peak() -> None:
    lab = ckpt.TradeOffLab(explainer_model("tiny", torch.device("cuda")), repeats=1)
    plain, checkpointed = lab.measure(2, 2, False), lab.measure(2, 2, True)
    assert checkpointed.memory.method == "cuda-allocator"
    assert checkpointed.memory.peak_bytes < plain.memory.peak_bytes


def test_bools_are_not_ints() -> None:
    with pytest.raises(TypeError, match="n must be a positive int, got bool True"):
        ckpt.divisors(True)  # type: ignore[arg-type]
    assert ckpt.divisors(12) == [1, 2, 3, 4, 6, 12]
    with pytest.raises(TypeError, match="n must be a positive int"):
        ckpt.make_chain(True, 8)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="segments"):
        ckpt.segment_sizes(4, True)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="every"):
        ckpt.make_block_wrapper("full", every=True)  # type: ignore[arg-type]


def test_exercise_2_checker_leaves_the_global_rng_alone() -> None:
    state = torch.random.get_rng_state()
    assert ckpt.check_exercise_2(None).startswith("Hint")
    ckpt.check_exercise_2(lambda ctx, op, *args, **kwargs: CheckpointPolicy.PREFER_RECOMPUTE)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_trade_off_flops_against_an_independent_count() -> None:
    """TradeOffLab's FLOPs against FlopCounterMode around the lesson's own step (issue 16).

    Plain: K x one `lm_loss(model(idx), targets).backward()`, counted here. Checkpointed: the
    extra is the recomputation, at most one forward of every block (counted here, block by
    block) and at least half of it (non-reentrant checkpoint stops recomputing early, once
    every tensor backward needs is back, so the blocks' last matmuls may be skipped).
    """
    from torch.utils.flop_counter import FlopCounterMode

    model = explainer_model("tiny", torch.device("cpu"))
    lab = ckpt.TradeOffLab(model, repeats=1)
    b, k = 2, 3
    plain, ck = lab.measure(b, k, False), lab.measure(b, k, True)
    cfg = model.cfg
    idx, targets = token_batch(b, cfg.seq_len, cfg.vocab_size, seed=0)
    with FlopCounterMode(display=False) as step:
        lm_loss(model(idx), targets).backward()
    model.zero_grad(set_to_none=True)
    h = torch.randn(b, cfg.seq_len, cfg.d_model)
    with torch.no_grad(), FlopCounterMode(display=False) as blocks:
        for block in model.blocks:
            h = block(h)
    forward_of_blocks = k * blocks.get_total_flops()
    assert plain.flops_per_update == ck.plain_flops_per_update == k * step.get_total_flops()
    assert plain.extra_flops == 0
    assert 0.5 * forward_of_blocks <= ck.extra_flops <= forward_of_blocks, (ck.extra_flops, forward_of_blocks)
