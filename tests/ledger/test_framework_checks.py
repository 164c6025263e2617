"""helpers.ledger.framework_checks (lesson 08): lesson 10's claims, each checked on the real framework.

Each check passes with the figure the framework's documented behaviour gives (Accelerate syncs on
the K-th micro-step only; Lightning steps the scheduler once per update), and fails when the
instrument it reads is swapped for one that breaks the claim: a switch that checkpoints nothing,
a Trainer whose update is twice the loop's, an accumulate() that syncs every micro-step, a
compiler that ignores its memory budget.
"""

from __future__ import annotations

import importlib
import os

import pytest
import torch

from helpers.frameworks import installed
from helpers.ledger import framework_checks as fw
from helpers.ledger.claim_lab import Lab

CI = os.environ.get("CI", "").lower() == "true"
pytestmark = pytest.mark.skipif(bool(installed.missing("transformers", "accelerate", "lightning")) and not CI,
                                reason="needs the frameworks extra (transformers, accelerate, lightning)")


@pytest.fixture(scope="module")
def lab() -> Lab:
    return Lab(torch.device("cpu"), scale="tiny")


def test_c28_transformers_checkpointing_keeps_less_and_the_same_gradients(
        lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    ev = fw._c_hf_checkpointing(lab)
    assert ev.passed and ev.value >= 2 and ev.unit == "x fewer saved bytes"
    assert "gradients equal to" in ev.detail
    hf = importlib.import_module("helpers.frameworks.hf")
    monkeypatch.setattr(hf, "enable_checkpointing", lambda model, reentrant: None)  # switches nothing on
    off = fw._c_hf_checkpointing(lab)
    assert not off.passed and off.value == 1.0  # the same bytes kept either way


def test_c29_the_trainers_update_is_the_group_token_count_loops(lab: Lab,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    ev = fw._c_trainer_accumulation(lab)
    assert ev.passed and ev.value <= 1e-5 and ev.unit == "max_rel"
    hf = importlib.import_module("helpers.frameworks.hf")
    update = hf.trainer_update
    monkeypatch.setattr(hf, "trainer_update", lambda *a, **k: 2 * update(*a, **k))  # loss not divided by 2
    doubled = fw._c_trainer_accumulation(lab)
    assert not doubled.passed and doubled.value == pytest.approx(1.0, rel=1e-5)  # |2u - u| / |u|


def test_c30_accelerate_syncs_on_the_kth_micro_step_only(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    ev = fw._c_accelerate_accumulation(lab)
    assert ev.passed and ev.value == 1 and "[False, False, False, True]" in ev.detail
    accel = importlib.import_module("helpers.frameworks.accel")
    run = accel.accumulate_run

    def every_step(*args: object, **kwargs: object) -> list[bool]:
        run(*args, **kwargs)
        return [True] * 4

    monkeypatch.setattr(accel, "accumulate_run", every_step)
    synced = fw._c_accelerate_accumulation(lab)
    assert not synced.passed and synced.value == 4


def test_c31_lightning_clips_and_steps_the_scheduler_once_per_update(lab: Lab) -> None:
    """8 micro-batches at K = 4 are 2 updates: 2 clips, 2 scheduler steps, learning rates 0.1 / (u + 1)."""
    ev = fw._c_lightning_accumulation(lab)
    assert ev.passed and ev.value == 1.0 and ev.unit == "clips per update"
    assert "2 clips, 2 scheduler steps" in ev.detail and "[0.1, 0.05]" in ev.detail


def test_c32_a_lower_budget_saves_fewer_bytes_and_recomputes(lab: Lab,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    ev = fw._c_compile_budget(lab)
    assert ev.passed and ev.value >= 4
    comp = importlib.import_module("helpers.frameworks.compiled")
    point = comp.compiled_point
    monkeypatch.setattr(comp, "compiled_point", lambda model, h, budget: point(model, h, 1.0))  # no budget
    ignored = fw._c_compile_budget(lab)
    assert not ignored.passed and ignored.value == 1.0
