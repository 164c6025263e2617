"""The stable public path `helpers.meta_profile`: its home is `helpers.meta.profiler` (see that module).

Users' code and older notebooks import `helpers.meta_profile`; the project's own code imports the home.
Nothing in `helpers/` imports this module (tests/test_layers.py).
"""

from helpers.meta.profiler import (
    CHECKPOINTS,
    OPTIMIZER_IMPLS,
    PRECISION_BYTES_PER_PARAM,
    PRECISIONS,
    PURE_BF16_WARNING,
    TARGETS,
    Profiler,
)

__all__ = [
    "CHECKPOINTS", "OPTIMIZER_IMPLS", "PRECISIONS", "PRECISION_BYTES_PER_PARAM", "PURE_BF16_WARNING",
    "TARGETS", "Profiler",
]
