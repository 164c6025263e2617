"""helpers.measure.held_outputs: which autograd nodes hold a model's outputs, as autograd itself says.

Each case is an op whose saved tensors are autograd's documented formulas: `pow` and `mse_loss`
save their input, `exp` saves its result, `sum` saves only a size, a custom Function saves what
`save_for_backward` was given. Backward frees them.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F

from helpers.measure.held_outputs import _storage_key, output_tensors, saving_nodes


def test_output_tensors_finds_every_tensor_in_a_models_outputs() -> None:
    a, b, c, d = (torch.full((1,), float(i)) for i in range(4))
    assert list(output_tensors(a)) == [a]
    model_output = OrderedDict(loss=a, logits=b, past=((c, None), [d, "text"]), n=3)  # a ModelOutput's shape
    assert [t.item() for t in output_tensors(model_output)] == [0.0, 1.0, 2.0, 3.0]
    assert list(output_tensors((1, None, "no tensors"))) == []


def _names(nodes: list[object]) -> list[str]:
    return [type(n).__name__ for n in nodes]


def test_the_nodes_that_saved_an_output_are_the_ones_autograd_keeps_it_for() -> None:
    w = torch.ones(8, requires_grad=True)
    y = w * 2  # the model's output (mul by a number saves no tensor)
    keys = {_storage_key(y)}
    assert _names(saving_nodes(y.pow(2).sum(), [y], keys)) == ["PowBackward0"]  # pow saves its input
    assert _names(saving_nodes(F.mse_loss(y, torch.zeros(8)), [y], keys)) == ["MseLossBackward0"]
    assert saving_nodes(y.sum(), [y], keys) == []  # sum keeps only the size
    assert saving_nodes(y.exp().sum(), [y], keys) == []  # exp keeps its result, not y


def test_only_the_losss_own_nodes_count() -> None:
    """y = w * w saves w itself, but that node made the output: a `del y` is not what it keeps alive."""
    w = torch.ones(8, requires_grad=True)
    y = w * w
    keys = {_storage_key(w)}
    assert saving_nodes(y.sum(), [y], keys) == []
    assert _names(saving_nodes((y * w).sum(), [y], keys)) == ["MulBackward0"]  # the loss's own mul saves w


def test_a_custom_functions_saved_tensors_count() -> None:
    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
            (x,) = ctx.saved_tensors
            return 2 * x * grad

    w = torch.ones(8, requires_grad=True)
    y = w * 3
    keys = {_storage_key(y)}
    assert len(saving_nodes(Square.apply(y).sum(), [y], keys)) == 1
    assert saving_nodes(Square.apply(y.exp()).sum(), [y], keys) == []  # it saved exp(y), not y
    loss = Square.apply(y).sum()
    loss.backward()  # frees the Function's saved tensors: reading them now raises inside autograd
    assert saving_nodes(loss, [y], keys) == []


def test_a_graph_that_backward_freed_holds_nothing() -> None:
    w = torch.ones(8, requires_grad=True)
    y = w * 3
    loss = y.pow(2).sum()
    keys = {_storage_key(y)}
    assert len(saving_nodes(loss, [y], keys)) == 1
    loss.backward()  # frees what the graph saved
    assert saving_nodes(loss, [y], keys) == []
    assert torch.equal(w.grad, torch.full((8,), 2 * 3.0 * 3))  # d/dw (3w)^2 at w = 1


def test_nothing_to_search_without_a_graph() -> None:
    y = torch.ones(4)  # made without grad
    w = torch.ones(4, requires_grad=True)
    assert saving_nodes((w * 2).pow(2).sum(), [y], {_storage_key(y)}) == []  # no output node to start after
    with torch.no_grad():
        loss = (w * 2).pow(2).sum()
    assert saving_nodes(loss, [w * 2], set()) == []  # a loss without a graph
