"""Tests of helpers.lessons.lesson02: sizes, the predicted peak, the trade-off widget, exercise checkers."""

from __future__ import annotations

import dataclasses

import matplotlib.pyplot as plt
import pytest
import torch
from torch.utils.checkpoint import CheckpointPolicy

from helpers.core.data import token_batch
from helpers.core.device import seed_everything
from helpers.core.training import lm_loss
from helpers.lessons import lesson02
from helpers.models.gpt import GPT, deep_gpt_setup, explainer_model
from helpers.techniques import costs, segments
from helpers.techniques.saved_tensors import save_matmul_outputs


def test_trade_off_lab_widget_function() -> None:
    lab = lesson02.TradeOffLab(explainer_model("tiny", torch.device("cpu")), repeats=1)
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
        lesson02.TradeOffLab(torch.nn.Linear(2, 2))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="checkpointed must be a bool"):
        lab.measure(2, 4, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="optimizer='lion'"):
        lesson02.TradeOffLab(lab.model, optimizer="lion")
    with pytest.raises(ValueError, match="repeats"):
        lesson02.TradeOffLab(lab.model, repeats=0)
    lab.show(2, 4, True)
    plt.close("all")


def test_widget_latency_cases_cover_every_control() -> None:
    cases = lesson02.widget_latency_cases("tiny", torch.device("cpu"))
    assert {"B=2", "K=1", "checkpoint on"} <= set(cases)
    assert any(name.startswith("K=") and name != "K=1" for name in cases)
    cases["checkpoint on"]()
    plt.close("all")
    with pytest.raises(ValueError, match="scale"):
        lesson02.widget_latency_cases("huge", torch.device("cpu"))


def test_predicted_peak_bounds_the_measured_gpt_step() -> None:
    cfg, b = deep_gpt_setup("tiny")
    seed_everything(0)
    model = GPT(cfg)
    idx, targets = token_batch(b, cfg.seq_len, cfg.vocab_size)
    opt = torch.optim.Adam(model.parameters())

    def step() -> None:
        opt.zero_grad(set_to_none=False)
        lm_loss(model(idx), targets).backward()
        opt.step()

    step()
    from helpers.measure.memory import measure_step

    measured = measure_step(step, model=model, optimizer=opt).peak_bytes
    assert measured <= lesson02.predicted_peak_bytes("tiny")
    with pytest.raises(ValueError, match="scale"):
        lesson02.predicted_peak_bytes("xl")


def test_exercise_checkers() -> None:
    assert lesson02.check_exercise_1(109).startswith("Correct")
    # fp32, 4-byte masks, by hand: sbh terms 32 two-byte elements -> 64 B plus 2 masks x 4 B = 72;
    # as^2b terms 4 two-byte elements -> 8 B plus 1 mask x 4 B = 12; 12 * 4 * s / 64 > 72 -> s > 96
    assert "12as/h > 72, s > 96)" in lesson02.check_exercise_1(109)
    assert lesson02.check_exercise_1(60).startswith("Hint")
    assert lesson02.check_exercise_1("a lot").startswith("Hint")

    def softmax_only(ctx: object, op: object, *args: object, **kwargs: object) -> CheckpointPolicy:
        if op is torch.ops.aten._softmax.default:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    assert lesson02.check_exercise_2(softmax_only).startswith("Correct")
    assert lesson02.check_exercise_2(save_matmul_outputs).startswith("Hint")
    assert lesson02.check_exercise_2(None).startswith("Hint")
    assert lesson02.check_exercise_2(lambda *a, **k: 1 / 0).startswith("Hint")
    assert lesson02.check_exercise_3(None).startswith("Hint")
    assert lesson02.check_exercise_4(2, 1).startswith("Correct")
    assert lesson02.check_exercise_4(2, 2).startswith("Half right")
    assert lesson02.check_exercise_4(1, 1).startswith("Hint")
    assert lesson02.check_exercise_4(None, 1).startswith("Hint")


def test_a_failing_policy_leaves_no_dispatch_mode_behind() -> None:
    """After exercise 2's checker ran a policy that raises, torch must not think a mode is still on.

    On torch 2.5 the checkpoint's forward context outlived the tracker and left the flag set, and
    every later torch.compile in the kernel compiled nothing (test_compiled failed after this test).
    """
    from torch.utils._python_dispatch import is_in_torch_dispatch_mode

    assert lesson02.check_exercise_2(lambda *a, **k: 1 / 0).startswith("Hint")
    assert not is_in_torch_dispatch_mode()
    compiled = torch.compile(torch.nn.Linear(3, 3), backend="aot_eager")
    out = compiled(torch.randn(2, 3, requires_grad=True))
    assert "CompiledFunction" in type(out.grad_fn).__name__


def test_exercise_3_checker_agrees_with_the_lessons_own_measurement() -> None:
    """A ReLU's saved output is the next Linear's saved input: one storage, so a/b = 1 (issue 21).

    Measured here with the lesson's own instruments (`chain_layer_costs`, `segment_sweep`) on a
    chain the checker does not build (another width and batch, another seed).
    """
    torch.manual_seed(3)
    x = torch.randn(24, 40)
    chains = {kind: segments.make_chain(16, 40, kind) for kind in ("linear", segments.EXERCISE_CHAIN)}
    costs = {kind: segments.chain_layer_costs(chain, x) for kind, chain in chains.items()}
    sweeps = {kind: segments.segment_sweep(chain, x, segments.divisors(16)) for kind, chain in chains.items()}
    best = {kind: min(points, key=lambda p: p.saved_bytes).segments for kind, points in sweeps.items()}
    m, c = costs[segments.EXERCISE_CHAIN]
    assert m == c == x.numel() * 4  # the Linear's input; the ReLU's output is that same storage downstream
    assert best[segments.EXERCISE_CHAIN] == best["linear"] == 4  # the optimum k does not move
    assert lesson02.check_exercise_3(m / c).startswith("Correct")
    assert lesson02.check_exercise_3(2.0).startswith("Hint") and "once" in lesson02.check_exercise_3(2.0)
    assert lesson02.check_exercise_3(6).startswith("Hint")
    measured = lesson02.exercise_3_measurement()
    assert measured[segments.EXERCISE_CHAIN] == measured["linear"] == (1.0, 4)
    with pytest.raises(ValueError, match="kind"):
        segments.make_chain(4, 8, "relu-linear")


def test_exercise_2_checker_leaves_the_global_rng_alone() -> None:
    state = torch.random.get_rng_state()
    assert lesson02.check_exercise_2(None).startswith("Hint")
    lesson02.check_exercise_2(lambda ctx, op, *args, **kwargs: CheckpointPolicy.PREFER_RECOMPUTE)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_result_objects_are_frozen() -> None:
    timing = costs.Timing(1.0, 0.5, 2.0, 3)
    point = segments.SegmentPoint(2, 10, 20)
    row = costs.TradeOff(2, 4, False, None, 8, 8, timing)  # type: ignore[arg-type]
    for obj, field in ((timing, "median"), (point, "saved_bytes"), (row, "steps")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, field, 0)


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
        assert lesson02.block_shape(scale) == block, scale
        assert lesson02.selective_shape(scale) == selective, scale
        b, s, h, a = selective
        assert a * s // h == 16  # the docstring's a*s/h = 16 at every scale
        assert lesson02.chain_shape(scale) == chain, scale
        assert lesson02.widget_max_micro_batch(scale) == top, scale
        cfg, micro_batch = deep_gpt_setup(scale)
        sizes = (cfg.vocab_size, cfg.seq_len, cfg.d_model, cfg.n_heads, cfg.n_layers)
        assert (sizes, micro_batch) == gpt[scale], scale
        assert cfg.dropout == 0.1
    assert lesson02.WIDGET_MAX_STEPS == 16  # the K slider's top
    # sqrt(n) is a whole number and one of the divisors, so the best k lies on the sweep
    for n in lesson02.CHAIN_LENGTHS:
        assert round(n ** 0.5) ** 2 == n and round(n ** 0.5) in segments.divisors(n)
    assert lesson02.CHAIN_LENGTHS == (16, 36, 64)


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
    from helpers.models.gpt import GPT

    cfg, b = deep_gpt_setup(scale)
    with torch.device("meta"):
        n_params = sum(p.numel() for p in GPT(cfg).parameters())
    s, h, a = cfg.seq_len, cfg.d_model, cfg.n_heads
    layer = 72 * s * b * h + 12 * a * s * s * b
    expected = 16 * n_params + (cfg.n_layers + 1) * layer + 3 * b * s * cfg.vocab_size * 4
    assert lesson02.predicted_peak_bytes(scale) == expected


def test_trade_off_reference_rows_and_labels() -> None:
    """The explainer's three rows: 8 x 4 and 4 x 8 without checkpointing, 4 x 8 with it."""
    assert [b * k for b, k, _ in lesson02.REFERENCE_ROWS] == [32, 32, 32]
    assert [(b, on) for b, _, on in lesson02.REFERENCE_ROWS] == [(8, False), (4, False), (4, True)]
    timing = costs.Timing(1.0, 1.0, 1.0, 1)
    assert costs.TradeOff(8, 4, False, None, 0, 0, timing).label == "8 x 4"  # type: ignore[arg-type]


def test_widget_latency_cases_name_every_slider_end() -> None:
    cases = lesson02.widget_latency_cases("tiny", torch.device("cpu"))
    assert set(cases) == {"B=2", "B=8", "K=1", "K=16", "checkpoint on"}  # tiny: B up to 8, K up to 16


def test_predicted_peak_other_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    """The smaller experiments' candidates, each made the largest by taking the others away.

    - single blocks (sections 1 and 5): twice Korthikanti's fp32 bytes with 4-byte masks,
      72 sbh + 12 as^2b (saved tensors plus backward's temporaries); at `small` the
      selective block (b, s, h, a) = (4, 256, 64, 4) is the larger;
    - the MLP chain at k = 1: its 64 layers with 8 boundary-sized fp32 tensors each, which
      bounds what a layer keeps (measured below: about 6 boundaries a layer, plus backward's).
    """
    monkeypatch.setattr(lesson02, "gpt_step_peak_bytes", lambda cfg, b: 0)
    b, s, h, a = 4, 256, 64, 4
    assert lesson02.predicted_peak_bytes("small") == 2 * (72 * s * b * h + 12 * a * s * s * b)
    monkeypatch.setattr(lesson02, "block_shape", lambda scale: (1, 1, 1, 1))
    monkeypatch.setattr(lesson02, "selective_shape", lambda scale: (1, 1, 1, 1))
    width, batch = 128, 64  # chain_shape("small")
    assert lesson02.predicted_peak_bytes("small") == 64 * 8 * width * batch * 4
    n, x = 16, torch.randn(8, 16)
    (point,) = segments.segment_sweep(segments.make_chain(n, 16, "mlp"), x, [1])
    assert point.peak_bytes <= n * 8 * x.numel() * 4
