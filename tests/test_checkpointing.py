"""Unit tests for helpers.checkpointing (lesson 02), at tiny sizes."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import warnings
from collections.abc import Callable

import matplotlib.pyplot as plt
import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import CheckpointPolicy, checkpoint

from helpers import checkpointing as ckpt
from helpers import costs
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

        extra[policy] = costs.count_flops(step)
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


def test_every_other_block_checkpoints_blocks_0_2_4(monkeypatch: pytest.MonkeyPatch) -> None:
    # The docstring: the first block, then every `every`-th after it. With 5 blocks and every=2
    # that is blocks 0, 2 and 4 (counted by hand), and only those reach `checkpoint`.
    model, idx, targets = _gpt(n_layers=5, dropout=0.0)
    index_of = {id(block): i for i, block in enumerate(model.blocks)}
    reached: list[int] = []

    def recording_checkpoint(fn: Callable[..., torch.Tensor], *args: object,
                             **kwargs: object) -> torch.Tensor:
        reached.append(index_of[id(fn)])
        return checkpoint(fn, *args, **kwargs)

    monkeypatch.setattr(ckpt, "checkpoint", recording_checkpoint)
    model.block_wrapper = ckpt.make_block_wrapper("full", every=2)
    _loss(model, idx, targets).backward()
    assert reached == [0, 2, 4]


def test_every_other_block_of_three_keeps_one_blocks_activations() -> None:
    # 3 equal blocks (no dropout), every=2 checkpoints blocks 0 and 2 and leaves one block plain,
    # so it keeps exactly one third of what checkpointing all three saves over none.
    model, idx, targets = _gpt(n_layers=3, dropout=0.0)
    saved = {}
    for every in (None, 1, 2):
        model.block_wrapper = None if every is None else ckpt.make_block_wrapper("full", every=every)
        saved[every] = saved_activation_bytes(lambda: _loss(model, idx, targets))
    per_block = (saved[None] - saved[1]) / 3
    assert per_block > 0
    assert saved[2] - saved[1] == pytest.approx(per_block, rel=0.02)


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


def test_exercise_checkers() -> None:
    assert ckpt.check_exercise_1(109).startswith("Correct")
    # fp32, 4-byte masks, by hand: sbh terms 32 two-byte elements -> 64 B plus 2 masks x 4 B = 72;
    # as^2b terms 4 two-byte elements -> 8 B plus 1 mask x 4 B = 12; 12 * 4 * s / 64 > 72 -> s > 96
    assert "12as/h > 72, s > 96)" in ckpt.check_exercise_1(109)
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
    assert ckpt.check_exercise_3(None).startswith("Hint")
    assert ckpt.check_exercise_4(2, 1).startswith("Correct")
    assert ckpt.check_exercise_4(2, 2).startswith("Half right")
    assert ckpt.check_exercise_4(1, 1).startswith("Hint")
    assert ckpt.check_exercise_4(None, 1).startswith("Hint")


def test_exercise_3_checker_agrees_with_the_lessons_own_measurement() -> None:
    """A ReLU's saved output is the next Linear's saved input: one storage, so a/b = 1 (issue 21).

    Measured here with the lesson's own instruments (`chain_layer_costs`, `segment_sweep`) on a
    chain the checker does not build (another width and batch, another seed).
    """
    torch.manual_seed(3)
    x = torch.randn(24, 40)
    chains = {kind: ckpt.make_chain(16, 40, kind) for kind in ("linear", ckpt.EXERCISE_CHAIN)}
    costs = {kind: ckpt.chain_layer_costs(chain, x) for kind, chain in chains.items()}
    best = {kind: min(ckpt.segment_sweep(chain, x, ckpt.divisors(16)), key=lambda p: p.saved_bytes).segments
            for kind, chain in chains.items()}
    a, b = costs[ckpt.EXERCISE_CHAIN]
    assert a == b == x.numel() * 4  # the Linear's input; the ReLU's output is that same storage downstream
    assert best[ckpt.EXERCISE_CHAIN] == best["linear"] == 4  # the optimum k does not move
    assert ckpt.check_exercise_3(a / b).startswith("Correct")
    assert ckpt.check_exercise_3(2.0).startswith("Hint") and "once" in ckpt.check_exercise_3(2.0)
    assert ckpt.check_exercise_3(6).startswith("Hint")
    measured = ckpt.exercise_3_measurement()
    assert measured[ckpt.EXERCISE_CHAIN] == measured["linear"] == (1.0, 4)
    with pytest.raises(ValueError, match="kind"):
        ckpt.make_chain(4, 8, "relu-linear")


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


# ---------------------------------------------------------------------------
# Issue 16: tests written against the surviving mutants of helpers/checkpointing.py
# ---------------------------------------------------------------------------


def test_result_objects_are_frozen() -> None:
    timing = costs.Timing(1.0, 0.5, 2.0, 3)
    point = ckpt.SegmentPoint(2, 10, 20)
    row = ckpt.TradeOff(2, 4, False, None, 8, 8, timing)  # type: ignore[arg-type]
    for obj, field in ((timing, "median"), (point, "saved_bytes"), (row, "steps")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, field, 0)


def test_default_block_wrapper_matches_the_notebooks_checkpoint_call() -> None:
    """Each policy against the `checkpoint(...)` call the lesson writes out (issue 16, item 4).

    "full" with the default `every` checkpoints every block, like the notebook's lambda;
    "save-matmuls" and "attention-core" pass their own policy as `context_fn`.
    """
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    model, idx, targets = _gpt(n_layers=4)

    def kept(wrapper: object) -> int:
        model.block_wrapper = wrapper
        try:
            return saved_activation_bytes(lambda: _loss(model, idx, targets))
        finally:
            model.block_wrapper = None

    def selective(policy: object) -> object:
        context = functools.partial(create_selective_checkpoint_contexts, policy)
        return lambda block, x: checkpoint(block, x, use_reentrant=False, context_fn=context)

    notebook = {
        "full": lambda block, x: checkpoint(block, x, use_reentrant=False),
        "save-matmuls": selective(ckpt.save_matmul_outputs),
        "attention-core": selective(ckpt.attention_core_policy(B, A)),
    }
    expected = {policy: kept(wrapper) for policy, wrapper in notebook.items()}
    assert len(set(expected.values())) == 3  # the three policies keep different amounts
    assert {policy: kept(ckpt.make_block_wrapper(policy)) for policy in notebook} == expected


def test_chain_layer_costs_single_and_parameter_free_layers() -> None:
    """A one-layer chain works (the first layer is measured), and a layer without parameters
    (Tanh keeps its output) still counts: a = b, one boundary-sized tensor."""
    x = torch.randn(4, 8)
    b = 4 * 8 * 4
    assert ckpt.chain_layer_costs(ckpt.make_chain(1, 8), x) == (b, b)
    assert ckpt.chain_layer_costs(torch.nn.Sequential(torch.nn.Tanh(), torch.nn.Tanh()), x) == (b, b)


def test_segment_cost_hand_computed() -> None:
    # a = 3, b = 2, n = 8 layers, k = 4 segments: 3 * 8 / 4 + 2 * 4 = 6 + 8 = 14
    assert ckpt.segment_cost(3, 2, 8, 4) == 14
    assert ckpt.segment_cost(3, 2, 8, 1) == 3 * 8 + 2


@pytest.mark.parametrize("n, k", [(1, 1), (4, 1), (4, 4)])
def test_segment_sweep_peak_hand_counted(n: int, k: int) -> None:
    """Linear chain, b = 128 bytes (4 x 8 fp32), k = 1 or k = n: peak = (n + 2) b + 8.

    Alive at the peak: the n + 1 boundary tensors of forward (the input, which requires grad,
    and every layer's output; non-reentrant checkpoint stops recomputing once it has a
    Linear's input back, so the recompute adds none), one gradient of a boundary, and two
    4-byte scalars (y.sum() and its gradient seed). Saved after forward: n boundaries.
    """
    seed_everything(0)
    chain = ckpt.make_chain(n, 8, "linear")
    b = 4 * 8 * 4
    (point,) = ckpt.segment_sweep(chain, torch.randn(4, 8), [k])
    assert (point.saved_bytes, point.peak_bytes) == (n * b, (n + 2) * b + 8)
    assert all(p.grad is None for p in chain.parameters())  # the sweep leaves no gradients behind


def test_sizes_per_scale_as_the_lesson_uses_them() -> None:
    """The sizes each scale runs (the notebook prints them); medium and full are sized for the
    class's GPU memory (checked by test_predicted_peak_fits_the_scale_class)."""
    shapes = {  # block (b, s, h, a), selective block (b, s, h, a), chain (width, batch), widget max B
        "tiny": ((4, 32, 32, 2), (2, 64, 16, 4), (32, 16), 8),
        "small": ((8, 64, 64, 4), (4, 256, 64, 4), (128, 64), 16),
        "medium": ((4, 1024, 512, 8), (2, 1024, 512, 8), (1024, 512), 8),
        "full": ((8, 1024, 1024, 16), (4, 1024, 1024, 16), (1024, 1024), 8),
    }
    gpt = {  # (vocab, seq_len, d_model, heads, layers), micro-batch; dropout 0.1 everywhere
        "tiny": ((64, 32, 32, 2, 8), 4),
        "small": ((128, 64, 64, 4, 8), 8),
        "medium": ((8192, 1024, 512, 8, 8), 4),
        "full": ((8192, 1024, 1024, 16, 12), 4),
    }
    for scale, (block, selective, chain, top) in shapes.items():
        assert ckpt.block_shape(scale) == block, scale
        assert ckpt.selective_shape(scale) == selective, scale
        b, s, h, a = selective
        assert a * s // h == 16  # the docstring's a*s/h = 16 at every scale
        assert ckpt.chain_shape(scale) == chain, scale
        assert ckpt.widget_max_micro_batch(scale) == top, scale
        cfg, micro_batch = ckpt.gpt_setup(scale)
        sizes = (cfg.vocab_size, cfg.seq_len, cfg.d_model, cfg.n_heads, cfg.n_layers)
        assert (sizes, micro_batch) == gpt[scale], scale
        assert cfg.dropout == 0.1
    assert ckpt.WIDGET_MAX_STEPS == 16  # the K slider's top
    # sqrt(n) is a whole number and one of the divisors, so the best k lies on the sweep
    for n in ckpt.CHAIN_LENGTHS:
        assert round(n ** 0.5) ** 2 == n and round(n ** 0.5) in ckpt.divisors(n)
    assert ckpt.CHAIN_LENGTHS == (16, 36, 64)


@pytest.mark.parametrize("scale", ["tiny", "small", "medium", "full"])
def test_predicted_peak_from_independent_counts(scale: str) -> None:
    """The section GPT's Adam step, the largest experiment at every scale, from its parts:

    - 16 bytes per parameter, the parameters counted by torch on a meta-device GPT;
    - Korthikanti's per-layer bytes in fp32 with 4-byte CPU dropout masks, written out:
      16-bit sbh(34 + 5as/h) is 32 sbh activation bytes + 2 sbh mask bytes and 4 as^2b
      activation bytes + as^2b mask bytes, so fp32 gives 72 sbh + 12 as^2b; for every block
      and one more (backward's working set);
    - three fp32 logits-sized tensors (b, s, vocab) for the loss.
    """
    from helpers.models import GPT

    cfg, b = ckpt.gpt_setup(scale)
    with torch.device("meta"):
        n_params = sum(p.numel() for p in GPT(cfg).parameters())
    s, h, a = cfg.seq_len, cfg.d_model, cfg.n_heads
    layer = 72 * s * b * h + 12 * a * s * s * b
    expected = 16 * n_params + (cfg.n_layers + 1) * layer + 3 * b * s * cfg.vocab_size * 4
    assert ckpt.predicted_peak_bytes(scale) == expected


def test_trade_off_reference_rows_and_labels() -> None:
    """The explainer's three rows: 8 x 4 and 4 x 8 without checkpointing, 4 x 8 with it."""
    assert [b * k for b, k, _ in ckpt.REFERENCE_ROWS] == [32, 32, 32]
    assert [(b, on) for b, _, on in ckpt.REFERENCE_ROWS] == [(8, False), (4, False), (4, True)]
    timing = costs.Timing(1.0, 1.0, 1.0, 1)
    assert ckpt.TradeOff(8, 4, False, None, 0, 0, timing).label == "8 x 4"  # type: ignore[arg-type]


def test_trade_off_lab_defaults_smallest_controls_and_messages() -> None:
    model = explainer_model("tiny", torch.device("cpu"))
    lab = ckpt.TradeOffLab(model)
    row = lab.measure(1, 1, False)  # the sliders' smallest B and K
    assert (row.micro_batch, row.steps, row.effective_batch) == (1, 1, 1)
    assert row.time_per_update.runs == 3  # the notebook: "the median of three interleaved micro-steps"
    with pytest.raises(TypeError, match="^model must be a helpers.models.GPT, got Linear"):
        ckpt.TradeOffLab(torch.nn.Linear(2, 2))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="^repeats must"):
        ckpt.TradeOffLab(model, repeats=0)


def test_trade_off_lab_measures_memory_on_at_most_two_micro_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Memory comes from an update of min(K, 2) micro-steps, measured once per (B, min(K, 2), on)."""
    from helpers.phases import measure_update

    steps_measured: list[int] = []

    def spy(*args: object, **kwargs: object) -> object:
        steps_measured.append(kwargs["steps"])
        return measure_update(*args, **kwargs)

    monkeypatch.setattr(ckpt, "measure_update", spy)
    lab = ckpt.TradeOffLab(explainer_model("tiny", torch.device("cpu")), repeats=1)
    for k in (1, 8, 2, 16):
        lab.measure(1, k, False)
    assert steps_measured == [1, 2]


def test_micro_step_restores_the_wrapper_and_clears_gradients() -> None:
    model = explainer_model("tiny", torch.device("cpu"))
    lab = ckpt.TradeOffLab(model, repeats=1)

    def own(block: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return block(x)

    model.block_wrapper = own
    lab.micro_step(2, True)()
    assert model.block_wrapper is own
    assert all(p.grad is None for p in model.parameters())


def test_micro_costs_time_without_an_extra_warmup() -> None:
    """FLOP counting runs each step once (the warm-up); then `repeats` timed runs of each:
    2 + 2 x 2 = 6 forwards of the model for repeats = 2."""
    model = explainer_model("tiny", torch.device("cpu"))
    lab = ckpt.TradeOffLab(model, repeats=2)
    forwards: list[int] = []
    handle = model.register_forward_pre_hook(lambda module, args: forwards.append(1))
    try:
        lab._micro_costs(2)
    finally:
        handle.remove()
    assert len(forwards) == 2 + 2 * 2


def test_checkpointed_trade_off_flops_match_the_notebooks_lambda() -> None:
    """The lab's checkpointed FLOPs against FlopCounterMode around the notebook's own
    `checkpoint(block, x, use_reentrant=False)` step (issue 16, item 4)."""
    from torch.utils.flop_counter import FlopCounterMode

    model = explainer_model("tiny", torch.device("cpu"))
    lab = ckpt.TradeOffLab(model, repeats=1)
    b, k = 2, 3
    row = lab.measure(b, k, True)
    idx, targets = token_batch(b, model.cfg.seq_len, model.cfg.vocab_size, seed=0)
    model.block_wrapper = lambda block, x: checkpoint(block, x, use_reentrant=False)
    try:
        with FlopCounterMode(display=False) as counter:
            lm_loss(model(idx), targets).backward()
    finally:
        model.block_wrapper = None
        model.zero_grad(set_to_none=True)
    assert row.flops_per_update == k * counter.get_total_flops()


def test_widget_latency_cases_name_every_slider_end() -> None:
    cases = ckpt.widget_latency_cases("tiny", torch.device("cpu"))
    assert set(cases) == {"B=2", "B=8", "K=1", "K=16", "checkpoint on"}  # tiny: B up to 8, K up to 16


def test_predicted_peak_other_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    """The smaller experiments' candidates, each made the largest by taking the others away.

    - single blocks (sections 1 and 5): twice Korthikanti's fp32 bytes with 4-byte masks,
      72 sbh + 12 as^2b (saved tensors plus backward's temporaries); at `small` the
      selective block (b, s, h, a) = (4, 256, 64, 4) is the larger;
    - the MLP chain at k = 1: its 64 layers with 8 boundary-sized fp32 tensors each, which
      bounds what a layer keeps (measured below: about 6 boundaries a layer, plus backward's).
    """
    monkeypatch.setattr(ckpt, "gpt_step_peak_bytes", lambda cfg, b: 0)
    b, s, h, a = 4, 256, 64, 4
    assert ckpt.predicted_peak_bytes("small") == 2 * (72 * s * b * h + 12 * a * s * s * b)
    monkeypatch.setattr(ckpt, "block_shape", lambda scale: (1, 1, 1, 1))
    monkeypatch.setattr(ckpt, "selective_shape", lambda scale: (1, 1, 1, 1))
    width, batch = 128, 64  # chain_shape("small")
    assert ckpt.predicted_peak_bytes("small") == 64 * 8 * width * batch * 4
    n, x = 16, torch.randn(8, 16)
    (point,) = ckpt.segment_sweep(ckpt.make_chain(n, 16, "mlp"), x, [1])
    assert point.peak_bytes <= n * 8 * x.numel() * 4
