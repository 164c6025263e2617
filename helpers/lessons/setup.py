"""The first cell of every lesson: `setup_lesson()` (device, scale, seed, plot style, the environment line).

It lives with the lessons because it is their start, not an instrument: it picks the device and
scale (`helpers.device`), seeds everything, applies the plot style (`helpers.core.plots`) and prints
what the lesson runs on. Not a lesson module: no notebook counts it as its lesson.
"""

from __future__ import annotations

import os
import warnings

import torch

from helpers.core.device import (
    Lesson,
    apply_memory_cap,
    gpu_total_gb,
    memory_method,
    pick_device,
    pick_scale,
    seed_everything,
)
from helpers.core.scratch import private_tmpdir


def setup_lesson(seed: int = 0, *, tf32: bool | None = None) -> Lesson:
    """Pick the device and scale, seed everything, apply the plot style, and print the environment.

    Also points `tempfile` and `TMPDIR` at a private folder that goes when the kernel ends
    (`helpers.core.scratch.private_tmpdir`). Prints the environment line, the memory cap when
    `LESSONS_GPU_MEMORY_GB` sets one (applied here, on CUDA, to the caching allocator only; see
    `apply_memory_cap`), and why the scale was picked. With `LESSONS_STRICT=1` (set by `make test`) any Python
    warning raised in the notebook becomes an error, so that no warning leaks into a lesson.

    Args:
        seed: passed to `seed_everything`.
        tf32: False keeps CUDA matmuls and convolutions in true float32, for lessons that
            compare gradients to 1e-6 (TF32 rounds differently for different batch shapes);
            None leaves torch's settings as they are.

    Returns:
        The `Lesson`: device, scale, memory method, why that scale, and the memory cap.
    """
    private_tmpdir()  # what the lesson and its workers write goes here, removed when the kernel ends
    device = pick_device()
    scale, why = pick_scale(device)
    cap = apply_memory_cap(device)
    lesson = Lesson(device=device, scale=scale, method=memory_method(device), why=why, memory_cap_gb=cap)
    seed_everything(seed)
    torch.set_default_dtype(torch.float32)
    from helpers.core import plots  # here, not at the top: importing device must not pull in matplotlib

    plots.use_style()
    if tf32 is not None:
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
    if os.environ.get("LESSONS_STRICT") == "1":
        warnings.simplefilter("error")
        # Jupyter's own machinery may warn on import; those are not lesson warnings.
        warnings.filterwarnings("default", module="(jupyter|ipykernel|zmq|traitlets|comm)")
    print(lesson.describe())
    if cap is not None:
        print(f"memory cap {cap:g} GB of {gpu_total_gb(device):.1f} GB (LESSONS_GPU_MEMORY_GB)")
    print(f"scale {scale}: {why}")
    return lesson
