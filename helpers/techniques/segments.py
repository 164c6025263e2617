"""The sqrt(n) experiment (lesson 02 section 4): chains of equal layers cut into k segments.

- `make_chain(n, width, kind)`: `n` equal layers (`CHAIN_KINDS`, and exercise 3's `EXERCISE_CHAIN`).
- `chain_layer_costs(chain, x)` -> (m, c): what one layer keeps and what one boundary is, measured.
- `segment_cost(m, c, n, k)`: Chen et al.'s model m*n/k + c*k.
- `segment_sweep(chain, x, ks)` -> `SegmentPoint`s: `checkpoint_sequential` with k segments,
  measured with the live tracker.
- `segment_sizes(n, k)`: layers per segment, with the uneven last one; `divisors(n)`: the k that
  cut `n` layers evenly.

"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential

from helpers.core.validate import choice, int_in_range, positive_int
from helpers.measure.memory import measurable_model, saved_activation_bytes
from helpers.measure.tracker import MemoryTracker
from helpers.models.nets import MLPBlock

__all__ = [
    "CHAIN_KINDS", "EXERCISE_CHAIN", "SegmentPoint", "chain_layer_costs", "divisors", "make_chain",
    "segment_cost", "segment_sizes", "segment_sweep",
]

CHAIN_KINDS = ("linear", "mlp")  # the two chains section 4 sweeps
EXERCISE_CHAIN = "linear-relu"  # exercise 3's chain: a ReLU after each Linear


def make_chain(n: int, width: int, kind: str = "linear") -> nn.Sequential:
    """A chain of `n` equal layers of `width` features.

    Args:
        n: the number of layers.
        width: features per layer.
        kind: "linear": `nn.Linear` layers, each keeping one boundary-sized tensor (its
            input), so a ~= b. "mlp": `MLPBlock(width, expansion=2)`, each keeping about
            six boundary-sized tensors (LayerNorm input and output, fc1 output, GELU output).
            "linear-relu" (exercise 3): `nn.Sequential(nn.Linear, nn.ReLU)` layers; the
            ReLU's output is the next Linear's input, one storage kept once, so a ~= b too.

    Returns:
        The chain, an `nn.Sequential`.
    """
    choice("kind", kind, (*CHAIN_KINDS, EXERCISE_CHAIN))
    positive_int("n", n)
    positive_int("width", width)
    if kind == "linear":
        return nn.Sequential(*(nn.Linear(width, width) for _ in range(n)))
    if kind == EXERCISE_CHAIN:
        return nn.Sequential(*(nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(n)))
    return nn.Sequential(*(MLPBlock(width, expansion=2) for _ in range(n)))


def chain_layer_costs(chain: nn.Sequential, x: torch.Tensor) -> tuple[int, int]:
    """What one layer of a chain keeps (m), and what one boundary between layers is (c).

    Measured on the first layer with the live tracker. Lesson 02 §4 calls them m and c (its a
    and b are heads and micro-batch).

    Args:
        chain: the layer chain (e.g. from `make_chain`).
        x: an input batch of the chain.

    Returns:
        (m, c): bytes one layer keeps for backward (its input included), and the bytes of `x`.
    """
    m = saved_activation_bytes(lambda: chain[0](x.detach().clone().requires_grad_(True)))
    return m, x.numel() * x.element_size()


def segment_cost(m: float, c: float, n: int, k: int) -> float:
    """Chen et al.'s cost model of activation memory with k segments: m*n/k + c*k.

    Args:
        m: bytes one layer keeps.
        c: bytes of one boundary (a segment's checkpointed input).
        n: layers.
        k: segments (1 to n).

    Returns:
        The modelled bytes.
    """
    _check_segments(n, k)
    return m * n / k + c * k


def _check_segments(n: int, k: int) -> None:
    int_in_range("segments", k, 1, n)  # 1 to n: the number of layers


@dataclass(frozen=True)
class SegmentPoint:
    """Measured activation memory of `checkpoint_sequential` with `segments` segments."""

    segments: int
    saved_bytes: int  # alive after forward, kept for backward
    peak_bytes: int  # largest activation + temporary memory through backward


def segment_sweep(chain: nn.Sequential, x: torch.Tensor, ks: Sequence[int]) -> list[SegmentPoint]:
    """Run forward + backward through `chain` cut into k segments, for each k in `ks`.

    Each run calls `checkpoint_sequential(chain, k, x, use_reentrant=False)`.

    Args:
        chain: the layer chain.
        x: its input batch.
        ks: the segment counts (each 1 to len(chain)).

    Returns:
        One `SegmentPoint` per k, measured with the live tracker: `saved_bytes` after
        forward (the output excluded), `peak_bytes` the most activation and temporary bytes
        (not parameters or gradients) alive at any point of forward and backward.
    """
    for k in ks:
        _check_segments(len(chain), k)
    measurable_model(chain, "segment_sweep")
    return [_segment_point(chain, x, k) for k in ks]


def _segment_point(chain: nn.Sequential, x: torch.Tensor, k: int) -> SegmentPoint:
    with MemoryTracker(model=chain) as tracker:
        y = checkpoint_sequential(chain, k, x.detach().clone().requires_grad_(True),
                                  use_reentrant=False)
        saved = tracker.new_live_bytes(exclude=[y])
        y.sum().backward()
        del y
    tl = tracker.timeline()
    peak = max(a + o for a, o in zip(tl.series["activations"], tl.series["other"], strict=True))
    chain.zero_grad(set_to_none=True)
    return SegmentPoint(k, saved, peak)


def segment_sizes(n: int, k: int) -> list[int]:
    """Layers per segment when `checkpoint_sequential` cuts `n` layers into `k` segments.

    Every segment but the last has `n // k` layers; the last takes the rest
    (pytorch/pytorch #68423), and the last segment is not checkpointed.

    Args:
        n: layers.
        k: segments (1 to n).

    Returns:
        The sizes, e.g. [1, 1, 1, 1, 5] for 9 layers in 5 segments.
    """
    positive_int("n", n)
    _check_segments(n, k)
    size = n // k
    return [size] * (k - 1) + [n - size * (k - 1)]


def divisors(n: int) -> list[int]:
    """The segment counts for which every segment of `n` layers is equal.

    Args:
        n: the number of layers (>= 1).

    Returns:
        The k in 1..n that divide n, ascending.
    """
    positive_int("n", n)
    return [k for k in range(1, n + 1) if n % k == 0]
