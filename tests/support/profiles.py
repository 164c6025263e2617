"""Hand-made `MemoryProfile`s, in MiB: the planner's tests and the profile's own tests read them.

`hand_profile(**changes)`: floor 100 MiB (of it 25 MiB gradients), 2 MiB of other, 10 MiB of
activations per example, the optimizer step at 110 MiB; `PLAIN` is that profile, `CKPT` the same
with 2 MiB of activations per example (checkpointed).
"""

from __future__ import annotations

from helpers.measure.memory_profile import MemoryProfile

MiB = 2**20


def hand_profile(**changes: float) -> MemoryProfile:
    """A hand-made profile: floor 100 MiB, 10 MiB per example, optimizer step at 110 MiB."""
    base = dict(floor_bytes=100 * MiB, gradient_bytes=25 * MiB, other_bytes=2 * MiB,
                other_bytes_per_example=0.0, activation_bytes_per_example=10 * MiB,
                activation_intercept_bytes=0.0, optimizer_peak_bytes=110 * MiB,
                optimizer_bytes_per_example=0.0, method="cpu-tracker")
    return MemoryProfile(**{**base, **changes})


PLAIN = hand_profile()
CKPT = hand_profile(activation_bytes_per_example=2 * MiB, label="checkpointed")
