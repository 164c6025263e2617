"""Three more memory trade-offs, measured: optimizer in backward, chunked loss, offloading (instrument).

- Optimizer in backward: `optimizer_in_backward(model, make_optimizer)` registers a
  `register_post_accumulate_grad_hook` on every parameter that steps that parameter's
  own optimizer and frees its gradient as soon as the gradient is complete.
  `gradient_peak(model, step)` measures a step with the lessons' tracker, the hooks
  attached inside it.
- Chunked cross-entropy: `chunked_cross_entropy(hidden, weight, targets, chunk)` computes
  the LM head and the loss a chunk of tokens at a time, each chunk under a non-reentrant
  `checkpoint`, so the full (tokens x vocabulary) logits never exist at once.
- Activation offloading: `offload_traffic(forward)` runs `forward` under
  `torch.autograd.graph.save_on_cpu` and reports what its pack hook received and what
  it copied; `cuda_offload_step(...)` measures device memory and step time on a GPU.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from helpers.core.training import IGNORE_INDEX
from helpers.core.validate import bool_arg, callable_arg, instance_arg, positive_int, tensor_arg
from helpers.measure.memory import measurable_model
from helpers.measure.timeline import Timeline
from helpers.measure.tracker import MemoryTracker

__all__ = [
    "CudaOffload",
    "Traffic",
    "chunked_cross_entropy",
    "cuda_offload_step",
    "full_cross_entropy",
    "gradient_peak",
    "offload_traffic",
    "optimizer_in_backward",
]


# -- optimizer in backward -------------------------------------------------------------------
@contextlib.contextmanager
def optimizer_in_backward(
    model: nn.Module, make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
) -> Iterator[dict[nn.Parameter, torch.optim.Optimizer]]:
    """Inside the block, each parameter is updated the moment its gradient is complete.

    Args:
        model: the model whose trainable parameters get a hook each.
        make_optimizer: builds one optimizer over a one-parameter list (e.g.
            `lambda ps: torch.optim.SGD(ps, lr=0.1)`).

    Yields:
        The optimizer of each parameter. The hook calls `step()` then
        `zero_grad(set_to_none=True)`, so no gradient outlives its own update, and so
        nothing can be accumulated across micro-batches. The hooks go on exit.
    """
    instance_arg("model", model, nn.Module, "torch.nn.Module")
    callable_arg("make_optimizer", make_optimizer, "a function of a list of parameters")
    optimizers = {p: make_optimizer([p]) for p in model.parameters() if p.requires_grad}

    def step(p: torch.Tensor) -> None:
        optimizers[p].step()
        optimizers[p].zero_grad(set_to_none=True)

    handles = [p.register_post_accumulate_grad_hook(step) for p in optimizers]
    try:
        yield optimizers
    finally:
        for h in handles:
            h.remove()


def gradient_peak(model: nn.Module, step: Callable[[], object], *,
                  make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer] | None = None,
                  ) -> Timeline:
    """The tracker's timeline of `step()`, optionally with the optimizer moved into backward.

    Args:
        model: the model the step trains.
        step: a zero-argument callable.
        make_optimizer: params -> optimizer; with it, the per-parameter hooks are attached
            *inside* the tracker, after its own gradient hooks, so it still sees every
            gradient before the update frees it.

    Returns:
        The `Timeline`.
    """
    callable_arg("step", step, "a zero-argument callable")
    measurable_model(model, "gradient_peak")
    with MemoryTracker(model=model) as tracker:
        if make_optimizer is None:
            step()
        else:
            with optimizer_in_backward(model, make_optimizer):
                step()
    return tracker.timeline()


# -- chunked cross-entropy --------------------------------------------------------------------
def full_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Token-mean cross-entropy of the LM head `hidden @ weight.T`: all logits at once.

    Args:
        hidden: (tokens, d_model) final hidden states.
        weight: (vocab, d_model) the LM head's weight.
        targets: (tokens,) labels, `IGNORE_INDEX` at padding.

    Returns:
        The loss, a scalar tensor.
    """
    return F.cross_entropy(F.linear(hidden, weight), targets, ignore_index=IGNORE_INDEX)


def _chunk_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(F.linear(hidden, weight), targets, ignore_index=IGNORE_INDEX, reduction="sum")


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          chunk: int) -> torch.Tensor:
    """The same loss as `full_cross_entropy`, `chunk` tokens of logits at a time.

    Args:
        hidden: (tokens, d_model) final hidden states.
        weight: (vocab, d_model) the LM head's weight.
        targets: (tokens,) int64 labels, `IGNORE_INDEX` at padding.
        chunk: tokens per chunk.

    Returns:
        The token-mean loss. Each chunk's head and loss run under a non-reentrant
        `checkpoint`, which keeps only the chunk's inputs: backward rebuilds one chunk's
        logits at a time. Forward and backward each hold one chunk of logits (plus their
        softmax) instead of all of them; the head's matmul runs twice.

    Raises:
        ValueError: for shapes other than (tokens, d_model) and (tokens,), or no valid token.
    """
    for name, t in (("hidden", hidden), ("weight", weight), ("targets", targets)):
        tensor_arg(name, t)
    positive_int("chunk", chunk)
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"hidden must be (tokens, d_model) and targets (tokens,), got "
                         f"{tuple(hidden.shape)} and {tuple(targets.shape)}")
    n_valid = int((targets != IGNORE_INDEX).sum())
    if n_valid == 0:
        raise ValueError("targets has no valid token (all IGNORE_INDEX): the mean loss is undefined")
    total = hidden.new_zeros(())
    for start in range(0, hidden.shape[0], chunk):
        h, y = hidden[start:start + chunk], targets[start:start + chunk]
        total = total + checkpoint(_chunk_loss, h, weight, y, use_reentrant=False)
    return total / n_valid


# -- activation offloading --------------------------------------------------------------------
@dataclass(frozen=True)
class Traffic:
    """What `save_on_cpu` did during one forward: tensors packed, bytes, what was copied."""

    tensors: int           # saved tensors that went through the pack hook
    packed_bytes: int      # distinct storages among them
    parameter_bytes: int   # ... of which storages of parameters (they travel too)
    copied_bytes: int      # bytes the hook actually copied to a new storage
    unpacked: int          # saved tensors backward asked for again


def offload_traffic(forward: Callable[[], torch.Tensor], *, parameters: tuple[torch.Tensor, ...] = (),
                    pin_memory: bool = False) -> Traffic:
    """Run `forward()` and its backward under `save_on_cpu(pin_memory)`; report the traffic.

    On a CPU the pack hook's `tensor.cpu()` returns the tensor itself: nothing moves, and
    `copied_bytes` is 0. `pin_memory=True` without CUDA makes a plain host copy of every
    saved tensor instead. On a GPU every packed byte crosses to the host and back.

    Args:
        forward: a zero-argument callable returning a tensor (its sum is back-propagated).
        parameters: storages to report separately (ops save their weights too).
        pin_memory: passed to `save_on_cpu`.

    Returns:
        The `Traffic`: tensors packed, their bytes, the parameters' part, bytes copied, unpacks.
    """
    callable_arg("forward", forward, "a zero-argument callable returning a tensor")
    bool_arg("pin_memory", pin_memory)
    hooks = torch.autograd.graph.save_on_cpu(pin_memory=pin_memory)
    pack, unpack = hooks.pack_hook, hooks.unpack_hook
    params = {p.untyped_storage().data_ptr() for p in parameters}
    seen: dict[int, int] = {}
    alive: list[torch.Tensor] = []  # holding every original keeps its address unique while counting
    counts = {"tensors": 0, "copied": 0, "unpacked": 0}

    def counting_pack(t: torch.Tensor) -> object:
        device, packed = pack(t)
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
        alive.append(t)
        counts["tensors"] += 1
        if packed.untyped_storage().data_ptr() != st.data_ptr():
            counts["copied"] += packed.untyped_storage().nbytes()
        return device, packed

    def counting_unpack(packed: object) -> torch.Tensor:
        counts["unpacked"] += 1
        return unpack(packed)

    hooks.pack_hook, hooks.unpack_hook = counting_pack, counting_unpack
    with hooks:
        out = forward()
    out.sum().backward()
    alive.clear()
    return Traffic(counts["tensors"], sum(seen.values()), sum(v for k, v in seen.items() if k in params),
                   counts["copied"], counts["unpacked"])


@dataclass(frozen=True)
class CudaOffload:
    """One training step on a GPU with and without `save_on_cpu(pin_memory=True)`."""

    peak_plain: int
    peak_offloaded: int
    seconds_plain: float
    seconds_offloaded: float


def cuda_offload_step(step: Callable[[], object], *, repeats: int = 3) -> CudaOffload:
    """Peak device memory (`max_memory_allocated`) and median step time, plain vs offloaded.

    Runs each variant once to warm up, then `repeats` times, interleaved.

    Args:
        step: one forward and backward on a CUDA device, a zero-argument callable.
        repeats: timed runs of each variant.

    Returns:
        The `CudaOffload`: both peaks and both median times.

    Raises:
        RuntimeError: without CUDA.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("cuda_offload_step needs a CUDA GPU; this machine has none")
    callable_arg("step", step, "a zero-argument callable")
    positive_int("repeats", repeats)

    def run(offload: bool) -> tuple[int, float]:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        start = time.perf_counter()
        with torch.autograd.graph.save_on_cpu(pin_memory=True) if offload else contextlib.nullcontext():
            step()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base, time.perf_counter() - start

    run(False), run(True)
    plain, offloaded = [], []
    for _ in range(repeats):
        plain.append(run(False))
        offloaded.append(run(True))
    mid = repeats // 2
    return CudaOffload(max(p for p, _ in plain), max(p for p, _ in offloaded),
                       sorted(s for _, s in plain)[mid], sorted(s for _, s in offloaded)[mid])
