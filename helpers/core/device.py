"""Device, seed and scale: the few lines every lesson starts with.

`pick_device()` chooses CUDA when it is there (`LESSONS_DEVICE=cpu|cuda`
overrides), `lesson_scale()` picks how big the experiments are, and
`seed_everything()` makes runs repeatable; `device_of(model)` says where a model lives.
`helpers.lessons.setup.setup_lesson()` does all three and prints the environment, so that
notebooks never copy a device/seed cell.

Scales: `tiny` (quick tests), `small` (the CPU default), and on CUDA one picked
from the GPU's total memory in decimal GB: under 12 GB `small`, 12 to under
40 GB `medium` (T4, L4, 24 GB cards), 40 GB and more `full`.
`LESSONS_GPU_MEMORY_GB=N` makes a big GPU stand in for a small one: the scale
is picked from N, and `setup_lesson` caps the process at N GB with
`torch.cuda.set_per_process_memory_fraction`. The cap limits PyTorch's caching
allocator only: a real N GB card also holds its CUDA context (a few hundred MB
outside the allocator) and reports a little less than N GB, so under the cap a
lesson runs out somewhat later than it would on that card. `LESSONS_SCALE`
overrides the pick on any device.
"""

from __future__ import annotations

import math
import os
import platform
import random
from dataclasses import dataclass

import torch
from torch import nn

from helpers.core.validate import instance_arg

DEVICES = ("cpu", "cuda")
SCALES = ("tiny", "small", "medium", "full")
GB = 10**9  # GPU memory classes are in decimal GB, as vendors quote them (a "40 GB" A100 has 42.4e9 bytes)
# (smallest memory of the class in GB, scale), largest first; a GPU takes the first class it reaches.
GPU_SCALE_CLASSES = ((40.0, "full"), (12.0, "medium"), (0.0, "small"))


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


def gpu_memory_cap_gb() -> float | None:
    """The GB given in `LESSONS_GPU_MEMORY_GB`, or None when it is unset or empty.

    Raises `ValueError` for a value that is not a positive, finite number.
    """
    raw = os.environ.get("LESSONS_GPU_MEMORY_GB", "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"LESSONS_GPU_MEMORY_GB={raw!r} is not a memory size; "
            "give a positive number of GB, e.g. 16 or 22.5"
        )
    return value


def cuda_index(device: torch.device) -> int:
    """The index of the CUDA `device`: its own, or the current device's for a bare "cuda".

    Some CUDA calls (`set_per_process_memory_fraction` on torch 2.11) refuse a device without one.
    """
    if device.type != "cuda":
        raise ValueError(f"device={device} is not a CUDA device")
    return device.index if device.index is not None else torch.cuda.current_device()


def gpu_total_gb(device: torch.device) -> float:
    """Total memory of the CUDA `device` in decimal GB."""
    return torch.cuda.get_device_properties(cuda_index(device)).total_memory / GB


def scale_for_gpu_memory(gb: float) -> str:
    """The scale for a GPU with `gb` decimal GB: 'small' < 12, 'medium' < 40, else 'full'."""
    if isinstance(gb, bool) or not isinstance(gb, int | float) or not math.isfinite(gb) or gb <= 0:
        raise ValueError(f"gb={gb!r} is not a memory size; give a positive number of GB")
    return next(scale for floor, scale in GPU_SCALE_CLASSES if gb >= floor)


def _checked_cap(device: torch.device) -> float | None:
    """The cap in GB on CUDA (validated against the GPU's memory); None when unset or on CPU."""
    cap = gpu_memory_cap_gb()
    if cap is None or device.type != "cuda":
        return None
    total = gpu_total_gb(device)
    if cap > total:
        raise ValueError(
            f"LESSONS_GPU_MEMORY_GB={cap:g} is more than this GPU has ({total:.1f} GB); "
            "give at most that, or unset it"
        )
    return cap


def pick_scale(device: torch.device | None = None) -> tuple[str, str]:
    """Return (scale, why): the experiment size and the reason it was picked.

    `LESSONS_SCALE` wins; else on CPU 'small'; else on CUDA the class of the
    GPU's memory, or of `LESSONS_GPU_MEMORY_GB` when that is set.
    """
    wanted = os.environ.get("LESSONS_SCALE", "").strip().lower()
    if wanted:
        if wanted not in SCALES:
            raise ValueError(f"LESSONS_SCALE={wanted!r} is not a scale; choose one of {SCALES}")
        return wanted, f"LESSONS_SCALE={wanted}"
    device = device if device is not None else pick_device()
    if device.type != "cuda":
        ignored = " (LESSONS_GPU_MEMORY_GB applies to CUDA only)" if gpu_memory_cap_gb() else ""
        return "small", f"the CPU default{ignored}"
    cap = _checked_cap(device)
    gb, source = (cap, "LESSONS_GPU_MEMORY_GB") if cap is not None else (gpu_total_gb(device), "GPU memory")
    scale = scale_for_gpu_memory(gb)
    rule = {"small": "under 12 GB", "medium": "12 to under 40 GB", "full": "40 GB and more"}[scale]
    return scale, f"{source} {gb:.1f} GB is in the {rule} class"


def lesson_scale(device: torch.device | None = None) -> str:
    """Return the experiment size, one of `SCALES` (see `pick_scale` for how it is chosen).

    An unknown `LESSONS_SCALE` or a bad `LESSONS_GPU_MEMORY_GB` raises `ValueError`.
    """
    return pick_scale(device)[0]


def apply_memory_cap(device: torch.device) -> float | None:
    """Cap this process's CUDA allocations at `LESSONS_GPU_MEMORY_GB` GB; return the cap or None.

    The cap is on the caching allocator (`set_per_process_memory_fraction`), so it covers
    tensors, cuBLAS/cuDNN workspaces and cached blocks, but not the CUDA context, which a
    real card of that size would also have to hold. Does nothing (returns None) on CPU or
    when the variable is unset.
    """
    cap = _checked_cap(device)
    if cap is None:
        return None
    torch.cuda.set_per_process_memory_fraction(cap / gpu_total_gb(device), cuda_index(device))
    return cap


def by_scale(scale: str, *, tiny: object, small: object, full: object, medium: object = None) -> object:
    """Pick the value for `scale`: one alternative per scale.

    Args:
        scale: "tiny", "small", "medium" or "full".
        tiny, small, full: the value at each scale.
        medium: the value for 12-40 GB GPUs; the `small` value when not given.

    Returns:
        The value for `scale`.

    Raises:
        ValueError: if `scale` is not a scale.
    """
    if scale not in SCALES:
        raise ValueError(f"scale={scale!r} is not a scale; choose one of {SCALES}")
    return {"tiny": tiny, "small": small, "medium": small if medium is None else medium, "full": full}[scale]


def seed_everything(seed: int) -> None:
    """Seed Python, torch (CPU and every CUDA device) and NumPy if it is installed.

    Args:
        seed: a non-negative int.

    Raises:
        ValueError: if `seed` is not a non-negative int.
    """
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy ships with matplotlib
        return
    np.random.seed(seed % 2**32)


# How a memory figure was measured: every report names one of these.
CUDA_ALLOCATOR = "cuda-allocator"  # PyTorch's caching allocator (max_memory_allocated)
CPU_TRACKER = "cpu-tracker"  # CPU: totals from the CPU allocator's record, categories from the tracker
TENSOR_TRACKER = "tensor-tracker"  # the same tracker, on any device (timelines, categories)
METHODS = (CUDA_ALLOCATOR, CPU_TRACKER, TENSOR_TRACKER)


def memory_method(device: torch.device) -> str:
    """Name of the method that produces memory figures on `device`."""
    return CUDA_ALLOCATOR if device.type == "cuda" else CPU_TRACKER


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so that a clock read afterwards is honest."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Lesson:
    """What a notebook needs to know about where it runs."""

    device: torch.device
    scale: str
    method: str
    why: str = ""
    memory_cap_gb: float | None = None

    def describe(self) -> str:
        """One line: torch version, device, scale and memory method."""
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else (
            platform.processor() or platform.machine()
        )
        return (
            f"torch {torch.__version__} | device {self.device} ({name}) | "
            f"scale {self.scale} | memory method {self.method}"
        )


def device_of(model: nn.Module) -> torch.device:
    """The device of `model`'s first parameter (the lessons' models live on one device).

    Args:
        model: a module with at least one parameter.

    Returns:
        That parameter's device.

    Raises:
        ValueError: if `model` is not a module or has no parameters.
    """
    instance_arg("model", model, nn.Module, "torch.nn.Module")
    first = next(model.parameters(), None)
    if first is None:
        raise ValueError(f"model has no parameters, so no device: {type(model).__name__}")
    return first.device
