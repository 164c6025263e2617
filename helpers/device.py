"""Device, seed and scale: the few lines every lesson starts with.

`pick_device()` chooses CUDA when it is there (`LESSONS_DEVICE=cpu|cuda`
overrides), `lesson_scale()` picks how big the experiments are (`small` on CPU,
`full` on CUDA, `LESSONS_SCALE=tiny|small|full` overrides), and
`seed_everything()` makes runs repeatable. `setup_lesson()` does all three and
prints one environment line, so that notebooks never copy a device/seed cell.
"""

from __future__ import annotations

import os
import platform
import random
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

DEVICES = ("cpu", "cuda")
SCALES = ("tiny", "small", "medium", "full")


def pick_device() -> torch.device:
    """Return the device the lessons run on.

    CUDA when available, else CPU. `LESSONS_DEVICE=cpu|cuda` overrides the
    choice; asking for CUDA on a machine without it raises `RuntimeError`.
    """
    wanted = os.environ.get("LESSONS_DEVICE", "").strip().lower()
    if wanted and wanted not in DEVICES:
        raise ValueError(
            f"LESSONS_DEVICE={wanted!r} is not a device the lessons know; use one of {DEVICES}"
        )
    if wanted == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "LESSONS_DEVICE=cuda, but torch cannot see a CUDA GPU "
            f"(torch {torch.__version__}, built with CUDA {torch.version.cuda}). "
            "Unset LESSONS_DEVICE or set it to 'cpu'."
        )
    if wanted == "cpu":
        return torch.device("cpu")
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def lesson_scale(device: torch.device | None = None) -> str:
    """Return the experiment size: 'tiny', 'small' (CPU default) or 'full' (CUDA default).

    `LESSONS_SCALE` overrides the default; an unknown value raises `ValueError`
    listing the choices.
    """
    wanted = os.environ.get("LESSONS_SCALE", "").strip().lower()
    if wanted:
        if wanted not in SCALES:
            raise ValueError(f"LESSONS_SCALE={wanted!r} is not a scale; choose one of {SCALES}")
        return wanted
    device = device if device is not None else pick_device()
    return "full" if device.type == "cuda" else "small"


def by_scale(scale: str, *, tiny: object, small: object, full: object, medium: object = None) -> object:
    """Pick the value for `scale`: one alternative per scale.

    `medium` (12-40 GB GPUs) falls back to the `small` value when it is not given.
    """
    if scale not in SCALES:
        raise ValueError(f"scale={scale!r} is not a scale; choose one of {SCALES}")
    return {"tiny": tiny, "small": small, "medium": small if medium is None else medium, "full": full}[scale]


def seed_everything(seed: int) -> None:
    """Seed Python, torch (CPU and every CUDA device) and NumPy if it is installed."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy ships with matplotlib
        return
    np.random.seed(seed % 2**32)


def memory_method(device: torch.device) -> str:
    """Name of the method that produces memory figures on `device`."""
    return "cuda-allocator" if device.type == "cuda" else "cpu-tracker"


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so that a clock read afterwards is honest."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(
    fn: Callable[[], object], *, device: torch.device, repeats: int = 5, warmup: int = 1
) -> float:
    """Median wall-clock seconds of `fn()` over `repeats` runs after `warmup` runs.

    On CUDA the device is synchronized before each clock read.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats=} {warmup=}")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]


@dataclass(frozen=True)
class Lesson:
    """What a notebook needs to know about where it runs."""

    device: torch.device
    scale: str
    method: str

    def describe(self) -> str:
        """One line: torch version, device, scale and memory method."""
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else (
            platform.processor() or platform.machine()
        )
        return (
            f"torch {torch.__version__} | device {self.device} ({name}) | "
            f"scale {self.scale} | memory method {self.method}"
        )


def setup_lesson(seed: int = 0, *, tf32: bool | None = None) -> Lesson:
    """Pick the device and scale, seed everything, and print the environment line.

    `tf32=False` keeps CUDA matmuls and convolutions in true float32, for lessons that
    compare gradients to 1e-6 (TF32 rounds differently for different batch shapes);
    `None` leaves torch's settings as they are.

    With `LESSONS_STRICT=1` (set by `make test`) any Python warning raised in
    the notebook becomes an error, so that no warning leaks into a lesson.
    """
    device = pick_device()
    lesson = Lesson(device=device, scale=lesson_scale(device), method=memory_method(device))
    seed_everything(seed)
    torch.set_default_dtype(torch.float32)
    if tf32 is not None:
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
    if os.environ.get("LESSONS_STRICT") == "1":
        warnings.simplefilter("error")
        # Jupyter's own machinery may warn on import; those are not lesson warnings.
        warnings.filterwarnings("default", module="(jupyter|ipykernel|zmq|traitlets|comm)")
    print(lesson.describe())
    return lesson
