"""Tests of helpers.techniques.costs: FLOPs counted by torch, interleaved warmed-up timings, TradeOffs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from helpers.core.data import regression_batch, token_batch
from helpers.core.training import lm_loss
from helpers.models.gpt import GPT, GPTConfig, explainer_model
from helpers.models.nets import ResidualMLP
from helpers.techniques import costs


def test_count_flops_linear() -> None:
    lin = torch.nn.Linear(8, 4, bias=False)
    assert costs.count_flops(lambda: lin(torch.randn(3, 8))) == 2 * 3 * 8 * 4
    with pytest.raises(ValueError, match="callable"):
        costs.count_flops(42)  # type: ignore[arg-type]


def test_interleaved_times_shape_and_arguments() -> None:
    calls: list[str] = []
    times = costs.interleaved_times({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                                   repeats=3, warmup=1)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]  # warm-up, then alternating order
    for t in times.values():
        assert t.runs == 3 and t.low <= t.median <= t.high
        assert "min-max" in t.describe()
    assert times["a"].scaled(2).median == 2 * times["a"].median
    with pytest.raises(ValueError, match="repeats"):
        costs.interleaved_times({"a": lambda: None}, repeats=0)
    with pytest.raises(ValueError):
        costs.interleaved_times({})


def test_blocks_forward_flops_by_hand() -> None:
    """One forward of a GPT's blocks: 24bsh^2 (qkv, proj, the 4h-wide MLP) + 4bs^2h (QK^T, PV) each."""
    cfg = GPTConfig(vocab_size=32, seq_len=8, d_model=16, n_heads=2, n_layers=3, dropout=0.0)
    model = GPT(cfg)
    b, s, h = 5, 8, 16
    assert costs.blocks_forward_flops(model, b) == 3 * (24 * b * s * h * h + 4 * b * s * s * h)
    with pytest.raises(ValueError, match="micro_batch"):
        costs.blocks_forward_flops(model, 0)


def test_timing_scaled_multiplies_median_and_both_ends() -> None:
    # 2, 1, 3 s over 5 runs, times K = 4 micro-steps: 8, 4, 12 s, still 5 runs.
    assert costs.Timing(2.0, 1.0, 3.0, 5).scaled(4) == costs.Timing(8.0, 4.0, 12.0, 5)


class _FakeClock:
    """`time.perf_counter` that moves only when a timed callable "runs" for a given duration."""

    def __init__(self) -> None:
        self.now = 1000.0  # far from 0, so start + end cannot pass for end - start

    def __call__(self) -> float:
        return self.now

    def runner(self, durations: list[float]) -> Callable[[], None]:
        todo = iter(durations)

        def run() -> None:
            self.now += next(todo)

        return run


def test_interleaved_times_reads_a_fake_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Known durations: the median, min and max of the timed runs, warm-up excluded."""
    clock = _FakeClock()
    monkeypatch.setattr(costs.time, "perf_counter", clock)
    # warm-up 100 s (not timed), then 3, 1, 5, 2, 4 s: sorted 1..5, median 3.
    fns = {"a": clock.runner([100.0, 3.0, 1.0, 5.0, 2.0, 4.0]),
           "b": clock.runner([100.0, 0.5, 0.5, 0.5, 0.5, 0.5])}
    times = costs.interleaved_times(fns, repeats=5, warmup=1)
    assert times["a"] == costs.Timing(3.0, 1.0, 5.0, 5)
    assert times["b"] == costs.Timing(0.5, 0.5, 0.5, 5)


def test_interleaved_times_defaults_one_warmup_and_five_runs() -> None:
    calls: list[str] = []
    times = costs.interleaved_times({"a": lambda: calls.append("a")})
    assert len(calls) == 1 + 5 and times["a"].runs == 5


def test_one_callable_and_its_per_second_view() -> None:
    calls = []
    t = costs.interleaved_times({"f": lambda: calls.append(1)}, device="cpu", repeats=3, warmup=2)
    assert len(calls) == 5 and t["f"].median >= 0
    rate = costs.Timing(2.0, 1.0, 4.0, 3).per_second(8)
    assert rate == costs.Timing(4.0, 2.0, 8.0, 3)  # low from the slowest run, high from the fastest


def test_skip_oom_drops_what_runs_out_of_memory() -> None:
    def oom() -> None:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")

    calls: list[str] = []
    times = costs.interleaved_times({"ok": lambda: calls.append("ok"), "oom": oom}, repeats=3, skip_oom=True)
    assert list(times) == ["ok"] and times["ok"].runs == 3 and len(calls) == 4
    with pytest.raises(torch.cuda.OutOfMemoryError):
        costs.interleaved_times({"oom": oom})


class _StepClock:
    """perf_counter that moves only when the timed function runs, by a known duration per call."""

    def __init__(self, durations: list[float]) -> None:
        self.now, self.durations, self.calls = 0.0, list(durations), 0

    def perf_counter(self) -> float:
        return self.now

    def step(self) -> None:
        self.now += self.durations[self.calls]
        self.calls += 1


@pytest.mark.parametrize(
    ("durations", "repeats", "expected"),
    [
        ([100.0, 5.0, 1.0, 4.0, 2.0, 3.0], 5, 3.0),  # the 100 s warm-up is not timed; unsorted middle: 4
        ([100.0, 4.0, 1.0, 3.0, 2.0], 4, 3.0),  # an even count: the upper middle of 1, 2, 3, 4
        ([100.0, 7.0], 1, 7.0),
    ],
)
def test_the_median_of_one_callable_with_a_fake_clock(
    monkeypatch: pytest.MonkeyPatch, durations: list[float], repeats: int, expected: float
) -> None:
    clock = _StepClock(durations)
    monkeypatch.setattr(costs.time, "perf_counter", clock.perf_counter)
    times = costs.interleaved_times({"f": clock.step}, device=torch.device("cpu"), repeats=repeats, warmup=1)
    assert times["f"].median == expected
    assert clock.calls == repeats + 1


def test_count_ops_counts_each_aten_op_once() -> None:
    x = torch.ones(3)
    assert costs.count_ops(lambda: None) == 0
    assert costs.count_ops(lambda: x + 1) == 1
    assert costs.count_ops(lambda: (x + 1) * 2) == 2
    with pytest.raises(TypeError, match="fn"):
        costs.count_ops(3)  # type: ignore[arg-type]


def mlp_case() -> tuple[torch.nn.Module, Callable, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    x, y = regression_batch(24, 8, 3, seed=1)
    return ResidualMLP(8, 32, 2, 3), F.mse_loss, x, y


def test_throughput_sweep_reports_median_and_spread():
    model, fn, x, y = mlp_case()
    res = costs.throughput_sweep(model, fn, x, y, [4, 24], rounds=3)
    for t in res.values():
        assert t is not None and t.runs == 3 and t.low <= t.median <= t.high
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(ValueError, match="rounds"):
        costs.throughput_sweep(model, fn, x, y, [4], rounds=0)
    with pytest.raises(ValueError, match="larger than the batch"):
        costs.throughput_sweep(model, fn, x, y, [25])


def test_throughput_sweep_with_a_step_of_known_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake clock that moves only inside the update, by known seconds (issue 16: an inverted
    examples-per-second, or a median without sorting, passed a test that asserted only > 0)."""
    now = [0.0]
    cost = {2: [9.0, 0.2, 0.4, 0.25], 8: [9.0, 1.0, 1.0, 1.0]}  # warm-up first (not timed), 3 rounds

    def fake_update(model, loss_fn, inputs, targets, micro_batch):  # noqa: ANN001, ANN202
        now[0] += cost[micro_batch].pop(0)
        return torch.zeros(1)

    monkeypatch.setattr(costs.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(costs, "accumulated_grad", fake_update)
    model, fn, x, y = mlp_case()
    n = x.shape[0]
    res = costs.throughput_sweep(model, fn, x, y, [2, 8], rounds=3)
    t2, t8 = res[2], res[8]
    assert (t2.median, t2.low, t2.high, t2.runs) == pytest.approx((n / 0.25, n / 0.4, n / 0.2, 3))
    assert (t8.median, t8.low, t8.high, t8.runs) == pytest.approx((n / 1.0, n / 1.0, n / 1.0, 3))
    assert cost == {2: [], 8: []}  # one warm-up and three rounds each


# -- TradeOffs: lesson 02's widget measures B x K with and without checkpointing ------------


@pytest.mark.cuda
def test_cuda_trade_off_checkpointing_lowers_allocator_peak() -> None:
    lab = costs.TradeOffs(explainer_model("tiny", torch.device("cuda")), repeats=1)
    plain, checkpointed = lab.measure(2, 2, False), lab.measure(2, 2, True)
    assert checkpointed.memory.method == "cuda-allocator"
    assert checkpointed.memory.peak_bytes < plain.memory.peak_bytes


def test_trade_off_flops_against_an_independent_count() -> None:
    """TradeOffs' FLOPs against FlopCounterMode around the lesson's own step (issue 16).

    Plain: K x one `lm_loss(model(idx), targets).backward()`, counted here. Checkpointed: the
    extra is the recomputation, at most one forward of every block (counted here, block by
    block) and at least half of it (non-reentrant checkpoint stops recomputing early, once
    every tensor backward needs is back, so the blocks' last matmuls may be skipped).
    """
    from torch.utils.flop_counter import FlopCounterMode

    model = explainer_model("tiny", torch.device("cpu"))
    lab = costs.TradeOffs(model, repeats=1)
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


def test_trade_offs_defaults_smallest_controls_and_messages() -> None:
    model = explainer_model("tiny", torch.device("cpu"))
    lab = costs.TradeOffs(model)
    row = lab.measure(1, 1, False)  # the sliders' smallest B and K
    assert (row.micro_batch, row.steps, row.effective_batch) == (1, 1, 1)
    assert row.time_per_update.runs == 3  # the notebook: "the median of three interleaved micro-steps"
    n = sum(p.numel() for p in model.parameters())
    assert row.memory.breakdown["parameters"] == 4 * n and row.memory.peak_bytes >= 16 * n  # fp32, Adam
    with pytest.raises(ValueError, match="^optimizer='nope' is not allowed"):
        costs.TradeOffs(model, optimizer="nope")
    with pytest.raises(TypeError, match="^model must be a helpers.models.gpt.GPT, got Linear"):
        costs.TradeOffs(torch.nn.Linear(2, 2))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="^repeats must"):
        costs.TradeOffs(model, repeats=0)


def test_trade_offs_measures_memory_on_at_most_two_micro_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Memory comes from an update of min(K, 2) micro-steps, measured once per (B, min(K, 2), on)."""
    from helpers.techniques.update_memory import measure_update

    steps_measured: list[int] = []

    def spy(*args: object, **kwargs: object) -> object:
        steps_measured.append(kwargs["steps"])
        return measure_update(*args, **kwargs)

    monkeypatch.setattr(costs, "measure_update", spy)
    lab = costs.TradeOffs(explainer_model("tiny", torch.device("cpu")), repeats=1)
    for k in (1, 8, 2, 16):
        lab.measure(1, k, False)
    assert steps_measured == [1, 2]


def test_micro_step_restores_the_wrapper_and_clears_gradients() -> None:
    model = explainer_model("tiny", torch.device("cpu"))
    lab = costs.TradeOffs(model, repeats=1)

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
    lab = costs.TradeOffs(model, repeats=2)
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
    lab = costs.TradeOffs(model, repeats=1)
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


def test_skip_oom_after_the_warmup_still_times_the_others_every_round() -> None:
    """A callable that runs out of memory on its first timed run (after a good warm-up) is dropped
    there; the one after it in that round still runs, so it keeps all its rounds."""
    calls: list[str] = []

    def late_oom() -> None:
        calls.append("late")
        if len(calls) > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")

    times = costs.interleaved_times({"late": late_oom, "ok": lambda: calls.append("ok")}, repeats=3,
                                    skip_oom=True)
    assert list(times) == ["ok"] and times["ok"].runs == 3
    assert calls == ["late", "ok", "late", "ok", "ok", "ok"]


def test_throughput_sweep_defaults_to_five_rounds_and_gives_none_for_an_oom_size(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_update(model, loss_fn, inputs, targets, micro_batch):  # noqa: ANN001, ANN202
        if micro_batch == 8:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return torch.zeros(1)

    monkeypatch.setattr(costs, "accumulated_grad", fake_update)
    model, fn, x, y = mlp_case()
    res = costs.throughput_sweep(model, fn, x, y, [2, 8])
    assert res[8] is None and res[2] is not None and res[2].runs == 5


def test_timing_and_trade_off_are_frozen_and_a_trade_offs_batch_and_label() -> None:
    t = costs.Timing(1.0, 1.0, 1.0, 1)
    row = costs.TradeOff(4, 8, True, None, 10, 8, t)  # type: ignore[arg-type]
    assert (row.effective_batch, row.extra_flops, row.label) == (32, 2, "4 x 8, checkpointed")
    assert costs.TradeOff(4, 8, False, None, 8, 8, t).label == "4 x 8"  # type: ignore[arg-type]
    assert hash(t) == hash(costs.Timing(1.0, 1.0, 1.0, 1))
    for frozen, field in ((t, "median"), (row, "steps")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(frozen, field, 2)
