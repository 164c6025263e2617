"""A preset's (a config's) memory profile from a 1-block and a 2-block copy (lesson 09's presets).

- `preset_profile(name, seq_len, checkpoint)`: a preset's `MemoryProfile` (`helpers.plan.presets`),
  cached; `arch_profile(cfg, seq_len, checkpoint)`: that of any
  `helpers.models.architecture_config.ArchConfig`.
  Both profile copies of the model with 1 and 2 blocks on the meta device and extend them to all
  blocks; the peaks are exact at every micro-batch (`helpers.plan.peak_envelope.EnvelopeProfile`).
- `PRESET_MICRO_BATCHES`: the micro-batches the copies are profiled at.

"""

from __future__ import annotations

import dataclasses
import functools

from helpers.core.data import BatchSpec
from helpers.core.validate import positive_int
from helpers.measure.memory_profile import MemoryProfile
from helpers.meta.profiler import Profiler
from helpers.models.architecture_config import ArchConfig
from helpers.models.architectures import CausalLM
from helpers.plan.peak_envelope import EnvelopeProfile, PeakEnvelope, envelopes
from helpers.plan.presets import preset_spec

__all__ = ["PRESET_MICRO_BATCHES", "arch_profile", "preset_profile"]


PRESET_MICRO_BATCHES = (1, 2, 8)


@functools.lru_cache(maxsize=64)
def preset_profile(
    name: str,
    seq_len: int,
    checkpoint: str = "none",
    *,
    optimizer: str = "adam",
    target: str = "cuda",
    precision: str = "fp32",
    trainable: str = "all",
    micro_batches: tuple[int, ...] = PRESET_MICRO_BATCHES,
) -> MemoryProfile:
    """A preset's `MemoryProfile`: `arch_profile` of its config (`helpers.plan.presets.preset_spec`)."""
    _, _, cfg = preset_spec(name, seq_len)
    return arch_profile(cfg, seq_len, checkpoint, optimizer=optimizer, target=target, precision=precision,
                        trainable=trainable, micro_batches=micro_batches, label=f"{name} {checkpoint}")


def arch_profile(
    cfg: ArchConfig,
    seq_len: int,
    checkpoint: str = "none",
    *,
    optimizer: str = "adam",
    target: str = "cuda",
    precision: str = "fp32",
    trainable: str = "all",
    micro_batches: tuple[int, ...] = PRESET_MICRO_BATCHES,
    label: str = "",
) -> EnvelopeProfile:
    """The `MemoryProfile` of `CausalLM(cfg)`, from copies with 1 and 2 blocks extended to all of them.

    Its peaks (`predict_peak`, `forward_peak`, `optimizer_peak`, at any micro-batch and K) are
    exact: a `helpers.plan.peak_envelope.EnvelopeProfile` built from each copy's profiles at micro-batches
    1, 2 and 8, never a line extended past the sizes it was fitted at. Its fitted figures (floor,
    bytes per example, the optimizer step's line), which describe the profile, come from each copy
    fitted at `micro_batches` (default 1, 2 and 8), each a straight line in the number of blocks.
    `trainable` is as `Profiler`'s ("all", a name regex, "lora:<rank>[:<regex>]"). Profiling the
    copies takes about a second, even for the 8B shape.
    """
    if positive_int("seq_len", seq_len) > cfg.max_positions:
        raise ValueError(f"seq_len={seq_len} is beyond the config's {cfg.max_positions} positions")
    fits, steps = [], []
    for n in (1, 2):
        profiler = Profiler(functools.partial(CausalLM, dataclasses.replace(cfg, num_layers=n)),
                            BatchSpec.lm(seq_len, cfg.vocab_size), optimizer, target=target,
                            precision=precision, trainable=trainable)
        fits.append(profiler.memory_profile(checkpoint, micro_batches))
        steps.append({b: profiler.step(b, checkpoint=checkpoint) for b in (1, 2, 8)})
    method = f"meta-tracker (target {target}), blocks extrapolated"
    return _extrapolated(*fits, cfg.num_layers, envelopes(steps, cfg.num_layers), method=method, label=label)


def _extrapolated(one: MemoryProfile, two: MemoryProfile, n: int,
                  exact: tuple[PeakEnvelope, PeakEnvelope], **names: str) -> EnvelopeProfile:
    """The profile of `n` blocks from those of 1 and 2 blocks: every figure on its straight line,
    the peaks from the envelopes `exact` (of the loop as written, and with `del predictions`)."""

    def line(attr: str) -> float:
        a, b = getattr(one, attr), getattr(two, attr)
        return a + (n - 1) * (b - a)

    numbers = {
        f.name: line(f.name)
        for f in dataclasses.fields(MemoryProfile)
        if f.name not in ("method", "micro_batches", "label", "released")
    }
    numbers["floor_bytes"] = round(numbers["floor_bytes"])
    numbers["gradient_bytes"] = round(numbers["gradient_bytes"])
    released = None
    if one.released is not None and two.released is not None:
        released = _extrapolated(one.released, two.released, n, (exact[1], exact[1]), **names)
    return EnvelopeProfile(**numbers, micro_batches=one.micro_batches, released=released, envelope=exact[0],
                           **names)
