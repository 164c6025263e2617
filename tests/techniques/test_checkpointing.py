"""Unit tests for helpers.techniques.checkpointing (lesson 02), at tiny sizes."""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from helpers.core.data import image_batch, token_batch
from helpers.core.device import seed_everything
from helpers.core.training import lm_loss
from helpers.measure.memory import new_live_bytes, saved_activation_bytes
from helpers.models.gpt import GPT, GPTConfig
from helpers.models.nets import ConvNet
from helpers.techniques import checkpointing as ckpt
from helpers.techniques import costs
from helpers.techniques.saved_tensors import attention_core_policy, save_matmul_outputs

B, S, H, A = 2, 16, 16, 2


def _gpt(n_layers: int = 4, dropout: float = 0.1) -> tuple[GPT, torch.Tensor, torch.Tensor]:
    seed_everything(0)
    model = GPT(GPTConfig(vocab_size=32, seq_len=S, d_model=H, n_heads=A, n_layers=n_layers,
                          dropout=dropout))
    idx, targets = token_batch(B, S, 32)
    return model, idx, targets


def _loss(model: GPT, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return lm_loss(model(idx), targets)


def test_block_wrapper_arguments() -> None:
    assert ckpt.make_block_wrapper("none") is None
    with pytest.raises(ValueError, match="policy"):
        ckpt.make_block_wrapper("some")
    with pytest.raises(ValueError, match="every"):
        ckpt.make_block_wrapper("full", every=0)


def test_apply_ac_sets_and_restores_the_block_wrapper() -> None:
    model, idx, targets = _gpt(n_layers=4, dropout=0.0)
    own = ckpt.make_block_wrapper("save-matmuls")
    model.block_wrapper = own
    plain = saved_activation_bytes(lambda: lm_loss(GPT(model.cfg)(idx), targets))
    with ckpt.apply_ac(model) as wrapper:
        assert model.block_wrapper is wrapper and wrapper is not own
        full = saved_activation_bytes(lambda: _loss(model, idx, targets))
    assert model.block_wrapper is own
    assert full < 0.5 * plain
    with ckpt.apply_ac(model, "none") as wrapper:
        assert wrapper is None and model.block_wrapper is None  # "none": the blocks run plain
    with pytest.raises(RuntimeError, match="inside"), ckpt.apply_ac(model, "attention-core"):
        raise RuntimeError("inside")
    assert model.block_wrapper is own  # restored after an exception too
    with ckpt.apply_ac(model, own) as wrapper:
        assert wrapper is own
    for bad, kwargs, msg in [("some", {}, "policy"), ("full", {"every": 0}, "every"),
                             (own, {"every": 2}, "named mode"), (3, {}, "mode must be")]:
        with pytest.raises((ValueError, TypeError), match=msg), ckpt.apply_ac(model, bad, **kwargs):
            pass
    assert model.block_wrapper is own


def test_apply_ac_wraps_the_blocks_of_a_model_without_block_wrapper() -> None:
    net = torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(3)]))
    calls = []
    with ckpt.apply_ac(net, lambda block, x: (calls.append(1), block(x))[1]):
        assert all("forward" in vars(b) for b in net[0])
        for block in net[0]:
            block(torch.ones(2, 4))
    assert len(calls) == 3 and not any("forward" in vars(b) for b in net[0])
    with ckpt.apply_ac(net, "none"):
        assert not any("forward" in vars(b) for b in net[0])
    with pytest.raises(ValueError, match="every=2"), ckpt.apply_ac(net, "full", every=2):
        pass
    with pytest.raises(ValueError, match="no nn.ModuleList"), ckpt.apply_ac(torch.nn.Linear(2, 2)):
        pass


def test_full_mode_is_non_reentrant() -> None:
    """Non-reentrant checkpointing gives the block's weights their gradient even when the input
    needs none, and works with `torch.autograd.grad`; the reentrant variant does neither.
    Expected: d/dW sum(W x + b) over rows = column sums of x, for every output row."""
    full = ckpt.make_block_wrapper("full")
    torch.manual_seed(0)
    block = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)
    full(block, x).sum().backward()
    assert block.weight.grad is not None
    torch.testing.assert_close(block.weight.grad, x.sum(0).expand(8, 8))
    (gw,) = torch.autograd.grad(full(block, x).sum(), [block.weight])
    torch.testing.assert_close(gw, x.sum(0).expand(8, 8))


def test_full_and_selective_checkpointing() -> None:
    model, idx, targets = _gpt(n_layers=4)
    saved, extra, grads = {}, {}, {}
    for policy in ckpt.POLICIES:  # none, full, save-matmuls, attention-core
        model.block_wrapper = ckpt.make_block_wrapper(policy)
        saved[policy] = saved_activation_bytes(lambda: _loss(model, idx, targets))

        def step() -> None:
            _loss(model, idx, targets).backward()

        extra[policy] = costs.count_flops(step)
        model.zero_grad(set_to_none=True)
        seed_everything(1)
        step()
        grads[policy] = torch.cat([p.grad.flatten() for p in model.parameters()])
        model.zero_grad(set_to_none=True)
    model.block_wrapper = None
    for selective in ("save-matmuls", "attention-core"):
        assert saved["full"] < saved[selective] < saved["none"]
        assert extra["none"] < extra[selective] < extra["full"]
        torch.testing.assert_close(grads[selective], grads["none"])
    torch.testing.assert_close(grads["full"], grads["none"])


def test_every_other_block_lands_between() -> None:
    model, idx, targets = _gpt(n_layers=4)
    saved = {}
    for every in (1, 2):
        model.block_wrapper = ckpt.make_block_wrapper("full", every=every)
        saved[every] = saved_activation_bytes(lambda: _loss(model, idx, targets))
    model.block_wrapper = None
    plain = saved_activation_bytes(lambda: _loss(model, idx, targets))
    assert saved[1] < saved[2] < plain


def test_every_other_block_checkpoints_blocks_0_2_4(monkeypatch: pytest.MonkeyPatch) -> None:
    # The docstring: the first block, then every `every`-th after it. With 5 blocks and every=2
    # that is blocks 0, 2 and 4 (counted by hand), and only those reach `checkpoint`.
    model, idx, targets = _gpt(n_layers=5, dropout=0.0)
    index_of = {id(block): i for i, block in enumerate(model.blocks)}
    reached: list[int] = []

    def recording_checkpoint(fn: Callable[..., torch.Tensor], *args: object,
                             **kwargs: object) -> torch.Tensor:
        reached.append(index_of[id(fn)])
        return checkpoint(fn, *args, **kwargs)

    monkeypatch.setattr(ckpt, "checkpoint", recording_checkpoint)
    model.block_wrapper = ckpt.make_block_wrapper("full", every=2)
    _loss(model, idx, targets).backward()
    assert reached == [0, 2, 4]


def test_every_other_block_of_three_keeps_one_blocks_activations() -> None:
    # 3 equal blocks (no dropout), every=2 checkpoints blocks 0 and 2 and leaves one block plain,
    # so it keeps exactly one third of what checkpointing all three saves over none.
    model, idx, targets = _gpt(n_layers=3, dropout=0.0)
    saved = {}
    for every in (None, 1, 2):
        model.block_wrapper = None if every is None else ckpt.make_block_wrapper("full", every=every)
        saved[every] = saved_activation_bytes(lambda: _loss(model, idx, targets))
    per_block = (saved[None] - saved[1]) / 3
    assert per_block > 0
    assert saved[2] - saved[1] == pytest.approx(per_block, rel=0.02)


def test_inference_saves_nothing() -> None:
    model, idx, _ = _gpt(n_layers=2)
    for policy in ("none", "full"):
        model.block_wrapper = ckpt.make_block_wrapper(policy)
        with torch.no_grad():
            assert new_live_bytes(lambda: model(idx)) == 0


def test_batchnorm_double_update_and_fix() -> None:
    images, labels = image_batch(8, size=8)

    def counts(context_fn: object | None) -> int:
        seed_everything(0)
        net = ConvNet(3, 4, 2, 10, norm="batch")
        kwargs = {} if context_fn is None else {"context_fn": lambda: context_fn(net)}
        net.block_wrapper = lambda block, x: checkpoint(block, x, use_reentrant=False, **kwargs)
        F.cross_entropy(net(images), labels).backward()
        return int(net.blocks[0][1].num_batches_tracked)

    assert counts(None) == 2
    assert counts(lambda net: (contextlib.nullcontext(), ckpt.freeze_batchnorm_stats(net))) == 1


def test_freeze_batchnorm_restores_momentum() -> None:
    net = ConvNet(3, 4, 1, 10, norm="batch")
    bn = net.blocks[0][1]
    with ckpt.freeze_batchnorm_stats(net):
        assert bn.momentum == 0.0
        bn(torch.randn(4, 4, 3, 3))
    assert bn.momentum == 0.1 and int(bn.num_batches_tracked) == 0


def _reentrant_call(block: torch.nn.Module, x: torch.Tensor, *, reentrant: bool) -> torch.Tensor:
    return ckpt.checkpoint_with(block, x, reentrant=reentrant)


def test_every_is_not_a_bool() -> None:
    with pytest.raises(TypeError, match="every"):
        ckpt.make_block_wrapper("full", every=True)  # type: ignore[arg-type]


def test_reentrant_trap_with_frozen_embeddings() -> None:
    model, idx, targets = _gpt(n_layers=2, dropout=0.0)
    model.tok.requires_grad_(False)
    model.pos.requires_grad_(False)
    missing = {}
    for reentrant in (False, True):
        model.block_wrapper = functools.partial(_reentrant_call, reentrant=reentrant)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _loss(model, idx, targets).backward()
        missing[reentrant] = (ckpt.params_without_grad(model), [str(w.message) for w in caught])
        model.zero_grad(set_to_none=True)
    assert missing[False] == ([], [])
    assert len(missing[True][0]) == 24 and all(n.startswith("blocks.") for n in missing[True][0])
    assert any("requires_grad=True" in m for m in missing[True][1])
    with pytest.raises(TypeError, match="reentrant"):
        ckpt.checkpoint_with(model.blocks[0], torch.randn(1, S, H), reentrant=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ckpt.params_without_grad("model")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# Issue 16: tests written against the surviving mutants of helpers/techniques/checkpointing.py
# ---------------------------------------------------------------------------


def test_default_block_wrapper_matches_the_notebooks_checkpoint_call() -> None:
    """Each policy against the `checkpoint(...)` call the lesson writes out (issue 16, item 4).

    "full" with the default `every` checkpoints every block, like the notebook's lambda;
    "save-matmuls" and "attention-core" pass their own policy as `context_fn`.
    """
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    model, idx, targets = _gpt(n_layers=4)

    def kept(wrapper: object) -> int:
        model.block_wrapper = wrapper
        try:
            return saved_activation_bytes(lambda: _loss(model, idx, targets))
        finally:
            model.block_wrapper = None

    def selective(policy: object) -> object:
        context = functools.partial(create_selective_checkpoint_contexts, policy)
        return lambda block, x: checkpoint(block, x, use_reentrant=False, context_fn=context)

    notebook = {
        "full": lambda block, x: checkpoint(block, x, use_reentrant=False),
        "save-matmuls": selective(save_matmul_outputs),
        "attention-core": selective(attention_core_policy(B, A)),
    }
    expected = {policy: kept(wrapper) for policy, wrapper in notebook.items()}
    assert len(set(expected.values())) == 3  # the three policies keep different amounts
    assert {policy: kept(ckpt.make_block_wrapper(policy)) for policy in notebook} == expected


# -- Killing tests for the mutation run (new survivors) ---------------------------------------------------


class _Stack(torch.nn.Module):
    """A model without `block_wrapper`: a small ModuleList (6 parameters) and the 3 blocks it runs (120)."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.ModuleList([torch.nn.Linear(2, 2, bias=True)])
        self.blocks = torch.nn.ModuleList([torch.nn.Sequential(
            torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4), torch.nn.Tanh())
                                           for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x.square()


def test_blocks_of_picks_the_module_list_with_the_most_parameters() -> None:
    """Hand count: `head` has 2x2 + 2 = 6 parameters, `blocks` 3 x 2 x (4x4 + 4) = 120, so blocks wins."""
    torch.manual_seed(0)
    net = _Stack()
    assert ckpt.blocks_of(net) is net.blocks


def test_apply_ac_full_on_a_model_without_block_wrapper_keeps_outputs_and_gradients() -> None:
    """Checkpointing the blocks through their `forward` changes neither the output nor the gradients
    (torch's plain run of the same model), and saves less for backward."""
    torch.manual_seed(0)
    net = _Stack()
    x = torch.randn(8, 4)
    want = net(x)
    want_grads = torch.autograd.grad(want.sum(), list(net.blocks.parameters()))
    plain = saved_activation_bytes(lambda: net(x).sum())
    with ckpt.apply_ac(net, "full"):
        got = net(x)
        got_grads = torch.autograd.grad(got.sum(), list(net.blocks.parameters()))
        full = saved_activation_bytes(lambda: net(x).sum())
    assert torch.equal(got, want)
    for g, w in zip(got_grads, want_grads, strict=True):
        assert torch.allclose(g, w, atol=1e-6)
    assert (plain, full) == (6 * 8 * 4 * 4, 3 * 8 * 4 * 4)  # both tanh outputs of each block, or its output


def test_apply_ac_mode_none_is_the_same_as_mode_none_string() -> None:
    """mode=None, like "none", lifts a model's own block wrapper while inside and puts it back after."""
    model, _, _ = _gpt(n_layers=2, dropout=0.0)
    own = ckpt.make_block_wrapper("full")
    model.block_wrapper = own
    with ckpt.apply_ac(model, None) as wrapper:
        assert wrapper is None and model.block_wrapper is None
    assert model.block_wrapper is own
