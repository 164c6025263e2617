"""helpers.plan.peak_envelope (lesson 09): what an envelope refuses to extend, and the peak it extends to."""

from __future__ import annotations

import dataclasses
import functools

import pytest
from support.architectures import TINY

from helpers.core.data import BatchSpec
from helpers.meta.profiler import Profiler
from helpers.models.architectures import CausalLM
from helpers.plan.peak_envelope import PeakEnvelope


def test_an_envelope_refuses_what_it_cannot_extend() -> None:
    cfg = dataclasses.replace(TINY["llama"], num_layers=1)
    prof = Profiler(functools.partial(CausalLM, cfg), BatchSpec.lm(8, cfg.vocab_size), target="cuda")
    other = Profiler(functools.partial(CausalLM, dataclasses.replace(cfg, num_kv_heads=4)),
                     BatchSpec.lm(8, cfg.vocab_size), target="cuda")
    steps = {b: prof.step(b) for b in (1, 2, 8)}
    with pytest.raises(ValueError, match="micro-batches 1, 2 and 8; missing \\[8\\]"):
        PeakEnvelope.of({1: steps[1], 2: steps[2]}, steps, 2)
    with pytest.raises(ValueError, match="the ops at micro-batches 2 and 8 differ"):
        PeakEnvelope.of({**steps, 8: other.step(8, checkpoint="blocks")}, steps, 2)
    with pytest.raises(ValueError, match="group='backward' is not a group"):
        PeakEnvelope.of(steps, steps, 2).peak("backward", 1)
    assert PeakEnvelope.of(steps, steps, 3).peak("forward", 2) == steps[2].forward_peak_bytes
