"""Tests of helpers.meta.model_profile: one record per model, read once by the plan."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from helpers.core.data import BatchSpec
from helpers.meta.model_profile import ModelProfile
from helpers.meta.profiler import Profiler
from helpers.models.architecture_config import ArchConfig
from helpers.models.architectures import CausalLM
from helpers.plan.report import plan_model

CFG = ArchConfig("llama", 512, 64, 128, 2, 4, 16, num_kv_heads=2, tie_embeddings=True)
SPEC = BatchSpec.lm(16, CFG.vocab_size)


def _counted(target: str = "cuda") -> tuple[Profiler, dict[str, int]]:
    """A profiler whose `memory_profile` and `step` calls are counted (shallow: a fit's steps count too)."""
    prof = Profiler(functools.partial(CausalLM, CFG), SPEC, "adam", target=target)
    calls = {"memory_profile": 0, "step": 0}
    for name in calls:
        real = getattr(prof, name)

        def counted(*args, _real=real, _name=name, **kwargs):  # noqa: ANN002, ANN003, ANN202
            calls[_name] += 1
            return _real(*args, **kwargs)

        object.__setattr__(prof, name, counted)
    return prof, calls


def test_the_record_holds_the_profilers_own_answers() -> None:
    """Each mode's fit and one-example step are what the profiler gives when asked directly."""
    prof = Profiler(functools.partial(CausalLM, CFG), SPEC, "adam", target="cuda")
    record = prof.profile("blocks")
    assert record.modes == ("plain", "checkpointed")
    assert record.n_params == prof.n_params and record.optimizer == "adam" and record.target == "cuda"
    for mode, ck in (("plain", "none"), ("checkpointed", "blocks")):
        assert record.steps[mode].peak_bytes == prof.step(1, checkpoint=ck).peak_bytes
        assert record.profiles[mode].predict_peak(4) == prof.memory_profile(ck, (1, 2)).predict_peak(4)
    assert record.full_step(3, 5, True).peak_bytes == prof.step(3, checkpoint="blocks").peak_bytes
    assert record.full_step(32, 2, True).peak_bytes < record.full_step(32, 2, False).peak_bytes
    print("the record's fits and steps equal the profiler's own, mode by mode")


def test_a_plan_reads_the_record_and_asks_the_profiler_for_nothing_twice() -> None:
    """plan_model profiles each mode once; a second plan from the same record takes no new step."""
    prof, calls = _counted()
    record = prof.profile("blocks")
    assert calls["memory_profile"] == 2  # one fit per mode
    before = dict(calls)
    first = plan_model(record, name="small", budget_bytes=1e9, effective_batch=8)
    taken = calls["step"] - before["step"]
    assert calls["memory_profile"] == before["memory_profile"]  # the fits are not asked for again
    again = plan_model(record, name="small", budget_bytes=1e9, effective_batch=8)
    assert calls["step"] - before["step"] == taken  # the candidates' full steps are memoised in the record
    assert again.to_dict() | {"seconds": 0} == first.to_dict() | {"seconds": 0}
    via_profiler = plan_model(Profiler(functools.partial(CausalLM, CFG), SPEC, "adam", target="cuda"),
                              name="small", budget_bytes=1e9, effective_batch=8)
    assert via_profiler.to_dict() | {"seconds": 0} == first.to_dict() | {"seconds": 0}
    print(f"one fit per mode, {taken} full steps for the first plan and none for the second")


def test_full_steps_are_memoised_and_k_of_two_stands_for_more() -> None:
    """K = 2 and K = 5 are one key (the peak is the same for any K >= 2); K = 1 and checkpointing are not."""
    record = Profiler(functools.partial(CausalLM, CFG), SPEC, "adam", target="cuda").profile("blocks")
    assert record.full_step(2, 2, False) is record.full_step(2, 5, False)
    assert record.full_step(2, 1, False) is not record.full_step(2, 2, False)
    assert record.full_step(2, 1, False).peak_bytes <= record.full_step(2, 2, False).peak_bytes
    assert record.full_step(32, 2, True).peak_bytes < record.full_step(32, 2, False).peak_bytes


def test_the_per_tensor_loop_needs_a_fresh_build() -> None:
    """A foreach profile of a callable build swaps its loop (lower peak); a given module gets None."""
    record = Profiler(functools.partial(CausalLM, CFG), SPEC, "adam", target="cuda").profile("none")
    loop = record.per_tensor_step(1, "none")
    assert loop is not None and loop is record.per_tensor_step(1, "none")
    assert loop.optimizer_peak_bytes < record.full_step(1, 2, False).optimizer_peak_bytes
    with torch.device("meta"):
        module = nn.Sequential(nn.Linear(8, 8))
    given = Profiler(module, BatchSpec.classifier((8,), 8), "adam", target="cuda")
    assert given.profile("none").per_tensor_step(1, "none") is None


def test_bad_input_is_refused_by_name() -> None:
    """A plan that checkpoints needs the checkpointed mode; a bad micro-batch or profile is named."""
    record = Profiler(functools.partial(CausalLM, CFG), SPEC, "adam", target="cuda").profile("none")
    assert isinstance(record, ModelProfile) and record.modes == ("plain",)
    with pytest.raises(ValueError, match=r"Profiler.profile\('blocks'\)"):
        plan_model(record, name="small", budget_bytes=1e9, effective_batch=8, checkpoint="blocks")
    with pytest.raises(ValueError, match="micro_batch"):
        record.full_step(0, 2, False)
    with pytest.raises(ValueError, match="checkpointed"):
        record.full_step(1, 2, 1)
    with pytest.raises(ValueError, match="ModelProfile"):
        plan_model("profile", name="small", budget_bytes=1e9, effective_batch=8)
    with pytest.raises(ValueError, match="checkpoint"):
        Profiler(functools.partial(CausalLM, CFG), SPEC, "adam").profile("every")
