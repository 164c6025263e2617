"""The cards people train on: compute capability and the memory torch reports, each with its source.

`python -m helpers.plan --gpu L4` plans for an L4 as it reports itself: `total_memory` (what
`torch.cuda.get_device_properties(0).total_memory` gives, CUDA's totalGlobalMem) less the CUDA context,
which lives outside the caching allocator. A card sold as "24 GB" is not 24 GiB: an L4 reports
21.96 GiB, an A10G about 22.1 GiB, an RTX 3090 about 23.7 GiB. Totals move a little with the driver
and ECC (a T4 reports 14930 to 15109 MiB), so each row keeps the print it comes from.

`card(name)` finds a row (a `ValueError` lists the known names); `budget_bytes(card)` is its total
less the context; `auto_card()` reads the GPU this process sees. `cublas_workspace_bytes` is what a
training step's cuBLAS workspaces take from the caching allocator, beside the tensors a meta
profile counts.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from helpers.core.validate import instance_arg, int_in_range, positive_int

__all__ = ["CARDS", "CONTEXT_BYTES", "CONTEXT_SOURCE", "CUBLAS_HANDLES", "CUBLAS_SOURCE", "Card", "auto_card",
           "budget_bytes", "card", "cublas_workspace_bytes"]

MIB = 2**20

# The CUDA context with lazy module loading (CUDA >= 11.7; the default on Linux from CUDA 12.2):
# pytorch/pytorch#86509 measured 287,047,680 bytes (total - free, with one small tensor) where eager
# loading took 666,632,192; maintainers give "~300MB" (#107667) and "around 400MB" (#109888). No
# per-card figure is published for torch 2.x on CUDA 12 or 13, so the plan keeps the larger one.
CONTEXT_BYTES = 400 * 10**6
CONTEXT_SOURCE = ("CUDA context with lazy loading: about 300-400 MB (pytorch/pytorch#86509: 287,047,680 "
                  "bytes; #107667 '~300MB'; #109888 'around 400MB'); not measured per card")


@dataclass(frozen=True)
class Card:
    """A card as torch reports it."""

    name: str
    device_name: str  # torch.cuda.get_device_name()
    capability: int  # 89 for sm_89
    total_bytes: int  # torch.cuda.get_device_properties(0).total_memory
    sold_as: str
    source: str  # where the total comes from, quoted

    @property
    def total_gib(self) -> float:
        """The total in GiB, as torch's out-of-memory message prints it."""
        return self.total_bytes / 2**30


def _mib(n: int) -> int:
    return n * MIB


# total_memory from a published print: `_CudaDeviceProperties(..., total_memory=NMB)` (N = bytes // 2**20),
# or CUDA deviceQuery's "Total amount of global memory: ... (N bytes)".
CARDS: dict[str, Card] = {c.name: c for c in (
    Card("T4", "Tesla T4", 75, _mib(15109), "16 GB",
         "_CudaDeviceProperties(name='Tesla T4', major=7, minor=5, total_memory=15109MB) (Colab); "
         "14931 MiB with driver 12.2 (bottlerocket-os/bottlerocket#3798)"),
    Card("V100-16GB", "Tesla V100-SXM2-16GB", 70, _mib(16160), "16 GB",
         "_CudaDeviceProperties(name='Tesla V100-SXM2-16GB', major=7, minor=0, total_memory=16160MB)"),
    Card("L4", "NVIDIA L4", 89, 23583784960, "24 GB",
         "deviceQuery 'NVIDIA L4 ... 8.9 ... 22491 MBytes (23583784960 bytes)' "
         "(bottlerocket-os/bottlerocket-kernel-kit#139)"),
    Card("A10G", "NVIDIA A10G", 86, _mib(22587), "24 GB",
         "_CudaDeviceProperties(name='NVIDIA A10G', major=8, minor=6, total_memory=22587MB) (torch 2.15 "
         "nightly, cu130); 22723MB in older logs"),
    Card("RTX3090", "NVIDIA GeForce RTX 3090", 86, _mib(24268), "24 GB",
         "_CudaDeviceProperties(name='GeForce RTX 3090', major=8, minor=6, total_memory=24268MB) "
         "(Hugging Face Transformers docs)"),
    Card("RTX4090", "NVIDIA GeForce RTX 4090", 89, _mib(24563), "24 GB",
         "_CudaDeviceProperties(name='NVIDIA GeForce RTX 4090', major=8, minor=9, total_memory=24563MB); "
         "out-of-memory messages report 23.61-23.68 GiB, a gap no source explains"),
    Card("RTX5090", "NVIDIA GeForce RTX 5090", 120, 33677180928, "32 GB",
         "deviceQuery 'NVIDIA GeForce RTX 5090 ... 12.0 ... 32117 MBytes (33677180928 bytes)' "
         "(aikitoria/open-gpu-kernel-modules#1)"),
    Card("A100-40GB", "NVIDIA A100-SXM4-40GB", 80, 42298834944, "40 GB",
         "deviceQuery 'NVIDIA A100-SXM4-40GB ... 8.0 ... 40339 MBytes (42298834944 bytes)' "
         "(bottlerocket-os/bottlerocket#3873)"),
    Card("L40S", "NVIDIA L40S", 89, _mib(45589), "48 GB",
         "_CudaDeviceProperties(name='NVIDIA L40S', major=8, minor=9, total_memory=45589MB); "
         "'total capacity of 44.53 GiB' (Wan-Video/Wan2.1#205)"),
    Card("A6000", "NVIDIA RTX A6000", 86, _mib(48676), "48 GB",
         "_CudaDeviceProperties(name='NVIDIA RTX A6000', major=8, minor=6, total_memory=48676MB)"),
    Card("A100-80GB", "NVIDIA A100 80GB PCIe", 80, _mib(81049), "80 GB",
         "'NVIDIA A100 80GB PCIe ... Total global mem: 81049 MB ... Compute Capability: 8.0' "
         "(ekondis/mixbench#47); SXM4 out-of-memory messages: 79.14-79.25 GiB"),
    Card("H100-PCIE", "NVIDIA H100 PCIe", 90, _mib(81008), "80 GB",
         "_CudaDeviceProperties(name='NVIDIA H100 PCIe', major=9, minor=0, total_memory=81008MB)"),
    Card("H100", "NVIDIA H100 80GB HBM3", 90, _mib(81082), "80 GB",
         "_CudaDeviceProperties(name='NVIDIA H100 80GB HBM3', major=9, minor=0, total_memory=81082MB) "
         "(torch 2.0.1+cu118); 81090MB in another print"),
    Card("H200", "NVIDIA H200", 90, _mib(143156), "141 GB",
         "_CudaDeviceProperties(name='NVIDIA H200', major=9, minor=0, total_memory=143156MB) (a Modal "
         "vLLM script); our own run: 139.8 GiB (torch 2.11.0+cu130, 2026-12-04)"),
)}


def card(name: str) -> Card:
    """The card named `name` (case and spaces ignored); ValueError listing the known names."""
    key = instance_arg("name", name, str).upper().replace(" ", "")
    for c in CARDS.values():
        if key in (c.name, c.device_name.upper().replace(" ", "")):
            return c
    raise ValueError(f"unknown card {name!r}: known cards are {', '.join(CARDS)}")


def budget_bytes(c: Card) -> int:
    """What a plan may use of the card: torch's total less the CUDA context (`CONTEXT_BYTES`)."""
    return instance_arg("card", c, Card).total_bytes - CONTEXT_BYTES


def auto_card() -> Card:
    """The GPU this process sees, as a `Card` (its own total; capability and name from torch).

    Raises:
        ValueError: when torch sees no CUDA GPU.
    """
    import torch

    if not torch.cuda.is_available():
        raise ValueError("--gpu auto needs a CUDA GPU, and torch sees none; name a card instead: "
                         f"{', '.join(CARDS)}")
    props = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info()
    return Card("auto", props.name, 10 * props.major + props.minor, int(props.total_memory), "this GPU",
                f"torch.cuda.get_device_properties(0) on this machine; mem_get_info: {free / 2**30:.2f} GiB "
                f"free of {total / 2**30:.2f} GiB")


# torch's aten/src/ATen/cuda/CublasHandlePool.cpp: each (cuBLAS handle, stream) pair gets one workspace
# from the caching allocator (so it is inside max_memory_allocated), of CUBLAS_WORKSPACE_CONFIG's
# ":SIZE:COUNT" pairs (KiB) or, unset, ":4096:2:16:8" (8 MiB + 128 KiB), 32 MiB on Hopper and Blackwell
# (major 9, 10, 11, 12). Handles are per thread, and autograd runs a CUDA backward on its own device
# thread (torch/csrc/autograd/engine.cpp), so a training step holds at least two. cuBLASLt shares the
# cuBLAS workspace by default (TORCH_CUBLASLT_UNIFIED_WORKSPACE).
CUBLAS_HANDLES = 2
CUBLAS_SOURCE = ("torch aten/src/ATen/cuda/CublasHandlePool.cpp: one workspace per handle and stream, "
                 "from the caching allocator, ':4096:2:16:8' or 32 MiB on sm90 and later; the forward's "
                 "thread and autograd's device thread hold one each")
_DEFAULT_KIB = ((4096, 2), (16, 8))
_WORKSPACE_PAIR = re.compile(r":([0-9]+):([0-9]+)")


def cublas_workspace_bytes(capability: int, config: str | None = None, handles: int = CUBLAS_HANDLES) -> int:
    """What a training step's cuBLAS workspaces take from the caching allocator, in bytes.

    Args:
        capability: the card's compute capability as an sm number (90 for an H100 or H200).
        config: `CUBLAS_WORKSPACE_CONFIG` as torch reads it (":4096:8" or ":4096:2:16:8", each pair
            SIZE KiB x COUNT); None reads the environment; "" means unset.
        handles: the workspaces held at once (the forward's thread and autograd's backward thread).

    Returns:
        `handles` x one workspace: 2 x 32 MiB on sm90 and later, 2 x 8.125 MiB before, by default.
    """
    cap = int_in_range("capability", capability, 30, 129)
    positive_int("handles", handles)
    text = (os.environ.get("CUBLAS_WORKSPACE_CONFIG", "") if config is None
            else instance_arg("config", config, str))
    pairs = [(int(s), int(n)) for s, n in _WORKSPACE_PAIR.findall(text)]
    if not pairs:  # unset, or a value torch cannot parse (it warns and takes the default too)
        pairs = [(32 * 1024, 1)] if cap // 10 in (9, 10, 11, 12) else list(_DEFAULT_KIB)
    return handles * sum(size * 1024 * count for size, count in pairs)
