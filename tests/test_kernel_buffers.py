"""helpers.kernel_buffers: what kernels allocate inside themselves, for a profile on the meta device."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers.kernel_buffers import attention_backward_buffer_bytes, kernel_buffers
from helpers.memory import MemoryTracker, tracked_run

SHAPES = [(1, 2, 64, 16), (2, 4, 130, 32), (1, 3, 300, 24), (1, 2, 800, 40), (2, 1, 1100, 64)]


def _cpu_gap(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    """The bytes the CPU allocator held inside the flash backward (what the tracker cannot see)."""
    q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))

    def step() -> None:
        out = F.scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype), is_causal=True)
        out.float().pow(2).sum().backward()

    timeline = tracked_run(step, MemoryTracker(device="cpu"))()
    inside = [n for n, op in zip(timeline.inside_kernels, timeline.ops, strict=True)
              if op == "_scaled_dot_product_flash_attention_for_cpu_backward"]
    assert inside, "the CPU ran its flash kernel"
    return max(inside)


def _meta_figure(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    found: dict[str, int] = {}
    callback = kernel_buffers("cpu", found)
    with torch.device("meta"):
        q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))
    tracker = MemoryTracker(device="meta", kernel_buffers=callback)
    with tracker:
        out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q.to(dtype), k.to(dtype), v.to(dtype), 0.0, True)[0]
        out.float().pow(2).sum().backward()
    return found["cpu flash"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=[str(s) for s in SHAPES])
def test_meta_figure_is_at_least_the_cpu_gap(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    gap, figure = _cpu_gap(shape, dtype), _meta_figure(shape, dtype)
    assert figure >= gap > 0, (figure, gap)
    if dtype == torch.float32:  # the source sizes every fp32 buffer: exact but for one thread's row sum
        assert figure - gap <= 256 * 4, (figure, gap)


def test_fp32_formula_hand_counted() -> None:
    """q_len 800 -> q_split 256, kv_split 512; per thread 2 blocks of 256 x 512 floats + 256 floats;
    grad_out (1, 2, 800, 40) arrives non-contiguous in the kernel's (b, s, h, d) view: one fp32 copy."""
    with torch.device("meta"):
        q = torch.empty(1, 2, 800, 40)
        grad = torch.empty(1, 2, 800, 40)
    per_thread = 2 * 256 * 512 * 4 + 256 * 4
    copy = 1 * 2 * 800 * 40 * 4
    assert attention_backward_buffer_bytes("cpu flash", grad, q, q, threads=3) == copy + 3 * per_thread
    contiguous = torch.empty(1, 800, 2, 40, device="meta").transpose(1, 2)
    assert attention_backward_buffer_bytes("cpu flash", contiguous, q, q, threads=3) == 3 * per_thread


def test_cuda_assumptions_hand_counted() -> None:
    with torch.device("meta"):
        q = torch.empty(2, 8, 1000, 72, dtype=torch.bfloat16)
    # FlashAttention-2: fp32 dq accumulator (2, 1024, 8, 96) and row sums (2, 8, 1024)
    assert attention_backward_buffer_bytes("cuda flash", q, q, q) == 4 * 2 * 1024 * 8 * 96 + 4 * 2 * 8 * 1024
    # memory-efficient: row sums, and fp32 dq, dk, dv for 16-bit inputs
    assert attention_backward_buffer_bytes("cuda memory-efficient", q, q, q) == (
        4 * 2 * 8 * 1000 + 4 * 3 * 2 * 8 * 1000 * 72)
    assert attention_backward_buffer_bytes("cuda memory-efficient", q.float(), q.float(), q.float()) == (
        4 * 2 * 8 * 1000)
    assert attention_backward_buffer_bytes("math", q, q, q) == 0


def test_python_numbers_autograd_may_keep_are_held_until_backward_ends() -> None:
    """`x * 0.5` on a tensor that requires grad: torch wraps 0.5 into an 8-byte tensor that the
    multiplication's backward may keep; the meta profile holds 8 bytes until drop_held()."""
    callback = kernel_buffers("cpu", {})
    with torch.device("meta"):
        x = torch.randn(4, requires_grad=True)
    tracker = MemoryTracker(device="meta", kernel_buffers=callback)
    with tracker:
        y = x * 0.5
        held = tracker.current_bytes
        tracker.drop_held()
        dropped = tracker.current_bytes
    del y
    assert held - dropped == 8
