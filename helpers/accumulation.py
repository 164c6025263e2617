"""The stable public path `helpers.accumulation`; its home is `helpers.techniques.accumulation`.

Users' code and older notebooks import `helpers.accumulation`; the project's own code imports the home.
Nothing in `helpers/` imports this module (tests/test_layers.py).
"""

from helpers.techniques.accumulation import (
    GradDiff,
    LossFn,
    accumulated_grad,
    angle_degrees,
    check_batch,
    check_micro_batch,
    compare_grads,
    flat_grad,
    full_batch_grad,
    group_gradient,
    weight_distance,
)

__all__ = [
    "GradDiff", "LossFn", "accumulated_grad", "angle_degrees", "check_batch", "check_micro_batch",
    "compare_grads", "flat_grad", "full_batch_grad", "group_gradient", "weight_distance",
]
