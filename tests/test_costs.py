"""Tests of helpers.costs: FLOPs counted by torch and interleaved, warmed-up timings."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from helpers import costs
from helpers.data import regression_batch
from helpers.models import GPT, GPTConfig, ResidualMLP


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
