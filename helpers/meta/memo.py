"""A memo of meta-device results (the meta profiler's second fast path, after `meta_pointwise`).

On the meta device an op computes nothing: its result is empty tensors whose shapes, strides,
dtypes and storage sizes follow from its operands' metadata and its other arguments alone.
Many ops' meta kernels are Python (`torch._meta_registrations`, `torch._refs`), 0.1 to 15 ms
a call, and a model's blocks call them with the same metadata again and again (every layer,
every micro-step). `MetaMemo.run(func, args, kwargs)` runs an op the first time it sees a call,
and afterwards answers the same call with fresh empty tensors of the recorded metadata:

- the key is the op, every tensor operand's device, shape, strides, storage offset and dtype,
  every other argument's type and value, and the default dtype;
- an output that is one of the operands (an in-place op's `self`) is that operand again;
- a call is never memoised if its result shares storage with an operand or with another output
  (a view), if it changed an operand's metadata (`resize_`), if any operand is on a real
  device other than a 0-dim CPU scalar, or if an argument or output is of a kind it does not
  know: those ops run every time.

The result is what the op's own meta kernel gives (`tests/meta/test_memo.py` compares whole
profiles with and without the memo), so a profile is the same either way.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from helpers.measure.dispatch import op_facts
from helpers.meta.pointwise import fast_pointwise

__all__ = ["SHARED", "MetaMemo", "MetaRunner"]

_META = torch.device("meta")
_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)
_UNKNOWN = object()
_SKIP = None  # a memo entry that says: run this call every time


def _describe(value: object, tensors: list[torch.Tensor]) -> object:
    """A hashable description of an argument (appending its tensors to `tensors`), or `_UNKNOWN`."""
    if isinstance(value, torch.Tensor):
        if value.device != _META and not (value.device.type == "cpu" and value.dim() == 0):
            return _UNKNOWN
        tensors.append(value)
        return (value.device.type, tuple(value.shape), value.stride(), value.storage_offset(), value.dtype)
    if isinstance(value, tuple | list | dict):  # a dict (the keyword arguments) as its (name, value) pairs
        parts = []
        for v in value.items() if isinstance(value, dict) else value:
            d = _describe(v, tensors)
            if d is _UNKNOWN:
                return _UNKNOWN
            parts.append(d)
        return (type(value), tuple(parts))
    if isinstance(value, _PLAIN):
        return (type(value), value)
    return _UNKNOWN


def _recipe(out: object, inputs: list[torch.Tensor]) -> object:
    """How to rebuild `out` from operands and fresh empty tensors, or `_SKIP`."""
    flat = out if isinstance(out, tuple | list) else (out,)
    seen = {t.untyped_storage()._cdata for t in inputs}
    parts = []
    for t in flat:
        if t is None:
            parts.append(None)
            continue
        same = next((i for i, x in enumerate(inputs) if x is t), None)
        if same is not None:
            parts.append(("operand", same))
            continue
        if type(t) is not torch.Tensor:
            return _SKIP  # not a tensor, or a subclass
        st = t.untyped_storage()
        if t.device != _META or st._cdata in seen:
            return _SKIP  # a view of an operand or of another output, or a real tensor
        seen.add(st._cdata)
        parts.append(("new", tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, st.nbytes()))
    return (type(out) if isinstance(out, tuple | list) else None, tuple(parts))


def _empty(shape: tuple[int, ...], stride: tuple[int, ...], offset: int, dtype: torch.dtype,
           nbytes: int) -> torch.Tensor:
    t = torch.empty_strided(shape, stride, dtype=dtype, device=_META)
    if offset == 0 and t.untyped_storage().nbytes() == nbytes:
        return t
    storage = torch.UntypedStorage(nbytes, device=_META)
    return torch.empty(0, dtype=dtype, device=_META).set_(storage, offset, shape, stride)


class MetaMemo:
    """Results of meta-device op calls, remembered by the calls' metadata (see the module docstring).

    Args:
        limit: the most calls remembered; beyond it, new calls simply run.
    """

    def __init__(self, limit: int = 50_000) -> None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise ValueError(f"limit must be an int >= 0, got {limit!r}")
        self.limit = limit
        self.hits = 0
        self._memo: dict[tuple, object] = {}

    def run(self, func: Callable[..., object], args: tuple, kwargs: dict) -> object:
        """`func(*args, **kwargs)`, from the memo when this call's metadata was seen before.

        Args:
            func: an aten op overload (what `__torch_dispatch__` receives).
            args: its positional arguments.
            kwargs: its keyword arguments.

        Returns:
            What the op returns: on a repeated call, the operands it returns and fresh empty
            meta tensors with the recorded shapes, strides, offsets, dtypes and storage sizes.
        """
        facts = op_facts(func)
        if facts.view:  # (an op without a schema counts as a view: it always runs)
            return func(*args, **kwargs)
        inputs: list[torch.Tensor] = []
        desc = _describe((args, kwargs), inputs)
        on_meta = [t.device == _META for t in inputs]
        if desc is _UNKNOWN or not any(on_meta) or (facts.mutates and not all(on_meta)):
            return func(*args, **kwargs)  # never skip an in-place op on a real tensor
        key = (func, desc, torch.get_default_dtype())
        recipe = self._memo.get(key, _UNKNOWN)
        if recipe is _UNKNOWN:
            out = func(*args, **kwargs)
            after: list[torch.Tensor] = []
            unchanged = _describe((args, kwargs), after) == desc
            if len(self._memo) < self.limit:
                self._memo[key] = _recipe(out, inputs) if unchanged else _SKIP
            return out
        if recipe is _SKIP:
            return func(*args, **kwargs)
        self.hits += 1
        container, parts = recipe  # type: ignore[misc]
        built = [None if p is None else inputs[p[1]] if p[0] == "operand" else _empty(*p[1:]) for p in parts]
        return built[0] if container is None else container(built)


SHARED = MetaMemo()  # the meta profiles' memo: a model's calls repeat across profiles too


class MetaRunner:
    """How a meta profile runs its ops (a `helpers.measure.dispatch.OpRunner`): the fast paths first.

    A plain pointwise op on meta gets its (empty) result from
    `helpers.meta.pointwise.fast_pointwise`, the same tensor as the op's own meta kernel in a few
    microseconds instead of about 200; any other call goes to `memo` (a call seen before gets its
    result from its metadata), or with `memo=None` to the op itself.

    Args:
        memo: the `MetaMemo` to answer repeated calls from, or None.
    """

    def __init__(self, memo: MetaMemo | None = SHARED) -> None:
        if memo is not None and not isinstance(memo, MetaMemo):
            raise ValueError(f"memo must be a MetaMemo or None, got {type(memo).__name__}")
        self.memo = memo

    def run(self, func: Callable[..., object], args: tuple, kwargs: dict) -> object:
        """`func(*args, **kwargs)`, from the pointwise fast path or the memo where they answer."""
        out = fast_pointwise(func, args, kwargs)  # None unless a plain pointwise op on meta
        if out is not None:
            return out
        return func(*args, **kwargs) if self.memo is None else self.memo.run(func, args, kwargs)
