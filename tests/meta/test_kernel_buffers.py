"""helpers.meta.kernel_buffers: what kernels allocate inside themselves, for a profile on the meta device."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers.measure.memory import tracked_run
from helpers.measure.tracker import MemoryTracker
from helpers.meta.kernel_buffers import attention_backward_buffer_bytes, kernel_buffers, rng_states_counted

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


# 16-bit reductions and normalisations, and mixed-dtype pointwise ops, allocate inside their CPU kernels
_INSIDE_CASES = {
    "bf16 mean": (lambda x, f: x.mean(dim=(2, 3)), (8, 12, 6, 6)),
    "bf16 sum to fp32": (lambda x, f: x.sum(dim=1, dtype=torch.float32), (16, 96)),
    "bf16 rms_norm": (lambda x, f: F.rms_norm(x, (96,)), (16, 96)),
    "fp32 plus bf16": (lambda x, f: f + x, (16, 96)),
    "bf16 layer_norm": (lambda x, f: F.layer_norm(x, (96,)), (16, 96)),
}


def _peak_over_inputs(fn: object, shape: tuple[int, ...], device: str) -> int:
    """The peak bytes of `fn(x, f)` beyond its inputs: on the CPU from the allocator's record, on meta
    from the tracker with the CPU target's kernel buffers."""
    with torch.device(device):
        x, f = torch.randn(shape, dtype=torch.bfloat16), torch.randn(shape)
    callback = kernel_buffers("cpu", {}) if device == "meta" else None
    tracker = MemoryTracker(device=device, kernel_buffers=callback)
    timeline = tracked_run(lambda: fn(x, f), tracker)()
    return max(timeline.total)


@pytest.mark.parametrize("case", list(_INSIDE_CASES))
def test_kernels_that_compute_in_fp32_are_counted_on_meta(case: str) -> None:
    fn, shape = _INSIDE_CASES[case]
    cpu, meta = _peak_over_inputs(fn, shape, "cpu"), _peak_over_inputs(fn, shape, "meta")
    assert 0 <= meta - cpu <= 64, (case, meta, cpu)  # never below the allocator's record, and within bytes


def test_a_recompute_holds_a_copy_of_the_cpu_random_state() -> None:
    """On meta, newer torch's fork_rng forks nothing; a CPU target's holds the CPU state through the
    recompute (5 KB), and the meta profile counts it there and only there."""
    size = torch.get_rng_state().untyped_storage().nbytes()
    tracker = MemoryTracker(device="meta")
    with rng_states_counted(), tracker:
        before = tracker.current_bytes
        with torch.random.fork_rng(device_type="meta"):
            inside = tracker.current_bytes
        after = tracker.current_bytes
        with torch.random.fork_rng(device_type="meta", enabled=False):
            disabled = tracker.current_bytes
    assert (inside - before, after - before, disabled - before) == (size, 0, 0)
