"""The stable public path `helpers.memory`: its home is `helpers.measure.memory` (see that module).

Users' code and older notebooks import `helpers.memory`; the project's own code imports the home.
Nothing in `helpers/` imports this module (tests/test_layers.py).
"""

from helpers.measure.memory import (
    FLOOR,
    Mark,
    MicroStepMemory,
    StepMemory,
    floor_of,
    measurable_model,
    measure_step,
    micro_step_memory,
    new_live_bytes,
    record_timeline,
    run_capped,
    run_or_oom,
    saved_activation_bytes,
    tracked_run,
    tracker_method,
)

__all__ = [
    "FLOOR", "Mark", "MicroStepMemory", "StepMemory", "floor_of", "measurable_model", "measure_step",
    "micro_step_memory", "new_live_bytes", "record_timeline", "run_capped", "run_or_oom",
    "saved_activation_bytes", "tracked_run", "tracker_method",
]
