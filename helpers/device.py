"""The stable public path `helpers.device`: its home is `helpers.core.device` (see that module).

Users' code and older notebooks import `helpers.device`; the project's own code imports the home.
Nothing in `helpers/` imports this module (tests/test_layers.py).
"""

from helpers.core.device import (
    CPU_TRACKER,
    CUDA_ALLOCATOR,
    DEVICES,
    GB,
    GPU_SCALE_CLASSES,
    METHODS,
    SCALES,
    TENSOR_TRACKER,
    Lesson,
    apply_memory_cap,
    by_scale,
    cuda_index,
    device_of,
    gpu_memory_cap_gb,
    gpu_total_gb,
    lesson_scale,
    memory_method,
    pick_device,
    pick_scale,
    scale_for_gpu_memory,
    seed_everything,
    synchronize,
)

__all__ = [
    "DEVICES", "SCALES", "GB", "GPU_SCALE_CLASSES", "pick_device", "gpu_memory_cap_gb", "cuda_index",
    "gpu_total_gb", "scale_for_gpu_memory", "pick_scale", "lesson_scale", "apply_memory_cap", "by_scale",
    "seed_everything", "CUDA_ALLOCATOR", "CPU_TRACKER", "TENSOR_TRACKER", "METHODS", "memory_method",
    "synchronize", "Lesson", "device_of",
]
