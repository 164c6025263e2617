"""What `torch.compile` chooses to recompute, measured as saved bytes against FLOPs (instrument).

Under `torch.compile`, AOTAutograd traces forward and backward as one joint graph and
its min-cut partitioner decides which forward values the backward keeps and which it
recomputes. `torch._functorch.config.activation_memory_budget` (1.0: the partitioner's
default, fastest cut; 0.0: keep as little as possible) trades saved bytes for recompute.
`backend="aot_eager_decomp_partition"` runs that partitioner without generating code, so
the trade is visible on a CPU, in seconds.

Following torchtitan (`torchtitan/distributed/compile.py` compiles each transformer
block), the compiled region is one block of the lessons' GPT, called through
`model.block_wrapper`; every block shares one compiled graph.

- `RecomputePoint`: one point of the curve: saved bytes, recompute FLOPs, backward FLOPs.
- `compiled_point(model, h, budget)` and `eager_point(model, h, wrapper)`: one point each,
  for the compiled blocks at a budget, or for eager blocks under any block wrapper
  (full checkpointing, a selective policy, or None).
- `saved_by_compiled(out, keep)`: bytes the compiled backward nodes hold for `out`.
- `backward_flops(out)`: FLOPs `FlopCounterMode` counts in `out`'s backward.
- `selective(policy)`: a block wrapper that checkpoints with a selective policy.

.. warning:: Never measure compiled code under a `TorchDispatchMode` (the lessons' memory
   tracker or `FlopCounterMode` around the forward): with a mode active, the compiled
   graph does not run and you measure eager code. Here the saved bytes are read from the
   autograd graph instead, and FLOPs are counted around the backward only.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts
from torch.utils.flop_counter import FlopCounterMode

from helpers.core.validate import callable_arg, number_in_range, tensor_arg
from helpers.measure.memory import saved_activation_bytes
from helpers.models.nets import BlockWrapper
from helpers.techniques.checkpointing import apply_ac, make_block_wrapper

__all__ = [
    "BACKEND",
    "BUDGETS",
    "RecomputePoint",
    "backward_flops",
    "compiled_point",
    "eager_point",
    "full_checkpoint",
    "saved_by_compiled",
    "selective",
]

BACKEND = "aot_eager_decomp_partition"  # AOTAutograd + Inductor's decompositions + min-cut, no codegen
BUDGETS = (1.0, 0.75, 0.5, 0.25, 0.0)


@dataclass(frozen=True)
class RecomputePoint:
    """One way to run the blocks: what backward keeps, and what it recomputes (counted FLOPs)."""

    label: str
    saved_bytes: int
    backward_flops: int
    baseline_flops: int  # backward FLOPs of the plain eager blocks (nothing recomputed)
    compiled: bool
    budget: float | None = None  # the activation_memory_budget it was compiled at (compiled points)
    warnings: tuple[str, ...] = ()  # what torch warned while compiling (caught, so none leaks)

    @property
    def recompute_flops(self) -> int:
        """Backward FLOPs beyond the plain backward's: the forward work done again."""
        return self.backward_flops - self.baseline_flops


full_checkpoint: BlockWrapper = make_block_wrapper("full")  # type: ignore[assignment]
"""Lesson 02's full checkpoint of one block (a `model.block_wrapper`): `apply_ac`'s "full" mode."""


def selective(policy: Callable[..., object]) -> BlockWrapper:
    """A block wrapper: non-reentrant `checkpoint` with `create_selective_checkpoint_contexts(policy)`.

    Args:
        policy: a selective-checkpoint policy(ctx, op, *args, **kwargs).

    Returns:
        wrapper(block, x), for `model.block_wrapper` or `apply_ac`.
    """
    callable_arg("policy", policy, "a selective-checkpoint policy(ctx, op, *args, **kwargs)")

    def wrapper(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
        context = functools.partial(create_selective_checkpoint_contexts, policy)
        return checkpoint(block, x, use_reentrant=False, context_fn=context)

    return wrapper


# Loggers whose WARNING lines torch writes to stderr while compiling (e.g. "context_fn is passed to
# torch.utils.checkpoint under torch.compile"): caught during a compile and kept with the point.
_COMPILE_LOGGERS = ("torch._higher_order_ops", "torch._dynamo", "torch._functorch", "torch._inductor")


class _Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"log {record.name}: {' '.join(record.getMessage().split())}")


@contextlib.contextmanager
def _caught(lines: list[str]) -> Iterator[None]:
    """Record warnings and torch's compile-time log warnings into `lines` instead of stderr."""
    recorder = _Recorder()
    loggers = [logging.getLogger(n) for n in _COMPILE_LOGGERS]
    saved = [(lg.handlers[:], lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.handlers, lg.propagate = [recorder], False
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # torch's own deprecation notices while it compiles
            yield
    finally:
        for lg, (handlers, propagate) in zip(loggers, saved, strict=True):
            lg.handlers, lg.propagate = handlers, propagate
        lines.extend(f"{w.category.__name__}: {w.message}" for w in caught)
        lines.extend(recorder.lines)


def _plain(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return block(x)


def _storage(t: torch.Tensor) -> tuple[int, int]:
    st = t.untyped_storage()
    return st.data_ptr(), st.nbytes()


def saved_by_compiled(out: torch.Tensor, keep: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of the distinct storages that the compiled backward nodes of `out` hold.

    Walks `out`'s autograd graph and reads `saved_tensors` of every compiled node
    (`CompiledFunctionBackward`). Storages shared with `keep` (parameters, buffers and
    the input, which exist anyway) are not counted.
    """
    tensor_arg("out", out)
    kept = {_storage(t)[0] for t in keep}
    seen, stack, storages, compiled = set(), [out.grad_fn], {}, 0
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if "CompiledFunction" in type(node).__name__:
            compiled += 1
            for t in node.saved_tensors:
                ptr, nbytes = _storage(t)
                if ptr not in kept:
                    storages[ptr] = nbytes
        stack.extend(f for f, _ in node.next_functions)
    if compiled == 0:
        raise ValueError("out has no compiled node in its graph: was the forward compiled (and not "
                         "run under a TorchDispatchMode)?")
    return sum(storages.values())


def backward_flops(out: torch.Tensor) -> int:
    """FLOPs that `FlopCounterMode` counts in the backward of `out.sum()` (the forward is not counted)."""
    tensor_arg("out", out)
    return _count(lambda: out.sum().backward())


def _state(model: nn.Module, h: torch.Tensor) -> list[torch.Tensor]:
    return [*model.parameters(), *model.buffers(), h]


def _run_blocks(model: nn.Module, h: torch.Tensor) -> torch.Tensor:
    return model.run_blocks(h)  # type: ignore[operator]


def _clean(model: nn.Module, h: torch.Tensor) -> None:
    model.zero_grad(set_to_none=True)
    h.grad = None


def _count(fn: Callable[[], object]) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def _eager_backward_flops(model: nn.Module, h: torch.Tensor) -> int:
    # A selective checkpoint's recompute must see the same dispatch modes as its forward
    # did, so eager FLOPs are counted over forward + backward, minus the forward alone.
    forward = _count(lambda: _run_blocks(model, h))
    step = _count(lambda: _run_blocks(model, h).sum().backward())
    return step - forward


def _baseline(model: nn.Module, h: torch.Tensor) -> int:
    with apply_ac(model, "none"):
        try:
            return _eager_backward_flops(model, h)
        finally:
            _clean(model, h)


def eager_point(model: nn.Module, h: torch.Tensor, wrapper: BlockWrapper | None,
                label: str) -> RecomputePoint:
    """The eager blocks of `model` under `wrapper` (None: plain), run on hidden states `h`.

    Saved bytes come from the lessons' live-storage tracker (`saved_activation_bytes`).

    Args:
        model: a `helpers.models.gpt` model with `run_blocks` and `block_wrapper` (e.g. `GPT`).
        h: hidden states (batch, seq, d_model) that require grad.
        wrapper: a block wrapper (`full_checkpoint`, `selective(policy)`) or None.
        label: the point's name in a figure.

    Returns:
        The point; `model.block_wrapper` is restored and gradients cleared.
    """
    tensor_arg("h", h)
    baseline = _baseline(model, h)
    with apply_ac(model, wrapper):
        try:
            saved = saved_activation_bytes(lambda: _run_blocks(model, h))
            flops = _eager_backward_flops(model, h)
        finally:
            _clean(model, h)
    return RecomputePoint(label, saved, flops, baseline, compiled=False)


def compiled_point(model: nn.Module, h: torch.Tensor, budget: float = 1.0, *,
                   wrapper: BlockWrapper | None = None, label: str | None = None) -> RecomputePoint:
    """The blocks compiled with `torch.compile(backend=BACKEND)` at `activation_memory_budget=budget`.

    Args:
        model: a `helpers.models.gpt` model with `run_blocks` and `block_wrapper`.
        h: hidden states (batch, seq, d_model) that require grad.
        budget: `torch._functorch.config.activation_memory_budget`, 0.0 to 1.0.
        wrapper: what each compiled block call runs (None: the block itself; or a
            checkpointing wrapper, to see how the compiler reads its policy).
        label: the point's name (default "compiled, budget 0.50" for budget 0.5).

    Returns:
        The point. `torch.compiler.reset()` runs first (the budget is read when a graph
        is compiled, so each budget compiles afresh); `model.block_wrapper` is restored.
    """
    tensor_arg("h", h)
    number_in_range("budget", budget, 0.0, 1.0)
    baseline = _baseline(model, h)
    notes: list[str] = []
    with _caught(notes):  # on CUDA, reset() is what first imports the compiler (torch 2.11 warns there)
        torch.compiler.reset()
    compiled = torch.compile(wrapper or _plain, backend=BACKEND)
    with apply_ac(model, compiled):
        try:
            with _caught(notes):  # the whole measurement: on CUDA, torch warns lazily at the first runs too
                with torch._functorch.config.patch(activation_memory_budget=float(budget)):
                    _run_blocks(model, h).sum().backward()  # compiles forward and backward at this budget
                model.zero_grad(set_to_none=True)
                out = _run_blocks(model, h)
                saved = saved_by_compiled(out, keep=_state(model, h))
                flops = backward_flops(out)
        finally:
            _clean(model, h)
    return RecomputePoint(label or f"compiled, budget {budget:.2f}", saved, flops, baseline, compiled=True,
                          budget=float(budget), warnings=tuple(dict.fromkeys(notes)))
