"""What kernels allocate inside themselves, for a profile on the meta device (lesson 09).

A dispatch-level tracker sees the storages an op returns, never the buffers the op's
kernel allocates and frees before returning. On a real CPU the allocator's record shows
them (`helpers.measure.allocator`); on the meta device there is no allocator, so
`helpers.meta_profile` adds them with `kernel_buffers(target)`, a
`MemoryTracker(kernel_buffers=...)` callback that gives each op's own bytes:

- **Fused-attention backwards**: `attention_backward_buffer_bytes`, derived from the
  kernels' source for a CPU target and assumed for a CUDA one (its docstring says how).
- **Other CPU kernels that allocate inside** (convolutions, whose oneDNN kernels reorder
  their operands into blocked layouts; 16-bit matrix products, whose oneDNN kernels keep
  scratch buffers; the CPU flash-attention forward; 16-bit reductions and normalisations,
  such as `mean`, which sums an fp32 copy of its input; pointwise ops whose operands differ
  in dtype, whose CPU kernels copy the others to the common dtype): for a CPU target each distinct call
  (op, shapes, strides, dtypes, arguments) is run once on the real CPU with tensors of
  those shapes and the same thread count, and the allocator's record of that run gives its
  own bytes (`cpu_inside_bytes`).
  Calls above `CPU_CHECK_BYTES` of operands are not run: they get an allowance of one
  fp32 copy of every operand, an upper bound we have not checked against a kernel.
- **Python numbers**: `x.mul_(0.9)` runs the op that takes a Tensor, so torch wraps 0.9
  into an 8-byte CPU tensor before the op, and the kernel converts it (a few more bytes):
  24 bytes per such argument (at most 20 measured on torch 2.13), for a CPU target.

`rng_states_counted()` makes a CPU-target profile count the CPU random-number state that
`torch.utils.checkpoint` saves for each checkpointed region (`torch.get_rng_state()`, 5 KB,
made outside any op), and the copy its recompute holds inside `fork_rng`. A CUDA target
keeps those on the CPU, so they are not GPU memory.
What a CUDA kernel allocates beyond attention (cuBLAS/cuDNN workspaces) is not modelled:
that is what `helpers.plan`'s CUDA margin is for.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator

import torch

from helpers.measure.allocator import AllocatorRecord
from helpers.measure.dispatch import op_facts, tensors_in
from helpers.measure.tracker import KernelBuffers, active_trackers

__all__ = ["CPU_CHECK_BYTES", "attention_backward_buffer_bytes", "cpu_inside_bytes", "kernel_buffers",
           "meta_rng_module", "rng_states_counted"]

CPU_CHECK_BYTES = 256 * 2**20  # operands up to this size are run once on the real CPU
SCALAR_BYTES = 24  # a wrapped Python number (8 bytes) and what the kernel makes of it

_ATTENTION_BACKWARD = {
    "_scaled_dot_product_flash_attention_for_cpu_backward": "cpu flash",
    "_scaled_dot_product_flash_attention_backward": "cuda flash",
    "_scaled_dot_product_efficient_attention_backward": "cuda memory-efficient",
}
_CONVOLUTIONS = frozenset({"convolution", "convolution_backward", "_convolution"})
_MATMULS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv"})
_HALF = (torch.float16, torch.bfloat16)
# reductions and normalisations whose CPU kernels may work on an fp32 copy of a 16-bit input
# (torch 2.13: `mean` sums an fp32 copy, `_fused_rms_norm` and `_safe_softmax` keep fp32 buffers)
_HALF_IN_FP32 = frozenset({
    "mean", "sum", "nansum", "prod", "cumsum", "var", "std", "var_mean", "std_mean", "linalg_vector_norm",
    "norm", "_softmax", "_log_softmax", "_safe_softmax", "_softmax_backward_data",
    "_log_softmax_backward_data", "native_layer_norm", "native_layer_norm_backward", "_fused_rms_norm",
    "_fused_rms_norm_backward", "native_batch_norm", "native_batch_norm_backward",
    "_native_batch_norm_legit", "_native_batch_norm_legit_no_training", "_native_batch_norm_legit_functional",
    "native_group_norm", "native_group_norm_backward", "nll_loss_forward", "nll_loss_backward",
    "nll_loss2d_forward", "nll_loss2d_backward", "mse_loss", "mse_loss_backward",
})


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def attention_backward_buffer_bytes(
    kernel: str, grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, *, threads: int | None = None
) -> int:
    """Bytes a fused-attention backward allocates inside itself (freed before it returns).

    `query` and `grad_out` are (batch, heads, q_len, head_dim), `key` (batch, heads_kv, kv_len,
    head_dim); only their shapes, strides and dtype are read, so meta tensors do.

    - "cpu flash" (`_scaled_dot_product_flash_attention_for_cpu_backward`, from PyTorch's
      aten/src/ATen/native/cpu/FlashAttentionKernel.cpp): a contiguous copy of `grad_out`
      when its (batch, q_len, heads, head_dim) view is not contiguous; per thread
      (`threads`, default `torch.get_num_threads()`) the attention block and its gradient,
      q_split x kv_split in the accumulation type (fp32; fp64 for fp64), with q_split 32,
      64 or 256 for sequences under 192, under 768 and longer, and kv_split 512 (each at
      most the sequence), and one row sum (q_split floats). In bf16/fp16 also their 16-bit
      copies and, for the 16-bit matrix products, one more 16-bit block and a scratch
      buffer of max(96 KiB, one 16-bit block) per thread: an allowance measured on torch
      2.13 (oneDNN's buffers, which the source does not size), so the figure is an upper
      bound there, and exact to a row sum in fp32.
    - "cuda flash" (FlashAttention-2's `mha_bwd`; assumed, not measured here): an fp32
      dq accumulator of (batch, q_len rounded up to 128, heads, head_dim rounded up to 32,
      or to 64 above 128) and the fp32 softmax row sums (batch, heads, q_len rounded to 128).
    - "cuda memory-efficient" (the CUTLASS kernel; assumed): the fp32 row sums (batch,
      heads, q_len), and for 16-bit inputs fp32 accumulators for dq, dk and dv.

    Any other kernel name (the math path) allocates nothing the tracker does not see: 0.
    """
    b, h, q_len, d = query.shape
    kv_len, h_kv = key.shape[-2], key.shape[-3]
    half = query.dtype in _HALF
    if kernel == "cpu flash":
        t = torch.get_num_threads() if threads is None else threads
        q_split = min(256 if q_len >= 768 else 64 if q_len >= 192 else 32, q_len)
        kv_split = min(512, kv_len)
        accum = 8 if query.dtype == torch.float64 else 4
        block = q_split * kv_split
        per_thread = 2 * block * accum + q_split * accum
        if half:
            item = query.element_size()
            per_thread += 3 * block * item + max(96 * 1024, block * item)
        contiguous = grad_out.transpose(1, 2).is_contiguous()
        return (0 if contiguous else grad_out.numel() * grad_out.element_size()) + t * per_thread
    if kernel == "cuda flash":
        q_round = _round_up(q_len, 128)
        return 4 * b * q_round * h * _round_up(d, 32 if d <= 128 else 64) + 4 * b * h * q_round
    if kernel == "cuda memory-efficient":
        return 4 * b * h * q_len + (4 * (b * h * q_len * d + 2 * b * h_kv * kv_len * d) if half else 0)
    return 0


def _spec(value: object) -> object:
    """A hashable description of an op argument: a tensor's shape, strides and dtype, else the value."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), tuple(value.stride()), value.dtype, value.storage_offset())
    if isinstance(value, tuple | list):
        return tuple(_spec(v) for v in value)
    return value if isinstance(value, int | float | bool | str | type(None) | torch.dtype) else repr(value)


def _real(value: object) -> object:
    """A CPU tensor of the same shape, strides and dtype (zeros) for a meta tensor, else the value."""
    if isinstance(value, torch.Tensor):
        if value.device.type != "meta":
            return value
        size = value.untyped_storage().nbytes() // value.element_size() if value.element_size() else 0
        base = torch.zeros(max(size, 1), dtype=value.dtype)
        return base.as_strided(value.shape, value.stride(), value.storage_offset())
    if isinstance(value, tuple | list):
        return type(value)(_real(v) for v in value)
    return value


# (op, operand description, CPU threads) -> bytes; operands themselves are not kept. oneDNN's
# buffers are per thread, so a figure measured with one thread count is not reused for another.
_MEASURED: dict[tuple, int] = {}


def _measured(func: object, args: tuple, kwargs: dict) -> int:
    key = (func, _spec(args), _spec(sorted(kwargs.items(), key=lambda kv: kv[0])), torch.get_num_threads())
    if key in _MEASURED:
        return _MEASURED[key]
    real_args, real_kwargs = _real(args), {k: _real(v) for k, v in kwargs.items()}
    with torch.no_grad(), AllocatorRecord() as record:
        out = func(*real_args, **real_kwargs)
    if record.recorded:
        # the most it held beyond what it returns: the meta profile counts the outputs already. Only
        # outputs allocated during the call: an in-place or out= op returns a storage made before it
        allocated = {address for _, address, size in record.events if size > 0}
        outputs = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors_in(out)
                   if t.untyped_storage().data_ptr() in allocated}
        live = peak = 0
        for _, _, size in record.events:
            live += size
            peak = max(peak, live)
        peak = max(0, peak - sum(outputs.values()))
    else:
        peak = _allowance(args)
    if len(_MEASURED) < 4096:
        _MEASURED[key] = peak
    return peak


def _allowance(args: object) -> int:
    """One fp32 copy of every tensor operand: the upper bound used where no CPU run is made."""
    return sum(4 * t.numel() for t in tensors_in(args))


def cpu_inside_bytes(func: object, args: tuple, kwargs: dict) -> int:
    """How many bytes the CPU kernel of `func` holds, at its most, beyond the outputs it returns.

    Measured once per distinct call (cached) by running `func` on zero-filled CPU tensors
    with the operands' shapes, strides and dtypes, under the CPU allocator's record: the
    largest allocated total during the call less the outputs' bytes (a profile counts the
    outputs anyway, from the op on). Operands larger than `CPU_CHECK_BYTES` get
    `_allowance` instead, and so does a torch whose allocator record is unavailable.
    """
    operands = sum(t.untyped_storage().nbytes() for t in tensors_in((args, kwargs)))
    if operands > CPU_CHECK_BYTES:
        return _allowance((args, kwargs))
    return _measured(func, args, kwargs)


def _half_cpu_flash_backward(func: object, args: tuple, kwargs: dict, bound: int) -> int:
    """16-bit CPU flash backward: the source's buffers, or the CPU's measured figure if larger.

    The source sizes everything but oneDNN's scratch for 16-bit matrix products; a run on
    the CPU measures that (one thread's worth), and each further thread may hold one more
    16-bit block at the same moment. Above `CPU_CHECK_BYTES` the formula's allowance stands.
    """
    grad_out, query, key = args[0], args[1], args[2]
    if sum(t.untyped_storage().nbytes() for t in tensors_in(args)) > CPU_CHECK_BYTES:
        return bound
    t, item = torch.get_num_threads(), query.element_size()
    q_len, kv_len = query.shape[-2], key.shape[-2]
    q_split = min(256 if q_len >= 768 else 64 if q_len >= 192 else 32, q_len)
    block = q_split * min(512, kv_len)
    copy = 0 if grad_out.transpose(1, 2).is_contiguous() else grad_out.numel() * grad_out.element_size()
    base = copy + t * (2 * block * 4 + q_split * 4 + 2 * block * item)  # fp32 blocks, row sum, 16-bit copies
    return max(base, _measured(func, args, kwargs)) + (t - 1) * block * item


def _wrapped_numbers(func: object, args: tuple, kwargs: dict) -> int:
    """How many Python numbers this call passes where the op takes a Tensor (torch wraps each one)."""
    n = 0
    for i, name in op_facts(func).tensor_args:
        value = args[i] if i < len(args) else kwargs.get(name)
        n += isinstance(value, int | float | complex)
    return n


def _needs_cpu_run(func: object, tensors: list[torch.Tensor]) -> bool:
    """Whether this call's CPU kernel may allocate inside itself, so that it is run once to measure.

    `tensors` are the call's positional tensor operands.
    """
    name, mutable = op_facts(func)[:2]
    if name in _CONVOLUTIONS or name == "_scaled_dot_product_flash_attention_for_cpu":
        return True
    on_meta = all(t.device.type == "meta" for t in tensors)
    if mutable and not on_meta:
        return False  # run only on fresh copies: never repeat an in-place op on real tensors
    if name in _MATMULS or name in _HALF_IN_FP32:
        return any(t.dtype in _HALF for t in tensors)
    if not on_meta:
        return False  # (a mutable op here is on meta: it is run on fresh copies)
    dtypes = set()
    for t in tensors:
        if t.dim() > 0 and t.is_floating_point():
            dtypes.add(t.dtype)
    return len(dtypes) > 1


def kernel_buffers(target: str, found: dict[str, int]) -> KernelBuffers:
    """A `MemoryTracker(kernel_buffers=...)` callback for a meta profile aimed at `target`.

    It returns each op's own bytes (see the module docstring) and notes, in `found`, the
    largest figure per fused-attention backward kernel ("cpu flash", "cuda flash",
    "cuda memory-efficient").
    """

    def buffers(func: object, args: tuple, kwargs: dict, out: object) -> int:
        kernel = _ATTENTION_BACKWARD.get(op_facts(func).name)
        if kernel is not None:
            n = attention_backward_buffer_bytes(kernel, args[0], args[1], args[2])
            if kernel == "cpu flash" and args[1].dtype in _HALF:
                n = _half_cpu_flash_backward(func, args, kwargs, n)
            found[kernel] = max(found.get(kernel, 0), n)
            return n
        if target != "cpu":
            return 0
        tensors = tensors_in(args)
        inside = cpu_inside_bytes(func, args, kwargs) if _needs_cpu_run(func, tensors) else 0
        numbers = _wrapped_numbers(func, args, kwargs)
        if numbers and any(t.requires_grad for t in tensors):
            # autograd may save a wrapped number for backward: held until the micro-step's backward ends
            return inside + (SCALAR_BYTES - 8) * numbers, 8 * numbers
        return inside + SCALAR_BYTES * numbers

    return buffers


@contextlib.contextmanager
def meta_rng_module() -> Iterator[None]:
    """Let checkpoint's recompute fork the RNG of meta tensors on older torch.

    Checkpoint's recompute calls `torch.random.fork_rng(device_type="meta")`, which on
    torch 2.5 looks up a `torch.meta` module and raises if there is none ("torch has no
    module of meta"), although it then forks no meta device (the meta device has no random
    state). While inside, a stand-in module with no devices answers that lookup; newer torch does
    not need it, and it is removed afterwards.
    """
    if hasattr(torch, "meta"):
        yield
        return
    stand_in = types.ModuleType("torch.meta")
    stand_in.device_count = lambda: 0  # type: ignore[attr-defined]  (asked when no devices are named)
    torch.meta = stand_in  # type: ignore[attr-defined]
    try:
        yield
    finally:
        del torch.meta  # type: ignore[attr-defined]


@contextlib.contextmanager
def rng_states_counted() -> Iterator[None]:
    """While inside, each CPU random-number state made for a checkpoint is counted as "other".

    `torch.utils.checkpoint` saves the CPU generator's state (`torch.get_rng_state()`, 5 KB)
    for every checkpointed region and keeps it until the region is recomputed, and the
    recompute runs inside `torch.random.fork_rng`, which holds one more copy until it ends.
    Both are made outside any op, so a tracker on the meta device would not see them; and
    on meta, newer torch's `fork_rng` forks nothing, where a CPU target's holds the CPU
    state. While inside, every `torch.get_rng_state()` result is watched by the active
    trackers, and a `fork_rng` that made none holds one for its duration. It also answers
    torch 2.5's lookup of a `torch.meta` module (`meta_rng_module`).
    """
    original, original_fork = torch.get_rng_state, torch.random.fork_rng
    made = [0]

    def get_rng_state() -> torch.Tensor:
        state = original()
        made[0] += 1
        for tracker in active_trackers():
            tracker.watch(state, "other")
        return state

    @contextlib.contextmanager
    def fork_rng(*args: object, **kwargs: object) -> Iterator[None]:
        enabled = kwargs.get("enabled", args[1] if len(args) > 1 else True)
        before = made[0]
        with original_fork(*args, **kwargs):  # type: ignore[arg-type]
            held = get_rng_state() if enabled and made[0] == before else None
            yield
        del held

    torch.get_rng_state, torch.random.fork_rng = get_rng_state, fork_rng
    try:
        with meta_rng_module():
            yield
    finally:
        torch.get_rng_state, torch.random.fork_rng = original, original_fork
