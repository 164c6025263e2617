"""Tests of helpers.lessons.lesson07: sizes, the predicted peak, the widget's report, figures, exercises."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helpers.distributed import ddp as D
from helpers.distributed.fsdp import FSDP_TRACKER, FSDPStepMemory
from helpers.distributed.launcher import WorkerPool
from helpers.lessons import lesson07
from helpers.techniques.accumulation import full_batch_grad


def _param_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_exercise_checkers() -> None:
    assert lesson07.check_exercise_1(8).startswith("Correct")
    assert not lesson07.check_exercise_1(4).startswith("Correct")
    assert lesson07.check_exercise_2((1, 0)).startswith("Correct")
    assert not lesson07.check_exercise_2((8, 7)).startswith("Correct")
    assert not lesson07.check_exercise_2("one").startswith("Correct")
    assert lesson07.check_exercise_3(1.0).startswith("Correct")
    assert not lesson07.check_exercise_3(4).startswith("Correct")
    assert not lesson07.check_exercise_3(True).startswith("Correct")


@pytest.mark.parametrize("width", [3, 64])
def test_mlp_param_formula_matches_torchs_count(width: int) -> None:
    assert lesson07._mlp_params(width) == _param_count(D.replica_model(width))


@pytest.mark.parametrize(("workers", "w"), [(1, 1), (2, 2), (3, 2), (4, 4)])
def test_lesson_sizes_per_scale_and_worker_count(monkeypatch: pytest.MonkeyPatch, workers: int,
                                                 w: int) -> None:
    monkeypatch.setattr(lesson07, "max_workers", lambda: workers)
    expected = {"tiny": (2, 2, 32), "small": (4, 4, 64), "medium": (8, 4, 128), "full": (8, 4, 256)}
    for scale, (b, k, width) in expected.items():
        assert lesson07.lesson_sizes(scale) == lesson07.LessonSizes(b, k, w, width)


def test_predicted_peak_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    """W x (16 bytes x params + 4 bytes x B x depth 2 x 11 x width), with params counted by torch."""
    monkeypatch.setattr(lesson07, "max_workers", lambda: 2)
    tiny_params = _param_count(D.replica_model(32))  # 17508
    assert lesson07.predicted_peak_bytes("tiny") == 2 * (16 * tiny_params + 4 * 2 * 2 * 11 * 32) == 571520
    assert lesson07.predicted_peak_bytes("small") == 2 * (16 * 67780 + 4 * 4 * 2 * 11 * 64) == 2214016


def test_report_compares_with_one_process_on_seed_0_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """data_parallel_report with a stand-in for the DDP run: what it passes on and how it combines."""
    seen = []

    def fake_ddp(model_fn, loss_fn, x, y, *, no_sync, **kw):  # noqa: ANN001, ANN003, ANN202
        seen.append((model_fn, x, no_sync, kw))
        grad = full_batch_grad(model_fn(), loss_fn, x, y)  # exactly the one-process gradient
        return D.DDPGrad(grad, 1 if no_sync else kw["accumulation_steps"], [], ranks_agree=not no_sync,
                         rank_spread=0.0, indices=[])

    monkeypatch.setattr(lesson07, "ddp_accumulated_grad", fake_ddp)
    pool = object()
    report = lesson07.data_parallel_report(2, 3, 2, pool=pool)
    assert report.sizes == D.BatchSizes(12, 2, 3, 2)
    assert (report.calls_no_sync, report.calls_every_step) == (1, 3)
    assert report.diff.max_rel == 0.0
    assert not report.ranks_agree  # the no_sync run disagreed, so the report does
    assert [s[2] for s in seen] == [True, False]
    for model_fn, x, _, kw in seen:
        assert _param_count(model_fn()) == 67780  # default width 64
        assert torch.equal(x, D.lesson_data(12, seed=0)[0])  # default seed 0
        assert kw == {"micro_batch": 2, "accumulation_steps": 3, "world_size": 2, "pool": pool}


def test_widget_latency_cases_move_one_slider_each(monkeypatch: pytest.MonkeyPatch) -> None:
    started, shown = [], []
    monkeypatch.setattr(lesson07, "max_workers", lambda: 4)
    monkeypatch.setattr(lesson07, "shared_pool", started.append)
    monkeypatch.setattr(lesson07, "show_data_parallel",
                        lambda b, k, w, *, width: shown.append((b, k, w, width)))
    cases = lesson07.widget_latency_cases("tiny", torch.device("cpu"))
    assert started == [4]
    for case in cases.values():
        case()
    # tiny: B=2, K=2, W=4 (4 workers), width 32; each case moves one slider
    assert dict(zip(cases, shown, strict=True)) == {
        "B=4": (4, 2, 4, 32), "B=1": (1, 2, 4, 32), "K=1": (2, 1, 4, 32), "K=4": (2, 4, 4, 32),
        "W=1": (2, 2, 1, 32), "W=4": (2, 2, 4, 32),
    }


@pytest.mark.distributed
def test_widget_report(pool: WorkerPool) -> None:
    report = lesson07.data_parallel_report(2, 3, 2, pool=pool)
    assert report.sizes.train_batch == 12
    assert (report.calls_no_sync, report.calls_every_step) == (1, 3)
    assert report.diff.max_rel <= 1e-5 and report.ranks_agree
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    fig = lesson07.draw_report(report)
    left, right = fig.axes
    assert [t.get_text() for t in left.get_xticklabels()] == ["1", "2", "3"]  # whole micro-steps, not 0.5
    assert [t.get_text() for t in left.get_yticklabels()] == ["rank 0", "rank 1"]
    colours = [to_hex(bar.get_facecolor()).upper() for bar in right.patches]
    assert colours == [lesson07.NO_SYNC_KINDS[k][0].upper() for k in
                       ("right gradient, 1 all-reduce", "right gradient, but K all-reduces")]
    plt.close(fig)


def test_draw_fsdp_memory_shows_state_persistent_and_peak() -> None:
    import matplotlib.pyplot as plt

    state = {"parameters": 4, "gradients": 4, "optimizer_state": 8}
    persistent = {k: v // 2 for k, v in state.items()}
    peak = FSDPStepMemory(20, {"sharded_state": 8, "gathered_parameters": 6, "unsharded_gradients": 4,
                                 "activations": 2, "other": 0}, [1, 1], FSDP_TRACKER)
    held = {"sync_every_step": [2, 2], "sync_off": [4, 2]}
    fig = lesson07.draw_fsdp_memory(state, persistent, peak, held, 2)
    left = fig.axes[0]
    ticks = [t.get_text() for t in left.get_xticklabels()]
    assert ticks == ["DDP:\nstate", "FSDP:\npersistent", "FSDP:\npeak"]
    assert left.get_lines()[0].get_ydata()[0] == 8  # the 1/W line: 16 B / 2, in bytes (B)
    peak_stack = [p.get_height() for p in left.patches if abs(p.get_x() + 0.3 - 2) < 1e-9]  # bars at x = 2
    assert sum(peak_stack) == 20
    plt.close(fig)


def test_no_sync_bars_colour_the_buggy_loop_as_buggy() -> None:
    """The flag-after-forward loop makes one all-reduce, like the right loop, but its ranks differ:
    its bar must not share the right loop's colour (issue 24)."""
    from helpers.core import plot_layout
    from helpers.lessons.lesson07 import NO_SYNC_KINDS, draw_no_sync_bars, no_sync_kind

    assert no_sync_kind(1, 0.0, 1e-7) == "right gradient, 1 all-reduce"
    assert no_sync_kind(4, 0.0, 1e-7) == "right gradient, but K all-reduces"
    assert no_sync_kind(1, 0.3, 0.5).startswith("BUG")
    rows = {"no_sync": dict(calls=1, spread=0.0, max_rel=1e-7),
            "flag_after_forward": dict(calls=1, spread=0.3, max_rel=0.5)}
    fig = draw_no_sync_bars(rows, 4)
    right, buggy = fig.axes[0].patches[:2]
    assert right.get_facecolor() != buggy.get_facecolor() and buggy.get_hatch() == "//"
    assert {t.get_text() for t in fig.axes[0].get_legend().get_texts()} == set(NO_SYNC_KINDS)
    fig.tight_layout()
    assert plot_layout.layout_problems(fig) == []


def test_the_report_is_frozen_and_a_bad_scale_is_named() -> None:
    report = lesson07.DataParallelReport(D.BatchSizes(4, 2, 2, 1), 1, 2, None, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.calls_no_sync = 3  # type: ignore[misc]
    with pytest.raises(ValueError, match="^scale="):
        lesson07.predicted_peak_bytes("huge")
