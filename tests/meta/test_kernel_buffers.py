"""helpers.meta.kernel_buffers: what kernels allocate inside themselves, for a profile on the meta device."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import helpers.meta.kernel_buffers as kb
from helpers.measure.memory import tracked_run
from helpers.measure.tracker import MemoryTracker
from helpers.meta.kernel_buffers import (
    CPU_CHECK_BYTES,
    attention_backward_buffer_bytes,
    cpu_inside_bytes,
    kernel_buffers,
    rng_states_counted,
)

# q_len 192 and 768 are where the CPU kernel's q_split steps from 32 to 64 and from 64 to 256
SHAPES = [(1, 2, 64, 16), (2, 4, 130, 32), (1, 1, 192, 16), (1, 3, 300, 24), (1, 1, 768, 16), (1, 2, 800, 40),
          (2, 1, 1100, 64)]
aten = torch.ops.aten
FLASH_BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def _q_split(q_len: int) -> int:
    """The CPU flash backward's query block (FlashAttentionKernel.cpp): 32, 64 or 256 rows, at most q_len."""
    return min(256 if q_len >= 768 else 64 if q_len >= 192 else 32, q_len)


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
    else:  # the CPU's own run, and one more 16-bit block for each further thread
        block = _q_split(shape[2]) * min(512, shape[2])
        assert figure - gap <= (torch.get_num_threads() - 1) * block * 2 + 256 * 4, (figure, gap)


def test_fp64_figure_is_the_cpu_gap() -> None:
    """In fp64 the kernel accumulates in fp64: 8-byte blocks and row sums."""
    gap, figure = _cpu_gap((1, 2, 100, 16), torch.float64), _meta_figure((1, 2, 100, 16), torch.float64)
    assert 0 <= figure - gap <= 256 * 8, (figure, gap)


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


def test_16bit_formula_hand_counted() -> None:
    """bf16, beside the fp32 blocks and row sum: three 16-bit blocks and oneDNN's scratch, max(96 KiB, one
    16-bit block), per thread. q_len 64: block 32 x 64 (scratch 96 KiB); q_len 800: 256 x 512 (one block)."""
    with torch.device("meta"):
        small = torch.empty(1, 2, 64, 16, dtype=torch.bfloat16)
        large = torch.empty(1, 2, 800, 40, dtype=torch.bfloat16)
    no_copy = {t.shape: torch.empty(t.shape[0], t.shape[2], t.shape[1], t.shape[3], dtype=t.dtype,
                                    device="meta").transpose(1, 2) for t in (small, large)}
    per_small = 2 * 2048 * 4 + 32 * 4 + 3 * 2048 * 2 + 96 * 1024
    per_large = 2 * 131072 * 4 + 256 * 4 + 3 * 131072 * 2 + 131072 * 2
    for q, per_thread in ((small, per_small), (large, per_large)):
        figure = attention_backward_buffer_bytes("cpu flash", no_copy[q.shape], q, q, threads=2)
        assert figure == 2 * per_thread


def test_cuda_flash_rounds_head_dims_above_128_to_64() -> None:
    """FlashAttention-2's mha_bwd: head_size_rounded = round_multiple(d, d <= 128 ? 32 : 64): 129 -> 192."""
    with torch.device("meta"):
        q = torch.empty(1, 2, 100, 129, dtype=torch.bfloat16)
    assert attention_backward_buffer_bytes("cuda flash", q, q, q) == 4 * 128 * 2 * 192 + 4 * 2 * 128


@pytest.mark.parametrize(("q_len", "kv_len"), [(100, 100), (192, 192), (768, 600)])
@pytest.mark.parametrize("grad_layout", ["bhsd", "bshd"])
def test_16bit_cpu_flash_floor_hand_counted(
    monkeypatch: pytest.MonkeyPatch, q_len: int, kv_len: int, grad_layout: str
) -> None:
    """With nothing measured on the CPU, a bf16 flash backward is the source's buffers: the copy of a grad_out
    that is not contiguous as (b, s, h, d); per thread two fp32 blocks, a row sum and two 16-bit copies of
    the blocks; and one more 16-bit block for each further thread."""
    monkeypatch.setattr(kb, "_measured", lambda func, args, kwargs: 0)
    b, h, d = 1, 3, 8
    with torch.device("meta"):
        q, out = (torch.empty(b, h, q_len, d, dtype=torch.bfloat16) for _ in range(2))
        k, v = (torch.empty(b, h, kv_len, d, dtype=torch.bfloat16) for _ in range(2))
        lse = torch.empty(b, h, q_len)
        grad = (torch.empty(b, h, q_len, d, dtype=torch.bfloat16) if grad_layout == "bhsd"
                else torch.empty(b, q_len, h, d, dtype=torch.bfloat16).transpose(1, 2))
    found: dict[str, int] = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        n = kernel_buffers("cpu", found)(FLASH_BACKWARD, (grad, q, k, v, out, lse, 0.0, False), {}, None)
    finally:
        torch.set_num_threads(threads)
    q_split = {100: 32, 192: 64, 768: 256}[q_len]
    block = q_split * min(512, kv_len)
    copy = b * h * q_len * d * 2 if grad_layout == "bhsd" else 0
    assert n == copy + 3 * (2 * block * 4 + q_split * 4 + 2 * block * 2) + 2 * block * 2
    assert found == {"cpu flash": n}


@pytest.mark.parametrize(("q_len", "kv_len"), [(64, 64), (100, 300)])
@pytest.mark.parametrize("grad_layout", ["bhsd", "bshd"])
def test_fp32_backward_call_matches_the_cpu(q_len: int, kv_len: int, grad_layout: str) -> None:
    """The flash backward called as it is, on the CPU and on meta: cross attention (q_len != kv_len) and a
    grad_out laid out unlike the query; fp32 is exact but for one thread's row sum."""
    def call(device: str) -> tuple[object, tuple]:
        with torch.device(device):
            q = torch.randn(1, 2, q_len, 16)
            k, v = torch.randn(1, 2, kv_len, 16), torch.randn(1, 2, kv_len, 16)
            grad = (torch.randn(1, 2, q_len, 16) if grad_layout == "bhsd"
                    else torch.randn(1, q_len, 2, 16).transpose(1, 2))
            if device == "cpu":
                out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False)
            else:
                out, lse = torch.empty(1, 2, q_len, 16), torch.empty(1, 2, q_len)
        return (grad, q, k, v, out, lse, 0.0, False)

    cpu_args = call("cpu")
    timeline = tracked_run(lambda: FLASH_BACKWARD(*cpu_args), MemoryTracker(device="cpu"))()
    gap = max(timeline.inside_kernels)
    figure = kernel_buffers("cpu", {})(FLASH_BACKWARD, call("meta"), {}, None)
    assert 0 <= figure - gap <= 256 * 4, (figure, gap)


def test_calls_above_the_check_size_get_the_allowance_unrun(monkeypatch: pytest.MonkeyPatch) -> None:
    """Up to CPU_CHECK_BYTES (256 MiB) of operands a call is run on the CPU; above it gets one fp32 copy of
    every operand element, and a bf16 flash backward the source's figure, unrun."""
    monkeypatch.setattr(kb, "_measured", lambda func, args, kwargs: -1)  # what a run would give
    bf16 = torch.bfloat16
    with torch.device("meta"):
        at, over = torch.empty(2**27, dtype=bf16), torch.empty(2**27 + 1, dtype=bf16)  # 256 MiB, 2 bytes more
        grad = torch.empty(1, 1, 2**13, 2**13, dtype=bf16)  # 128 MiB
        q, k_at = torch.empty(1, 1, 2**12, 2**13, dtype=bf16), torch.empty(1, 1, 2**12, 2**13, dtype=bf16)
        k_over = torch.empty(1, 1, 2**12 + 1, 2**13, dtype=bf16)
    assert at.untyped_storage().nbytes() == CPU_CHECK_BYTES
    assert cpu_inside_bytes(aten.mean.default, (at,), {}) == -1
    assert cpu_inside_bytes(aten.mean.default, (over,), {}) == 4 * (2**27 + 1)
    assert kb._half_cpu_flash_backward(FLASH_BACKWARD, (grad, q, k_at), {}, -2) > 0
    assert kb._half_cpu_flash_backward(FLASH_BACKWARD, (grad, q, k_over), {}, -2) == -2


def test_without_the_allocators_record_a_call_gets_the_allowance() -> None:
    """Inside another profiler the CPU allocator's record cannot be taken: one fp32 copy per element."""
    with torch.device("meta"):
        x = torch.empty(13, 77, dtype=torch.bfloat16)  # a shape no other test measures (figures are cached)
    with torch.profiler.profile():
        n = cpu_inside_bytes(aten.mean.dim, (x, [1]), {})
    assert n == 4 * 13 * 77


def test_a_cpu_stand_in_has_the_meta_tensors_storage() -> None:
    """The CPU run's operand has the meta tensor's shape, strides, offset and storage (at least 1 element)."""
    with torch.device("meta"):
        tensors = (torch.empty(1), torch.empty(0), torch.empty(6, dtype=torch.float16)[2:5])
    for t in tensors:
        real = kb._real(t)
        assert real.device.type == "cpu"
        assert (real.shape, real.stride(), real.storage_offset()) == (t.shape, t.stride(), t.storage_offset())
        assert real.untyped_storage().nbytes() == max(t.untyped_storage().nbytes(), t.element_size())


def _bf16(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.bfloat16)


# ops whose CPU kernels allocate inside: oneDNN's convolutions and 16-bit matrix products, the flash forward,
# an out= product, and pointwise ops (in place too, and 1-D) whose operands differ in dtype
_OWN_BYTES_CASES = {
    "fp32 conv2d": (F.conv2d, lambda: (torch.randn(2, 8, 16, 16), torch.randn(16, 8, 3, 3))),
    "fp32 conv2d backward": (lambda x, w: F.conv2d(x, w).sum().backward(),
                             lambda: (torch.randn(2, 8, 16, 16, requires_grad=True),
                                      torch.randn(16, 8, 3, 3, requires_grad=True))),
    "fp32 _convolution": (lambda x, w: aten._convolution(x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                                                         False, False, True, True),
                          lambda: (torch.randn(2, 8, 16, 16), torch.randn(16, 8, 3, 3))),
    "fp32 flash forward": (lambda *qkv: aten._scaled_dot_product_flash_attention_for_cpu(*qkv, 0.0, True),
                           lambda: tuple(torch.randn(1, 2, 64, 16) for _ in range(3))),
    "bf16 mm": (torch.mm, lambda: (_bf16(64, 96), _bf16(96, 80))),
    "bf16 addmm": (torch.addmm, lambda: (_bf16(80), _bf16(64, 96), _bf16(96, 80))),
    "bf16 bmm": (torch.bmm, lambda: (_bf16(3, 64, 96), _bf16(3, 96, 80))),
    "bf16 baddbmm": (torch.baddbmm, lambda: (_bf16(3, 64, 80), _bf16(3, 64, 96), _bf16(3, 96, 80))),
    "bf16 addbmm": (torch.addbmm, lambda: (_bf16(64, 80), _bf16(3, 64, 96), _bf16(3, 96, 80))),
    "bf16 addmv": (torch.addmv, lambda: (_bf16(64), _bf16(64, 96), _bf16(96))),
    "bf16 mv": (torch.mv, lambda: (_bf16(64, 96), _bf16(96))),
    "bf16 mm out=": (lambda a, b, c: torch.mm(a, b, out=c),
                     lambda: (_bf16(64, 96), _bf16(96, 80), _bf16(64, 80))),
    "bf16 add_ fp32": (lambda x, f: x.add_(f), lambda: (_bf16(16, 96), torch.randn(16, 96))),
    "bf16 sum dtype= out=": (lambda x, o: torch.sum(x, 1, dtype=torch.float32, out=o),  # two keywords
                             lambda: (_bf16(16, 96), torch.empty(16))),
    "1-D fp32 + bf16": (lambda f, x: f + x, lambda: (torch.randn(1536), _bf16(1536))),
}


def _run(fn: object, make: object, device: str) -> object:
    """`fn` on tensors `make()` makes on `device`, tracked (on meta with the CPU target's kernel buffers)."""
    with torch.device(device):
        tensors = make()
    callback = kernel_buffers("cpu", {}) if device == "meta" else None
    return tracked_run(lambda: fn(*tensors), MemoryTracker(device=device, kernel_buffers=callback))()


@pytest.mark.parametrize("case", list(_OWN_BYTES_CASES))
def test_kernels_that_allocate_inside_are_counted_on_meta(case: str) -> None:
    """Each kernel's own buffers on meta: at most 64 bytes above the CPU allocator's record, never below."""
    fn, make = _OWN_BYTES_CASES[case]
    if case == "fp32 _convolution":
        try:
            fn(*(t.to("meta") for t in make()))
        except NotImplementedError:  # torch 2.5: no meta kernel for it; models reach aten.convolution instead
            pytest.skip(f"torch {torch.__version__} cannot run aten._convolution on meta")
    cpu, meta = max(_run(fn, make, "cpu").total), max(_run(fn, make, "meta").total)
    assert 0 <= meta - cpu <= 64, (case, meta, cpu)


def test_ops_whose_cpu_kernels_allocate_nothing_inside_add_nothing() -> None:
    def step(a: torch.Tensor, b: torch.Tensor, y: torch.Tensor, w: torch.Tensor, i: torch.Tensor) -> None:
        F.cross_entropy((a + b).softmax(-1), y).backward()
        F.embedding(i, w)

    def make() -> tuple[torch.Tensor, ...]:
        long = torch.long
        return (torch.randn(16, 96, requires_grad=True), torch.randn(16, 96), torch.zeros(16, dtype=long),
                torch.randn(100, 32), torch.zeros(64, dtype=long))

    cpu, meta = _run(step, make, "cpu"), _run(step, make, "meta")
    assert max(cpu.inside_kernels) == 0
    assert meta.inside_kernels == [0] * len(meta.ops), list(zip(meta.ops, meta.inside_kernels, strict=True))


def test_big_calls_whose_kernels_copy_nothing_get_no_allowance() -> None:
    """Above CPU_CHECK_BYTES a call that is run gets an allowance; these are not run: a same-dtype pointwise
    op, a 0-dim operand of another dtype (copied as one number), an embedding (its int64 indices are read as
    they are). The CPU's record of the same calls, smaller, shows (next to) nothing inside them."""
    def calls(n: int) -> list[tuple[object, tuple]]:
        return [(aten.add.Tensor, (torch.empty(n), torch.empty(n))),
                (aten.mul.Tensor, (torch.empty(2 * n, dtype=torch.bfloat16), torch.tensor(2.0))),
                (aten.embedding.default, (torch.empty(n // 64, 64), torch.zeros(8, 16, dtype=torch.long)))]

    with torch.device("meta"):
        big = calls(2**26 + 64)  # fp32 operands above 256 MiB
    callback = kernel_buffers("cpu", {})
    assert [callback(func, args, {}, None) for func, args in big] == [0, 0, 0]
    for func, args in calls(64 * 16):
        timeline = tracked_run(lambda func=func, args=args: func(*args), MemoryTracker(device="cpu"))()
        assert max(timeline.inside_kernels) <= 2, func


def test_python_numbers_are_counted_for_a_cpu_target_only() -> None:
    """24 bytes per wrapped Python number (at most 20 on the CPU allocator, below); with autograd, 8 of
    them are held. Two numbers count twice; a tensor operand next to a number does not count."""
    callback, cuda = kernel_buffers("cpu", {}), kernel_buffers("cuda", {})
    with torch.device("meta"):
        x, y = torch.randn(16), torch.randn(16, requires_grad=True)
    assert callback(aten.mul_.Tensor, (x, 0.9), {}, None) == 24
    assert callback(aten.mul.Tensor, (y, 0.5), {}, None) == (16, 8)
    assert callback(aten.addcmul.default, (y, 0.5, 0.7), {}, None) == (32, 16)
    assert callback(aten.addcmul.default, (x, 0.5, x), {}, None) == 24
    assert callback(aten.add.out, (x, 0.5), {"out": x}, None) == 24  # a Tensor argument given by name
    assert cuda(aten.mul_.Tensor, (x, 0.9), {}, None) == 0
    assert cuda(aten.mean.dim, (x.to(torch.bfloat16), [0]), {}, None) == 0
    real = torch.randn(16)
    timeline = tracked_run(lambda: real.mul_(0.9), MemoryTracker(device="cpu"))()
    assert 0 < max(timeline.inside_kernels) <= 24


def test_an_in_place_op_on_a_real_tensor_is_not_run_again() -> None:
    """A meta profile may meet real CPU tensors (an optimizer's step counters): an in-place op on them is
    never repeated to measure it."""
    callback = kernel_buffers("cpu", {})
    x, h = torch.zeros(4), torch.ones(16, dtype=torch.bfloat16)
    callback(aten.add_.Tensor, (x, 1.0), {}, None)
    callback(aten.cumsum.out, (h, 0), {"out": h}, None)
    assert x.tolist() == [0.0] * 4 and h.tolist() == [1.0] * 16


def test_each_recompute_holds_one_copy_and_positional_arguments_are_read() -> None:
    """Recomputes one after another each hold one state, whether fork_rng saves the CPU state itself (a CPU
    device type) or not (meta); fork_rng(devices, enabled) is read positionally."""
    size = torch.get_rng_state().untyped_storage().nbytes()
    tracker = MemoryTracker(device="meta")
    calls = [("meta", ()), ("meta", ([],)), ("meta", (None, True)), ("meta", (None, False)),
             ("cpu", ([],)), ("cpu", ([],)), ("cpu", ([], False))]
    held = []
    with rng_states_counted(), tracker:
        before = tracker.current_bytes
        for device_type, args in calls:
            with torch.random.fork_rng(*args, device_type=device_type):
                held.append(tracker.current_bytes - before)
    assert held == [size, size, size, 0, size, size, 0]
