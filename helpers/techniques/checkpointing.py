"""Activation checkpointing as the lessons apply it (lesson 02, and every measurement that checkpoints).

- `apply_ac(model, mode, every)`: THE way to checkpoint a model's blocks, a context manager
  (torchtitan's `apply_ac` style: one entry point, the policy as configuration), restored on exit;
  `make_block_wrapper`: the `model.block_wrapper` it sets for a mode in `POLICIES`;
  `blocks_of`: a model's repeated blocks (for models without `block_wrapper`).
- `checkpoint_with`, `params_without_grad`: the reentrant trap (frozen inputs).
- `freeze_batchnorm_stats`: the fix for BatchNorm's double update.
- Re-exported from `helpers.techniques.segments`: the sqrt(n) experiment with `checkpoint_sequential`
  (`make_chain`, `chain_layer_costs`, `segment_cost`, `segment_sweep`, `segment_sizes`, `divisors`).

Elsewhere: what autograd keeps per op and Korthikanti's formula in `helpers.techniques.saved_tensors`,
FLOPs and timing in `helpers.techniques.costs`, the lesson's sizes, widget and exercises in
`helpers.lessons.lesson02`. The checkpoint calls the lesson teaches are written out in the
notebook; the wrappers here exist so that sweeps and the widget can switch policy.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

from helpers.core.validate import bool_arg, callable_arg, choice, instance_arg, int_at_least
from helpers.models.nets import BlockWrapper
from helpers.techniques.saved_tensors import attention_core_policy, save_matmul_outputs

__all__ = [
    "POLICIES", "checkpoint_with", "apply_ac", "blocks_of", "freeze_batchnorm_stats", "make_block_wrapper",
    "params_without_grad",
]

POLICIES = ("none", "full", "save-matmuls", "attention-core")

# ---------------------------------------------------------------------------
# Policies as block wrappers
# ---------------------------------------------------------------------------

def make_block_wrapper(policy: str, every: int = 1) -> BlockWrapper | None:
    """A `model.block_wrapper` for `policy` in POLICIES, applied to every `every`-th block.

    "none" returns None (no checkpointing). The others call
    `checkpoint(block, x, use_reentrant=False)`: "full" keeps only the block's
    input, "save-matmuls" passes `context_fn` from
    `create_selective_checkpoint_contexts(save_matmul_outputs)`, and
    "attention-core" the same with `attention_core_policy` (Korthikanti et al.'s
    selective recomputation; the block needs `block.attn.n_heads`).
    Blocks are counted in call order within one forward; every `every`-th one
    (the first, then every `every` after it) is checkpointed.
    """
    choice("policy", policy, POLICIES)
    int_at_least("every", every, 1)
    if policy == "none":
        return None
    seen: dict[int, int] = {}

    def context_for(block: nn.Module, x: torch.Tensor) -> dict[str, object]:
        if policy == "full":
            return {}
        chosen = save_matmul_outputs if policy == "save-matmuls" else attention_core_policy(
            x.shape[0], block.attn.n_heads)
        return {"context_fn": functools.partial(create_selective_checkpoint_contexts, chosen)}

    def wrapper(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if every > 1 and seen.setdefault(id(block), len(seen)) % every:
            return block(x)
        return checkpoint(block, x, use_reentrant=False, **context_for(block, x))

    return wrapper


def blocks_of(model: nn.Module) -> nn.ModuleList:
    """The model's repeated blocks: its `nn.ModuleList` with the most parameters."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m)]
    if not lists:
        raise ValueError(
            f"{type(model).__name__} has no nn.ModuleList of blocks to checkpoint; pass "
            "checkpoint='none' or a model with a block_wrapper attribute"
        )
    return max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))


@contextlib.contextmanager
def apply_ac(
    model: nn.Module, mode: str | BlockWrapper | None = "full", every: int = 1
) -> Iterator[BlockWrapper | None]:
    """Checkpoint `model`'s blocks while inside the `with` block; put everything back on exit.

    A model with a `block_wrapper` attribute (the project's models) gets it set and restored
    (in a `finally`, so also after an exception or an OOM). Any other model has each block of
    `blocks_of(model)` called through the wrapper (extra arguments go on to the block).

    Args:
        model: the model whose blocks to checkpoint.
        mode: "full" (keep only each block's input), "save-matmuls" or "attention-core"
            (selective, see `make_block_wrapper`), "none" or None (the blocks run plain: a
            `block_wrapper` already set is lifted while inside), or a `block_wrapper(block, x)`
            callable of your own.
        every: checkpoint every `every`-th block (1: all of them); only with a named mode and
            a model with `block_wrapper`.

    Returns:
        A context manager; `with apply_ac(model) as wrapper:` gives the wrapper in use (None
        for "none").
    """
    if mode is None or isinstance(mode, str):
        wrapper = make_block_wrapper("none" if mode is None else mode, every)
    else:
        wrapper = callable_arg("mode", mode, f"one of {POLICIES} or a block_wrapper(block, x) callable")
        if every != 1:
            raise ValueError(f"every={every!r} needs a named mode (one of {POLICIES[1:]}), not a callable")
    if hasattr(model, "block_wrapper"):
        previous, model.block_wrapper = model.block_wrapper, wrapper
        try:
            yield wrapper
        finally:
            model.block_wrapper = previous
        return
    if wrapper is None:
        yield None
        return
    if every != 1:
        raise ValueError(f"every={every!r}: a model without block_wrapper has every block checkpointed "
                         "(every=1)")
    blocks = list(blocks_of(model))
    for block in blocks:
        forward = block.forward

        def wrapped(x: torch.Tensor, *args: object, _fwd: Callable = forward, **kwargs: object) -> object:
            return wrapper(lambda y: _fwd(y, *args, **kwargs), x)

        block.forward = wrapped
    try:
        yield wrapper
    finally:
        for block in blocks:
            del block.forward


def checkpoint_with(fn: Callable[..., torch.Tensor], *args: object, reentrant: bool,
                    **kwargs: object) -> torch.Tensor:
    """`checkpoint(fn, *args, use_reentrant=reentrant, **kwargs)`, for the lesson's reentrant demo.

    The lessons always pass `use_reentrant=False`; this exists only to show what
    the old reentrant implementation does when no input of the region requires grad.

    Args:
        fn: the region to checkpoint.
        *args: its inputs.
        reentrant: passed as `use_reentrant`.
        **kwargs: passed to `torch.utils.checkpoint.checkpoint`.

    Returns:
        The region's output.
    """
    bool_arg("reentrant", reentrant)
    options = {"use_reentrant": reentrant, **kwargs}
    return checkpoint(fn, *args, **options)


def params_without_grad(model: nn.Module) -> list[str]:
    """The trainable parameters that a backward left without a gradient.

    Args:
        model: the model, after a backward.

    Returns:
        Names of the parameters with `requires_grad` whose `.grad` is None.
    """
    instance_arg("model", model, nn.Module, "torch.nn.Module")
    return [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]


# ---------------------------------------------------------------------------
# Pitfalls
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def freeze_batchnorm_stats(model: nn.Module) -> Iterator[None]:
    """Inside: BatchNorm layers run exactly as usual but their statistics do not move.

    Momentum is set to 0, so `running_mean` and `running_var` are rewritten
    with their own values, and `num_batches_tracked` is put back on exit. The
    ops and saved tensors are the same as in the original forward, which
    checkpoint's recompute check requires. Use it as the recompute context:
    `context_fn=lambda: (nullcontext(), freeze_batchnorm_stats(model))`.

    Args:
        model: the module whose BatchNorm layers it freezes.

    Yields:
        Nothing; the statistics are frozen while the block runs.
    """
    instance_arg("model", model, nn.Module, "torch.nn.Module")
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    momenta = [m.momentum for m in norms]
    counts = [None if m.num_batches_tracked is None else m.num_batches_tracked.clone()
              for m in norms]
    for m in norms:
        m.momentum = 0.0
    try:
        yield
    finally:
        for m, momentum, count in zip(norms, momenta, counts, strict=True):
            m.momentum = momentum
            if count is not None:
                with torch.no_grad():
                    m.num_batches_tracked.copy_(count)
