"""Which autograd nodes hold a tensor: what a `del predictions` can and cannot free (core).

`helpers.measure.tracker.MemoryTracker.could_release` asks this when a loop says where it would drop
its outputs: a tensor that the loss's own graph saved for backward (an MSE loss saves its
input) stays alive until that node has run, whatever the loop deletes.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

__all__ = ["output_tensors", "saving_nodes"]


def _storage_key(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return None


def output_tensors(outputs: object) -> Iterator[torch.Tensor]:
    """The tensors of a model's outputs: a tensor, a tuple/list/dict of them, or a `ModelOutput`."""
    if isinstance(outputs, torch.Tensor):
        yield outputs
    elif isinstance(outputs, dict):  # Hugging Face's ModelOutput is an OrderedDict
        for value in outputs.values():
            yield from output_tensors(value)
    elif isinstance(outputs, tuple | list):
        for value in outputs:
            yield from output_tensors(value)


def _saved_by(node: object) -> Iterator[torch.Tensor]:
    """The tensors an autograd node saved for backward (empty once backward has freed them)."""
    names = [n for n in dir(node) if n.startswith("_saved_")]
    if "saved_tensors" in dir(node):  # a custom autograd.Function (hasattr raises once backward freed them)
        names.append("saved_tensors")
    for name in names:
        try:
            value = getattr(node, name)
        except RuntimeError:  # already freed
            continue
        yield from output_tensors(value)


def saving_nodes(loss: torch.Tensor, outputs: list[torch.Tensor], keys: set[int]) -> list[object]:
    """The nodes of the loss's graph (after the outputs were made) that saved one of `keys`.

    Only the loss's own nodes are searched: those with a larger sequence number than the
    outputs' `grad_fn`s, which autograd numbers in the order it creates them.
    """
    made = [t.grad_fn._sequence_nr() for t in outputs if t.grad_fn is not None]
    if loss.grad_fn is None or not made:
        return []
    after, seen, todo, found = max(made), set(), [loss.grad_fn], []
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen or node._sequence_nr() <= after:
            continue
        seen.add(id(node))
        if any(_storage_key(t) in keys for t in _saved_by(node)):
            found.append(node)
        todo.extend(fn for fn, _ in node.next_functions)
    return found
