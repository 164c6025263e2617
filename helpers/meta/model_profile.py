"""One model's profile as one record: what a plan reads, made once (lesson 09).

`Profiler.profile(checkpoint)` returns a `ModelProfile`. It holds who the model is (parameters,
batch, optimizer, target, precision), the phase profile fit (`MemoryProfile`) and the one-example
`StepProfile` of each checkpointing mode ("plain", and "checkpointed" when asked), and the
attention kernels the target runs. A plan reads it and asks nothing else of the profiler: the
full steps that check a plan's candidates (`full_step`) and the per-tensor optimizer step beside
foreach (`per_tensor_step`) are taken through the record, each one once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from helpers.core.validate import bool_arg, positive_int
from helpers.measure.memory_profile import MemoryProfile
from helpers.meta.step_profile import StepProfile

__all__ = ["MODES", "ModelProfile"]

MODES = {"plain": "none", "checkpointed": "blocks"}  # a record's modes and the checkpoint each profiles


@dataclass
class ModelProfile:
    """Everything a plan reads about one model: identity, fits and steps, profiled once.

    `profiles` and `steps` are keyed by mode ("plain", "checkpointed"); `steps` are one-example
    updates with K = 2 (any accumulation). `full_step(b, k, checkpointed)` is the update of that
    configuration profiled in full (K >= 2 stands for any K >= 2), memoised. `per_tensor_step(b,
    checkpoint)` is the same update with the per-tensor optimizer loop, or None when the record
    cannot build one (the optimizer is not foreach, or the model was given as a module).
    """

    n_params: int
    n_trainable: int
    batch: str
    trainable: str
    optimizer: str
    target: str
    precision: str
    capability: int
    impl: str
    profiles: dict[str, MemoryProfile]
    steps: dict[str, StepProfile]
    take_step: Callable[[int, str, int], StepProfile] = field(repr=False)
    take_per_tensor_step: Callable[[int, str], StepProfile] | None = field(default=None, repr=False)
    _full: dict[tuple[int, int, bool], StepProfile] = field(default_factory=dict, repr=False)
    _per_tensor: dict[tuple[int, str], StepProfile] = field(default_factory=dict, repr=False)

    @property
    def kernels(self) -> tuple[str, ...]:
        """The attention kernels the target runs in these steps (sorted, each once)."""
        return tuple(sorted({k for s in self.steps.values() for k in s.kernels}))

    @property
    def modes(self) -> tuple[str, ...]:
        """The checkpointing modes profiled: ("plain",) or ("plain", "checkpointed")."""
        return tuple(self.profiles)

    def full_step(self, micro_batch: int, accumulation_steps: int, checkpointed: bool) -> StepProfile:
        """The update of `micro_batch` x `accumulation_steps`, profiled in full (memoised; K >= 2 alike)."""
        k = positive_int("accumulation_steps", accumulation_steps)
        key = (positive_int("micro_batch", micro_batch), min(k, 2), bool_arg("checkpointed", checkpointed))
        if key not in self._full:
            self._full[key] = self.take_step(key[0], MODES["checkpointed" if key[2] else "plain"], key[1])
        return self._full[key]

    def per_tensor_step(self, micro_batch: int, checkpoint: str) -> StepProfile | None:
        """The `micro_batch` update (K = 2) with the per-tensor optimizer loop, or None (see the class)."""
        if self.take_per_tensor_step is None:
            return None
        key = (positive_int("micro_batch", micro_batch), checkpoint)
        if key not in self._per_tensor:
            self._per_tensor[key] = self.take_per_tensor_step(*key)
        return self._per_tensor[key]
