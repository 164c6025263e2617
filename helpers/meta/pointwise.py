"""Fast meta-device results for the commonest pointwise ops (the meta profiler's hot path).

On the meta device, PyTorch runs `add`, `mul` and the other pointwise ops through Python
reference implementations (`torch._meta_registrations`): about 200 microseconds an op, the
largest single cost of a meta profile. `fast_pointwise(func, args, kwargs)` gives the same
result for the plain cases in a few microseconds, following the fast path of PyTorch's own
`FakeTensor` (`torch._subclasses.fake_impls.make_fast_binary_impl`, after `TensorIterator`):

- every tensor operand is on the meta device, or is a 0-dim CPU tensor (a scalar);
- the floating-point dtypes promote as `torch.result_type` says;
- the layout follows the first operand with dims (the lead): contiguous where it is (a lead
  that broadcasts only if every operand is contiguous and one has the result's whole shape);
  otherwise dense in the order of its strides, where it has the whole shape and those strides
  leave no ties.

Anything else (an integer or bool tensor, a broadcast on both sides, a lead with tied or zero
strides, an unexpected argument) returns None, and the caller runs the op itself. The result is an
empty meta tensor: shape, dtype, strides and size are what the op's own meta kernel gives
(`tests/meta/test_pointwise.py` compares them), so a profile is the same either way.
"""

from __future__ import annotations

import torch

__all__ = ["fast_pointwise"]

_aten = torch.ops.aten
# Two operands (tensors or Python numbers); the only keyword allowed is `alpha` (add/sub), which
# changes values, not the result's shape or dtype.
_BINARY = {_aten.add.Tensor, _aten.sub.Tensor, _aten.mul.Tensor, _aten.div.Tensor, _aten.mul.Scalar,
           _aten.div.Scalar, _aten.add.Scalar, _aten.sub.Scalar, _aten.pow.Tensor_Scalar}
_UNARY = {_aten.neg.default, _aten.rsqrt.default, _aten.exp.default, _aten.sqrt.default,
          _aten.silu.default, _aten.sigmoid.default, _aten.tanh.default, _aten.reciprocal.default}
_META = torch.device("meta")
_FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _broadcast(x: tuple[int, ...], y: tuple[int, ...]) -> tuple[int, ...] | None:
    """The broadcast of two shapes, or None where they do not broadcast."""
    if x == y:
        return x
    n = max(len(x), len(y))
    x, y = (1,) * (n - len(x)) + tuple(x), (1,) * (n - len(y)) + tuple(y)
    out = []
    for a, b in zip(x, y, strict=True):
        if a != b and a != 1 and b != 1:
            return None
        out.append(b if a == 1 else a)
    return tuple(out)


def _strides_following(lead: torch.Tensor) -> tuple[int, ...] | None:
    """Dense strides that order the dims as `lead`'s strides do, or None where that order is unclear.

    With the strides of `lead`'s dims longer than 1 all different and non-zero, the first
    operand decides the order of those dims in TensorIterator's reordering, whatever the
    other operands' layouts, and the result is dense in that order. Dims of size 1 address
    nothing: they get the stride a contiguous tensor would give them.
    """
    sizes, strides = lead.shape, lead.stride()
    dims = [i for i, n in enumerate(sizes) if n != 1]
    keys = [strides[i] for i in dims]
    if 0 in keys or len(set(keys)) != len(keys):
        return None
    out = [1] * len(sizes)
    for i in range(len(sizes) - 2, -1, -1):  # a contiguous tensor's strides, for the dims of size 1
        out[i] = out[i + 1] * max(sizes[i + 1], 1)
    step = 1
    for i in sorted(dims, key=strides.__getitem__):
        out[i] = step
        step *= sizes[i]
    return tuple(out)


def fast_pointwise(func: object, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The result of pointwise op `func` on meta operands, or None where the fast path does not apply.

    Args:
        func: the aten op overload being dispatched (e.g. `torch.ops.aten.mul.Tensor`).
        args: its positional arguments.
        kwargs: its keyword arguments (only `alpha` is accepted).

    Returns:
        An empty meta tensor with the shape, dtype and layout the op's own meta kernel gives
        (the strides of dims of size 1 aside, which address nothing), or None: then run the
        op as usual.
    """
    unary = func in _UNARY
    if not unary and func not in _BINARY:
        return None
    if len(args) != (1 if unary else 2) or (kwargs and (unary or set(kwargs) != {"alpha"})):
        return None
    shape = None
    lead = None  # the first operand with dims: it decides the result's layout
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.dtype not in _FLOATS:
                return None
            if a.device != _META and (a.dim() != 0 or unary):  # CPU tensors other than scalars: the op raises
                return None
            if lead is None and a.dim() != 0:
                lead = a
            shape = a.shape if shape is None else _broadcast(shape, a.shape)
            if shape is None:  # shapes that do not broadcast: the op raises its own error
                return None
        elif unary or not isinstance(a, float | int) or isinstance(a, bool):
            return None
    if all(not isinstance(a, torch.Tensor) or a.device != _META for a in args):
        return None
    dtype = args[0].dtype if unary else torch.result_type(*args)
    if lead is None or lead.is_contiguous():
        if lead is not None and lead.shape != shape and not (
                all(a.is_contiguous() for a in args if isinstance(a, torch.Tensor))
                and any(isinstance(a, torch.Tensor) and a.shape == shape for a in args)):
            return None  # a broadcast lead: contiguous only if all are, and one has the whole shape
        return torch.empty(shape, dtype=dtype, device=_META)
    strides = _strides_following(lead) if lead.shape == shape else None
    if strides is None:  # a broadcast lead operand, or ties in its strides: leave it to the op
        return None
    return torch.empty_strided(shape, strides, dtype=dtype, device=_META)
