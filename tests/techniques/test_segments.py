"""helpers.techniques.segments: the sqrt(n) experiment (lesson 02 section 4), chains cut into k segments."""

from __future__ import annotations

import pytest
import torch

from helpers.core.device import seed_everything
from helpers.techniques import segments as seg


def test_chain_arguments() -> None:
    with pytest.raises(ValueError, match="kind"):
        seg.make_chain(4, 8, "conv")
    with pytest.raises(ValueError, match="positive"):
        seg.make_chain(0, 8)
    chain = seg.make_chain(4, 8)
    with pytest.raises(ValueError, match="segments"):
        seg.segment_sweep(chain, torch.randn(2, 8), [0])
    with pytest.raises(ValueError, match="segments"):
        seg.segment_sweep(chain, torch.randn(2, 8), [5])
    with pytest.raises(ValueError, match="segments"):
        seg.segment_cost(1, 1, 4, 5)
    with pytest.raises(ValueError):
        seg.divisors(0)


def test_sqrt_n_optimum_for_equal_layers() -> None:
    n = 16
    chain = seg.make_chain(n, 16, "linear")
    x = torch.randn(8, 16)
    a, b = seg.chain_layer_costs(chain, x)
    assert a == b
    ks = seg.divisors(n)
    assert ks == [1, 2, 4, 8, 16]
    points = seg.segment_sweep(chain, x, ks)
    best = min(points, key=lambda p: p.saved_bytes)
    assert best.segments == 4
    # checkpoint_sequential with k equal segments keeps k - 1 boundaries + the last segment
    for p in points:
        assert p.saved_bytes == (p.segments - 1) * b + a * n // p.segments
        assert p.peak_bytes >= p.saved_bytes


def test_mlp_chain_prefers_more_segments() -> None:
    chain = seg.make_chain(16, 16, "mlp")
    x = torch.randn(8, 16)
    a, b = seg.chain_layer_costs(chain, x)
    assert 5 < a / b < 7
    points = seg.segment_sweep(chain, x, seg.divisors(16))
    assert min(points, key=lambda p: p.saved_bytes).segments == 8


def test_segment_sizes_uneven_last_segment() -> None:
    assert seg.segment_sizes(9, 5) == [1, 1, 1, 1, 5]
    assert seg.segment_sizes(16, 4) == [4, 4, 4, 4]
    chain = seg.make_chain(9, 16)
    x = torch.randn(4, 16)
    a, b = seg.chain_layer_costs(chain, x)
    for k in (3, 5):
        (point,) = seg.segment_sweep(chain, x, [k])
        assert point.saved_bytes == (k - 1) * b + seg.segment_sizes(9, k)[-1] * a
    with pytest.raises(ValueError, match="segments"):
        seg.segment_sizes(9, 10)


def test_bools_are_not_ints() -> None:
    with pytest.raises(TypeError, match="n must be a positive int, got bool True"):
        seg.divisors(True)  # type: ignore[arg-type]
    assert seg.divisors(12) == [1, 2, 3, 4, 6, 12]
    with pytest.raises(TypeError, match="n must be a positive int"):
        seg.make_chain(True, 8)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="segments"):
        seg.segment_sizes(4, True)  # type: ignore[arg-type]


# Issue 16: written against the surviving mutants of this code, then in helpers/techniques/checkpointing.py


def test_chain_layer_costs_single_and_parameter_free_layers() -> None:
    """A one-layer chain works (the first layer is measured), and a layer without parameters
    (Tanh keeps its output) still counts: a = b, one boundary-sized tensor."""
    x = torch.randn(4, 8)
    b = 4 * 8 * 4
    assert seg.chain_layer_costs(seg.make_chain(1, 8), x) == (b, b)
    assert seg.chain_layer_costs(torch.nn.Sequential(torch.nn.Tanh(), torch.nn.Tanh()), x) == (b, b)


def test_segment_cost_hand_computed() -> None:
    # a = 3, b = 2, n = 8 layers, k = 4 segments: 3 * 8 / 4 + 2 * 4 = 6 + 8 = 14
    assert seg.segment_cost(3, 2, 8, 4) == 14
    assert seg.segment_cost(3, 2, 8, 1) == 3 * 8 + 2


@pytest.mark.parametrize("n, k", [(1, 1), (4, 1), (4, 4)])
def test_segment_sweep_peak_hand_counted(n: int, k: int) -> None:
    """Linear chain, b = 128 bytes (4 x 8 fp32), k = 1 or k = n: peak = (n + 2) b + 8.

    Alive at the peak: the n + 1 boundary tensors of forward (the input, which requires grad,
    and every layer's output; non-reentrant checkpoint stops recomputing once it has a
    Linear's input back, so the recompute adds none), one gradient of a boundary, and two
    4-byte scalars (y.sum() and its gradient seed). Saved after forward: n boundaries.
    """
    seed_everything(0)
    chain = seg.make_chain(n, 8, "linear")
    b = 4 * 8 * 4
    (point,) = seg.segment_sweep(chain, torch.randn(4, 8), [k])
    assert (point.saved_bytes, point.peak_bytes) == (n * b, (n + 2) * b + 8)
    assert all(p.grad is None for p in chain.parameters())  # the sweep leaves no gradients behind
