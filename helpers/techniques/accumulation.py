"""Gradients as flat vectors, and how two of them compare (core; lessons 03, 04, 05 and 07).

The public API (other lessons rely on these names):

- `flat_grad(model)`: every parameter's `.grad`, concatenated into one vector.
- `full_batch_grad(model, loss_fn, inputs, targets)`: the gradient of the mean
  loss over the whole batch, from one forward and one backward.
- `accumulated_grad(model, loss_fn, inputs, targets, micro_batch, *, scale=True)`:
  the same batch cut into micro-batches, one backward per micro-batch, the
  gradients summed in `.grad`.
- `compare_grads(reference, candidate)`: how far apart two gradients are, as a
  `GradDiff`. Two relative errors, which differ: `max_rel` (max relative: the
  largest elementwise difference over the largest reference entry) and
  `l2_rel` (L2 relative: ||candidate - reference|| / ||reference||).
- `weight_distance(model, reference)`: how far two runs' weights have drifted apart,
  ||w - w_ref|| / ||w_ref||.
- `check_batch`, `check_micro_batch`: the argument checks the
  gradient functions share, public for the lessons' instruments. Each gradient function
  clears `.grad` before and after (`helpers.core.training.cleared_grads`).

Lesson 03's widgets and plots live in `helpers.lessons.lesson03`, its throughput sweep in
`helpers.techniques.costs`, the memory per micro-step in `helpers.memory`; lesson 04's pitfalls in
`helpers.techniques.pitfalls`.

Rules shared by the gradient functions:

- `loss_fn(outputs, targets)` returns the *mean* loss of the examples it is
  given, as a scalar tensor (e.g. `torch.nn.functional.mse_loss`).
- Gradients are cleared (`.grad = None`) before they start and again before
  they return, so a call never sees stale gradients and never leaves any
  behind. The gradient is returned as a detached float tensor of the
  parameters' dtype; parameters that get no gradient contribute zeros.
- They neither reseed nor change `model.train()` / `model.eval()`. With dropout
  in training mode, two calls draw different masks, so compare them in eval
  mode (or with dropout=0), or seed right before each call. Forwards in
  training mode update BatchNorm running statistics; they are not restored.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from helpers.core.training import cleared_grads, trainable_params
from helpers.core.validate import positive_int, tensor_arg

__all__ = [
    "GradDiff", "LossFn", "accumulated_grad", "angle_degrees", "check_batch", "check_micro_batch",
    "compare_grads", "flat_grad", "full_batch_grad", "group_gradient",
    "weight_distance",
]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def check_batch(inputs: torch.Tensor, targets: torch.Tensor) -> int:
    """Check that `inputs` and `targets` are a non-empty batch of equal length; return its length."""
    for name, t in (("inputs", inputs), ("targets", targets)):
        tensor_arg(name, t)
        if t.dim() == 0:
            raise ValueError(f"{name} must have a batch dimension, got a 0-d tensor")
    n = inputs.shape[0]
    if n == 0:
        raise ValueError("inputs is empty (0 examples); give at least one example")
    if targets.shape[0] != n:
        raise ValueError(
            f"inputs and targets must have the same length, got {n} inputs "
            f"and {targets.shape[0]} targets"
        )
    return n


def check_micro_batch(micro_batch: int, n: int) -> int:
    """Check 1 <= `micro_batch` <= `n` (an int, not a bool); return it."""
    positive_int("micro_batch", micro_batch)
    if micro_batch > n:
        raise ValueError(
            f"micro_batch={micro_batch} is larger than the batch ({n} examples); "
            f"choose 1 <= micro_batch <= {n}"
        )
    return micro_batch


def flat_grad(model: nn.Module) -> torch.Tensor:
    """All parameters' gradients as one detached 1-D tensor (a copy).

    Reads `.grad` only; it does not change it.

    Args:
        model: the model whose trainable parameters' gradients it reads.

    Returns:
        The flat gradient; a parameter whose `.grad` is None contributes zeros, so the
        vector always has the same length for the same model.
    """
    params = trainable_params(model)
    parts = [
        (p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1)
        for p in params
    ]
    return torch.cat(parts).clone()


# -- the two ways to compute a batch's gradient ----------------------------------------
def full_batch_grad(
    model: nn.Module, loss_fn: LossFn, inputs: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Gradient of `loss_fn(model(inputs), targets)` from one forward and one backward.

    This is the reference that accumulation must reproduce. Grads are cleared
    before and after (see the module docstring); the model's mode and the RNG
    are left alone.

    Args:
        model: the model (its trainable parameters).
        loss_fn: `loss_fn(model(x), y)` -> a mean loss.
        inputs, targets: the whole batch.

    Returns:
        The gradient as one flat 1-D tensor (see `flat_grad`).
    """
    trainable_params(model)
    check_batch(inputs, targets)
    with cleared_grads(model):
        loss_fn(model(inputs), targets).backward()
        return flat_grad(model)


def accumulated_grad(
    model: nn.Module,
    loss_fn: LossFn,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    micro_batch: int,
    *,
    scale: bool = True,
) -> torch.Tensor:
    """Gradient summed over micro-batches of `micro_batch` examples, one backward each.

    Grads are cleared before and after; the model's mode and the RNG are left alone.

    Args:
        model: the model (its trainable parameters).
        loss_fn: `loss_fn(model(x), y)` -> a mean loss.
        inputs, targets: the whole batch of N examples.
        micro_batch: examples per micro-batch (1 to N); the last may be smaller.
        scale: multiply each micro-batch's mean loss by its share of the examples,
            n_i / N, before backward (`loss / K` for equal micro-batches), so that the
            result equals `full_batch_grad` up to rounding. False back-propagates the raw
            mean losses: about K times the full-batch gradient.

    Returns:
        The accumulated gradient as one flat 1-D tensor (see `flat_grad`).

    Raises:
        ValueError: for `micro_batch < 1` or `> N`, empty inputs, or inputs and targets of
            different lengths (a `TypeError`, which is also a `ValueError`, for a wrong type).
    """
    trainable_params(model)
    n = check_batch(inputs, targets)
    check_micro_batch(micro_batch, n)
    with cleared_grads(model):
        for x, y in zip(inputs.split(micro_batch), targets.split(micro_batch), strict=True):
            loss = loss_fn(model(x), y)
            weight = x.shape[0] / n if scale else 1.0
            (loss * weight).backward()
        return flat_grad(model)


# -- comparing two gradients -------------------------------------------------------------
@dataclass(frozen=True)
class GradDiff:
    """How a candidate gradient differs from a reference gradient (all computed in float64).

    - `max_abs`: largest absolute elementwise difference.
    - `max_rel` (max relative error): `max_abs` divided by the largest reference
      magnitude (does not blow up on near-zero entries).
    - `norm_ratio`: ||candidate|| / ||reference|| (K for unscaled accumulation).
    - `cosine`: cosine of the angle between the two (1.0 = same direction).
    - `l2_rel` (L2 relative error): ||candidate - reference|| / ||reference||
      (0.0 = identical); the whole vector's error, where `max_rel` is the worst entry's.
    """

    max_abs: float
    max_rel: float
    norm_ratio: float
    cosine: float
    l2_rel: float


def compare_grads(reference: torch.Tensor, candidate: torch.Tensor) -> GradDiff:
    """Compare two flat gradients, in float64.

    Args:
        reference: the gradient taken as true (finite, non-zero).
        candidate: the gradient compared with it, of the same shape.

    Returns:
        A `GradDiff` (max_abs, max_rel, norm_ratio, cosine, l2_rel).

    Raises:
        ValueError: if the shapes differ or `reference` is zero or not finite.
    """
    tensor_arg("reference", reference)
    tensor_arg("candidate", candidate)
    if reference.shape != candidate.shape:
        raise ValueError(
            f"reference and candidate must have the same shape, got {tuple(reference.shape)} "
            f"and {tuple(candidate.shape)}"
        )
    ref = reference.detach().double().reshape(-1).cpu()
    cand = candidate.detach().double().reshape(-1).cpu()
    ref_norm = ref.norm().item()
    if ref_norm == 0.0 or not math.isfinite(ref_norm):
        raise ValueError(f"reference gradient must be finite and non-zero, its norm is {ref_norm}")
    diff = cand - ref
    max_abs = diff.abs().max().item()
    cand_norm = cand.norm().item()
    cosine = (ref @ cand).item() / (ref_norm * cand_norm) if cand_norm > 0 else 0.0
    return GradDiff(
        max_abs=max_abs,
        max_rel=max_abs / ref.abs().max().item(),
        norm_ratio=cand_norm / ref_norm,
        cosine=cosine,
        l2_rel=diff.norm().item() / ref_norm,
    )


def group_gradient(
    model: nn.Module, loss_fn: LossFn, batches: Sequence[tuple[torch.Tensor, torch.Tensor]]
) -> torch.Tensor:
    """The true gradient of a group of micro-batches at the current weights, as one flat vector.

    It is the gradient of the group's mean loss (each micro-batch weighted by
    its share of the examples), computed with `torch.autograd.grad`, so `.grad`
    is neither read nor changed: a loop can call it between its backward and
    its optimizer step.

    Args:
        model: the model (its trainable parameters).
        loss_fn: `loss_fn(model(x), y)` -> a mean loss.
        batches: the group's (inputs, targets) micro-batches.

    Returns:
        The flat gradient; parameters without a gradient contribute zeros.

    Raises:
        ValueError: if `batches` is empty.
    """
    params = trainable_params(model)
    if not batches:
        raise ValueError("batches is empty; give at least one (inputs, targets) pair")
    n = sum(check_batch(x, y) for x, y in batches)
    total = [torch.zeros_like(p) for p in params]
    for x, y in batches:
        loss = loss_fn(model(x), y) * (x.shape[0] / n)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        for acc, g in zip(total, grads, strict=True):
            if g is not None:
                acc.add_(g)
    return torch.cat([t.detach().reshape(-1) for t in total])


def angle_degrees(reference: torch.Tensor, candidate: torch.Tensor) -> float:
    """Angle between two flat gradients in degrees (0 = same direction, 90 = unrelated).

    Args:
        reference, candidate: flat gradients of the same shape.

    Returns:
        The angle in degrees, from 0 to 180.
    """
    cosine = compare_grads(reference, candidate).cosine
    return math.degrees(math.acos(max(-1.0, min(1.0, cosine))))


def weight_distance(model: nn.Module, reference: nn.Module) -> float:
    """How far two runs have drifted: ||w - w_ref|| / ||w_ref|| over all parameters (`GradDiff.l2_rel`).

    Args:
        model: one run's model.
        reference: the reference run's model, of the same size.

    Returns:
        The relative distance.

    Raises:
        ValueError: if the models differ in size.
    """
    w = torch.cat([p.detach().flatten() for p in model.parameters()])
    ref = torch.cat([p.detach().flatten() for p in reference.parameters()])
    if w.shape != ref.shape:
        raise ValueError(f"the models differ in size: {w.numel()} and {ref.numel()} parameters")
    return compare_grads(ref, w).l2_rel
