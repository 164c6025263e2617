"""Tests of helpers.meta.pointwise: its results are the meta kernels', and profiles do not change."""

from __future__ import annotations

import dataclasses
import functools
import random

import pytest
import torch

import helpers.meta.memo
from helpers.core.data import BatchSpec
from helpers.meta.pointwise import _BINARY, _UNARY, fast_pointwise
from helpers.meta.profiler import Profiler
from helpers.models.architecture_config import ArchConfig
from helpers.models.architectures import CausalLM

aten = torch.ops.aten
FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _same_result(fast: torch.Tensor, real: torch.Tensor) -> bool:
    """Shape, dtype, device, bytes, and the strides of every dim that addresses memory (size > 1)."""
    strides = [(f, r) for n, f, r in zip(real.shape, fast.stride(), real.stride(), strict=True) if n != 1]
    return (fast.shape == real.shape and fast.dtype == real.dtype and fast.device == real.device
            and fast.untyped_storage().nbytes() == real.untyped_storage().nbytes()
            and all(f == r for f, r in strides))


def _operand(rng: random.Random, shape: tuple[int, ...]) -> torch.Tensor:
    """A meta tensor of `shape` in one of several layouts: contiguous, permuted, sliced, expanded."""
    dtype = rng.choice(FLOATS)
    layout = rng.choice(["contiguous", "permuted", "sliced", "expanded"])
    if layout == "permuted" and len(shape) > 1:
        perm = list(range(len(shape)))
        rng.shuffle(perm)
        base = torch.empty([shape[p] for p in perm], dtype=dtype, device="meta")
        return base.permute([perm.index(i) for i in range(len(shape))])
    if layout == "sliced" and shape:
        base = torch.empty((*shape[:-1], shape[-1] * 2), dtype=dtype, device="meta")
        return base[..., : shape[-1]]
    if layout == "expanded" and shape:  # some dims broadcast from 1: stride 0
        base = [1 if rng.random() < 0.5 else n for n in shape]
        return torch.empty(base, dtype=dtype, device="meta").expand(*shape)
    return torch.empty(shape, dtype=dtype, device="meta")


def _cases(seed: int) -> list[tuple[object, tuple]]:
    rng = random.Random(seed)
    cases = []
    for _ in range(400):
        ndim = rng.randint(0, 4)
        shape = tuple(rng.choice([1, 1, 2, 3, 5]) for _ in range(ndim))
        a = _operand(rng, shape)
        func = rng.choice(sorted(_BINARY | _UNARY, key=str))
        if func in _UNARY:
            cases.append((func, (a,)))
            continue
        if func._overloadname in ("Scalar", "Tensor_Scalar"):
            other: object = rng.choice([2, 0.5, -3])
        else:
            kind = rng.choice(["same", "broadcast", "scalar", "cpu-scalar"])
            if kind == "scalar":
                other = rng.choice([2, 0.5])
            elif kind == "cpu-scalar":
                other = torch.tensor(1.5, dtype=rng.choice((torch.float32, torch.float64)))
            else:
                keep = [n if kind == "same" or rng.random() < 0.5 else 1 for n in shape]
                other = _operand(rng, tuple(keep[rng.randint(0, len(keep)):]) if keep else ())
        args = (a, other) if rng.random() < 0.7 or not isinstance(other, torch.Tensor) else (other, a)
        cases.append((func, args))
    return cases


@pytest.mark.parametrize("seed", range(5))
def test_fast_results_are_the_meta_kernels(seed: int) -> None:
    """400 random ops per seed (layouts, broadcasts, dtypes, scalars): where the fast path answers,
    its tensor is the meta kernel's; and it answers for most of them, so the comparison is real."""
    answered = 0
    cases = _cases(seed)
    for func, args in cases:
        fast = fast_pointwise(func, args, {})
        if fast is None:
            continue
        answered += 1
        real = func(*args)
        assert _same_result(fast, real), (func, [getattr(a, "shape", a) for a in args],
                                          [a.stride() for a in args if isinstance(a, torch.Tensor)],
                                          fast.stride(), real.stride())
    assert answered >= len(cases) // 2, answered


META = {"device": "meta"}


@pytest.mark.parametrize(("func", "args", "kwargs"), [
    (aten.add.Tensor, (torch.empty(3, dtype=torch.int64, **META), 1), {}),  # an integer tensor
    (aten.mul.Tensor, (torch.empty(3, 1, **META), torch.empty(1, 4, **META)), {}),  # both broadcast
    (aten.mul.Tensor, (torch.empty(3, **META), torch.empty(3)), {}),  # a CPU tensor with dims
    (aten.mul.Tensor, (torch.empty(3), torch.empty(3)), {}),  # no meta operand
    (aten.mul.Tensor, (torch.empty(3, **META), True), {}),  # a bool
    (aten.mul.Tensor, (torch.empty(3, **META), torch.empty(4, **META)), {}),  # no broadcast
    (aten.add.Tensor, (torch.empty(3, **META), torch.empty(3, **META)), {"out": None}),
    (aten.mm.default, (torch.empty(3, 3, **META), torch.empty(3, 3, **META)), {}),  # not pointwise
    (aten.neg.default, (torch.empty(3, **META).expand(2, 3),), {}),  # a broadcast (stride 0) operand
    (aten.mul.Tensor, (torch.empty(2, **META), torch.empty(3, **META)), {}),  # no broadcast, a 2 first
    (aten.mul.Tensor, (torch.empty(3, **META), "a"), {}),  # not a number
    (aten.mul.Scalar, (torch.empty(3, **META), 2j), {}),  # a complex number
    (aten.mul.Tensor, (torch.tensor(2.0), torch.tensor(3.0)), {}),  # CPU scalars only: a CPU result
])
def test_the_fast_path_leaves_other_cases_to_the_op(func: object, args: tuple, kwargs: dict) -> None:
    """Integer tensors, two-sided broadcasts, CPU tensors, bools, bad shapes, other ops: None."""
    assert fast_pointwise(func, args, kwargs) is None


@pytest.mark.parametrize(("func", "args", "kwargs"), [
    (aten.mul.Tensor, (torch.empty(3, **META), torch.empty(1, 3, **META)), {}),  # a shorter operand first
    (aten.mul.Tensor, (torch.empty(1, 3, **META), torch.empty(3, **META)), {}),  # a shorter operand second
    (aten.add.Tensor, (torch.empty(3, 4, **META), torch.empty(3, 4, **META)), {"alpha": 2}),
    (aten.mul.Scalar, (torch.empty(3, **META), 2), {}),  # a Python number
    (aten.mul.Tensor, (torch.empty((), **META), torch.empty(4, 3, **META).t()), {}),  # a 0-dim operand first
])
def test_the_fast_path_answers_the_plain_cases(func: object, args: tuple, kwargs: dict) -> None:
    """Broadcasts against leading 1s, alpha, Python numbers, a 0-dim operand before a transposed one:
    answered, with the kernel's tensor (every stride, here)."""
    fast, real = fast_pointwise(func, args, kwargs), func(*args, **kwargs)
    assert fast is not None and _same_result(fast, real) and fast.stride() == real.stride()


def test_a_transposed_or_sliced_operand_gives_the_kernels_layout() -> None:
    """RoPE's case: q transposed to (b, heads, seq, dim), sliced in half, times a broadcast table."""
    q = torch.empty(3, 16, 4, 8, device="meta").transpose(1, 2)
    table = torch.empty(1, 1, 16, 8, device="meta")
    for func, args in [(aten.mul.Tensor, (q, table)), (aten.neg.default, (q[..., :4],)),
                       (aten.add.Tensor, (q, q.contiguous()))]:
        fast = fast_pointwise(func, args, {})
        assert fast is not None and not fast.is_contiguous() and _same_result(fast, func(*args))


TINY = {
    "llama": ArchConfig("llama", 512, 64, 128, 2, 4, 32, num_kv_heads=2, tie_embeddings=True),
    "gpt2": ArchConfig("gpt2", 512, 64, 256, 2, 4, 32, tie_embeddings=True, embd_dropout=0.1,
                       attn_dropout=0.1, resid_dropout=0.1),
}


@pytest.mark.parametrize(("family", "target", "precision", "checkpoint"), [
    ("llama", "cuda", "bf16", "blocks"), ("llama", "cpu", "fp32", "none"), ("gpt2", "cuda", "fp32", "none"),
])
def test_profiles_are_the_same_without_the_fast_path(
        family: str, target: str, precision: str, checkpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole update's profile (every peak, category and timeline figure) is the same with the op's own
    meta kernels, at B = 1 (dims of size 1) and B = 3."""
    cfg = TINY[family]

    def profiles() -> list[object]:
        p = Profiler(functools.partial(CausalLM, cfg), BatchSpec.lm(16, cfg.vocab_size), target=target,
                     precision=precision)
        return [dataclasses.asdict(p.step(b, checkpoint=checkpoint)) for b in (1, 3)]

    profiles()  # the first profile of a process also records the CPU target's kernel probe (3 ops)
    fast = profiles()
    monkeypatch.setattr(helpers.meta.memo, "fast_pointwise", lambda func, args, kwargs: None)
    assert profiles() == fast
