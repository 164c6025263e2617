"""helpers.meta.memo: repeated meta calls answered from their metadata give the same profile."""

from __future__ import annotations

import pytest
import torch
from support.tiers import check_cases
from test_profiler import MODELS

from helpers.meta.memo import MetaMemo
from helpers.meta.profiler import Profiler

aten = torch.ops.aten


def _meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def _same_meta(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.shape, a.stride(), a.storage_offset(), a.dtype, a.device, a.untyped_storage().nbytes()) == (
        b.shape, b.stride(), b.storage_offset(), b.dtype, b.device, b.untyped_storage().nbytes())


@pytest.mark.parametrize("case", [
    (aten.native_layer_norm.default, (_meta(4, 6, 8), [8], _meta(8), _meta(8), 1e-5), {}),
    (aten.addmm.default, (_meta(5), _meta(3, 4), _meta(4, 5)), {}),
    (aten.mean.dim, (_meta(2, 3, 4, dtype=torch.bfloat16), [1]), {"keepdim": True}),
    (aten._to_copy.default, (_meta(3, 4).t(),), {"dtype": torch.bfloat16}),
    (aten.cat.default, ([_meta(2, 3), _meta(4, 3)],), {}),
], ids=["layer_norm", "addmm", "mean", "to_copy-transposed", "cat"])
def test_a_repeated_call_gets_fresh_tensors_like_the_kernels(case: tuple) -> None:
    func, args, kwargs = case
    memo = MetaMemo()
    first, again = memo.run(func, args, kwargs), memo.run(func, args, kwargs)
    reference = func(*args, **kwargs)
    assert memo.hits == 1
    if isinstance(first, torch.Tensor):
        first, again, reference = (first,), (again,), (reference,)
    for a, b, ref in zip(first, again, reference, strict=True):
        assert _same_meta(a, ref) and _same_meta(b, ref)
        assert b.untyped_storage()._cdata != a.untyped_storage()._cdata  # a new storage, as the kernel makes


def test_in_place_ops_return_the_operand_and_views_are_never_memoised() -> None:
    memo = MetaMemo()
    x, y = _meta(3, 4), _meta(3, 4)
    assert memo.run(aten.add_.Tensor, (x, y), {}) is x and memo.run(aten.add_.Tensor, (x, y), {}) is x
    assert memo.hits == 1
    for _ in range(2):
        v = memo.run(aten.t.default, (x,), {})
        assert v.untyped_storage()._cdata == x.untyped_storage()._cdata  # still a view of x
    z = _meta(2)
    for _ in range(2):
        memo.run(aten.resize_.default, (z, [8]), {})  # changes its operand: runs every time
    assert memo.hits == 1 and z.untyped_storage().nbytes() == 32


def test_real_tensors_are_never_memoised() -> None:
    memo = MetaMemo()
    x = torch.ones(3)
    for _ in range(2):
        assert memo.run(aten.add_.Scalar, (x, 1), {}) is x
    assert memo.hits == 0 and x.tolist() == [3.0, 3.0, 3.0]  # both additions ran


def test_python_number_types_are_part_of_the_key() -> None:
    memo = MetaMemo()
    x = _meta(3, dtype=torch.int64)
    assert memo.run(aten.mul.Scalar, (x, 2), {}).dtype == torch.int64
    assert memo.run(aten.mul.Scalar, (x, 2.0), {}).dtype == torch.float32
    assert memo.hits == 0


def test_the_limit_is_validated_and_kept() -> None:
    with pytest.raises(ValueError, match="limit must be an int >= 0, got -1"):
        MetaMemo(limit=-1)
    memo = MetaMemo(limit=0)
    x = _meta(3)
    for _ in range(3):
        memo.run(aten.exp.default, (x,), {})
    assert memo.hits == 0


@pytest.mark.parametrize(("name", "precision", "target"), check_cases([
    ("conv-batchnorm", "bf16", "cpu"), ("gpt-fused-attention", "fp32", "cpu"),
    ("transformer-encoder", "bf16", "cuda"), ("gpt", "bf16", "cuda"), ("mlp", "pure-bf16", "cpu")],
    keep={("conv-batchnorm", "bf16", "cpu"), ("gpt", "bf16", "cuda"), ("mlp", "pure-bf16", "cpu")}))
def test_profiles_with_and_without_the_memo_are_the_same(name: str, precision: str, target: str) -> None:
    build, spec, b = MODELS[name]
    Profiler(build, spec, precision=precision, target=target, memo=False).step(b)  # warm the kernel choice
    runs = {}
    for memo in (False, True):
        prof = Profiler(build, spec, precision=precision, target=target, memo=memo)
        runs[memo] = [prof.step(b, checkpoint=ck, accumulation_steps=2) for ck in ("none", "blocks")]
    for plain, memoised in zip(runs[False], runs[True], strict=True):
        assert plain.timeline.ops == memoised.timeline.ops
        assert plain.timeline.series == memoised.timeline.series
        assert plain.peak_bytes == memoised.peak_bytes and plain.breakdown == memoised.breakdown


def test_every_output_that_is_an_operand_comes_back_on_a_hit() -> None:
    """sort's out= variant returns both of its out= operands (values, indices): a hit returns both,
    as the kernel does."""
    memo = MetaMemo()
    x, values, indices = _meta(4), _meta(4), _meta(4, dtype=torch.int64)
    for _ in range(2):
        out = memo.run(aten.sort.values, (x,), {"values": values, "indices": indices})
        assert len(out) == 2 and out[0] is values and out[1] is indices
    assert memo.hits == 1


def test_a_call_with_an_argument_of_unknown_kind_runs_every_time() -> None:
    """A complex scalar is not a kind the key knows: both calls run, so the second one's shape is its own."""
    memo = MetaMemo()
    for n in (3, 5):
        x = _meta(n)
        out = memo.run(aten.mul.Scalar, (x, 2j), {})
        assert _same_meta(out, aten.mul.Scalar(x, 2j)) and out.shape == (n,)
    assert memo.hits == 0


@pytest.mark.parametrize("case", [
    torch.empty(20)[:6].view(2, 3),  # offset 0 in a larger storage
    torch.empty(20)[5:11].view(2, 3),  # offset 5
    torch.empty(3, 0)[1],  # no elements, offset 1, a storage of 0 bytes
    torch.empty(4, 3).t(),  # transposed, the storage exactly its size
], ids=["larger-storage", "offset", "empty-at-offset", "transposed"])
def test_an_empty_tensor_is_rebuilt_with_the_recorded_offset_and_storage(case: torch.Tensor) -> None:
    """A hit rebuilds each new output from (shape, strides, offset, dtype, storage bytes): compared with
    the CPU tensor those came from."""
    from helpers.meta.memo import _empty

    t = _empty(tuple(case.shape), case.stride(), case.storage_offset(), case.dtype,
               case.untyped_storage().nbytes())
    assert t.device.type == "meta"
    assert (t.shape, t.stride(), t.storage_offset(), t.dtype, t.untyped_storage().nbytes()) == (
        case.shape, case.stride(), case.storage_offset(), case.dtype, case.untyped_storage().nbytes())


def test_hits_count_every_answered_call_and_a_bool_limit_is_refused() -> None:
    memo = MetaMemo()
    x = _meta(3, 4)
    for _ in range(4):
        memo.run(aten.addmm.default, (_meta(4), x, _meta(4, 4)), {})
    assert memo.hits == 3
    with pytest.raises(ValueError, match="limit must be an int >= 0, got True"):
        MetaMemo(limit=True)


def test_the_runner_answers_pointwise_ops_first_and_the_rest_from_its_memo() -> None:
    """MetaRunner: a pointwise op never reaches the memo (the fast path answers it); another op is
    answered from the memo given, and by default from the shared one the profiles use."""
    from helpers.meta.memo import SHARED, MetaRunner

    memo = MetaMemo()
    runner = MetaRunner(memo)
    x, y = _meta(3, 4), _meta(3, 4)
    for _ in range(2):
        assert _same_meta(runner.run(aten.add.Tensor, (x, y), {}), aten.add.Tensor(x, y))
    assert memo.hits == 0
    for _ in range(2):
        assert _same_meta(runner.run(aten.mm.default, (x, _meta(4, 2)), {}), aten.mm.default(x, _meta(4, 2)))
    assert memo.hits == 1
    assert isinstance(SHARED, MetaMemo) and MetaRunner().memo is SHARED
    before = SHARED.hits
    for _ in range(2):
        MetaRunner().run(aten.mm.default, (_meta(7, 3), _meta(3, 5)), {})
    assert SHARED.hits > before
