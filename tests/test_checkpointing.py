"""Unit tests for helpers.checkpointing (lesson 02), at tiny sizes."""

from __future__ import annotations

import contextlib

import matplotlib.pyplot as plt
import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from helpers import checkpointing as ckpt
from helpers.data import image_batch, token_batch
from helpers.device import seed_everything
from helpers.memory import new_live_bytes, saved_activation_bytes
from helpers.models import GPT, ConvNet, GPTBlock, GPTConfig

B, S, H, A = 2, 16, 16, 2


def _block(**cfg: object) -> GPTBlock:
    seed_everything(0)
    return GPTBlock(GPTConfig(seq_len=S, d_model=H, n_heads=A, **cfg))


def _gpt(n_layers: int = 4, dropout: float = 0.1) -> tuple[GPT, torch.Tensor, torch.Tensor]:
    seed_everything(0)
    model = GPT(GPTConfig(vocab_size=32, seq_len=S, d_model=H, n_heads=A, n_layers=n_layers,
                          dropout=dropout))
    idx, targets = token_batch(B, S, 32)
    return model, idx, targets


def _loss(model: GPT, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(idx).flatten(0, 1), targets.flatten())


def test_korthikanti_16bit_matches_paper() -> None:
    terms = ckpt.korthikanti_terms(s=S, b=B, h=H, a=A)
    assert sum(terms.values()) == pytest.approx(S * B * H * (34 + 5 * A * S / H))
    fp32 = ckpt.korthikanti_terms(s=S, b=B, h=H, a=A, act_bytes=4, mask_bytes=1)
    assert sum(fp32.values()) == pytest.approx(S * B * H * (66 + 9 * A * S / H))
    no_drop = ckpt.korthikanti_terms(s=S, b=B, h=H, a=A, dropout=False)
    assert sum(no_drop.values()) == pytest.approx(S * B * H * (32 + 2 * A * S / H))


@pytest.mark.parametrize("bad", [{"s": 0}, {"h": -1}, {"a": 1.5}, {"act_bytes": 0}])
def test_korthikanti_rejects_bad_sizes(bad: dict) -> None:
    kwargs = {"s": S, "b": B, "h": H, "a": A, **bad}
    with pytest.raises(ValueError):
        ckpt.korthikanti_terms(**kwargs)


def test_dropout_mask_bytes_cpu() -> None:
    assert ckpt.dropout_mask_bytes("cpu") == 4.0  # CPU keeps a scaled float mask


def test_saved_table_matches_tracker_and_formula() -> None:
    block = _block(dropout=0.1)
    x = torch.randn(B, S, H)
    rows = ckpt.saved_tensor_table(block, x)
    measured = saved_activation_bytes(lambda: block(x + 0))
    assert sum(r.nbytes for r in rows) == pytest.approx(measured, rel=0.01)
    formula = ckpt.korthikanti_terms(s=S, b=B, h=H, a=A, act_bytes=4,
                                     mask_bytes=ckpt.dropout_mask_bytes())
    assert measured == pytest.approx(sum(formula.values()), rel=0.10)
    by_term = ckpt.bytes_by_term(rows)
    for term, nbytes in formula.items():
        assert by_term[term] == pytest.approx(nbytes), term


def test_saved_table_rejects_2d_input() -> None:
    with pytest.raises(ValueError, match="batch, seq, hidden"):
        ckpt.saved_tensor_table(_block(), torch.randn(S, H))


def test_fused_attention_removes_quadratic_term() -> None:
    x = torch.randn(B, S, H)
    plain_block = _block(dropout=0.0)
    plain = saved_activation_bytes(lambda: plain_block(x + 0))
    fused_block = _block(dropout=0.0, fused_attention=True)
    fused = saved_activation_bytes(lambda: fused_block(x + 0))
    quad = ckpt.korthikanti_terms(s=S, b=B, h=H, a=A, act_bytes=4, dropout=False)["softmax output"]
    assert plain - fused == pytest.approx(quad, rel=0.10)


def test_count_flops_linear() -> None:
    lin = torch.nn.Linear(8, 4, bias=False)
    assert ckpt.count_flops(lambda: lin(torch.randn(3, 8))) == 2 * 3 * 8 * 4
    with pytest.raises(ValueError, match="callable"):
        ckpt.count_flops(42)  # type: ignore[arg-type]


def test_block_wrapper_arguments() -> None:
    assert ckpt.make_block_wrapper("none") is None
    with pytest.raises(ValueError, match="policy"):
        ckpt.make_block_wrapper("some")
    with pytest.raises(ValueError, match="every"):
        ckpt.make_block_wrapper("full", every=0)


def test_full_and_selective_checkpointing() -> None:
    model, idx, targets = _gpt(n_layers=4)
    saved, extra, grads = {}, {}, {}
    for policy in ckpt.POLICIES:
        model.block_wrapper = ckpt.make_block_wrapper(policy)
        saved[policy] = saved_activation_bytes(lambda: _loss(model, idx, targets))

        def step() -> None:
            _loss(model, idx, targets).backward()

        extra[policy] = ckpt.count_flops(step)
        model.zero_grad(set_to_none=True)
        seed_everything(1)
        step()
        grads[policy] = torch.cat([p.grad.flatten() for p in model.parameters()])
        model.zero_grad(set_to_none=True)
    model.block_wrapper = None
    assert saved["full"] < saved["selective"] < saved["none"]
    assert extra["none"] < extra["selective"] < extra["full"]
    torch.testing.assert_close(grads["full"], grads["none"])
    torch.testing.assert_close(grads["selective"], grads["none"])


def test_every_other_block_lands_between() -> None:
    model, idx, targets = _gpt(n_layers=4)
    saved = {}
    for every in (1, 2):
        model.block_wrapper = ckpt.make_block_wrapper("full", every=every)
        saved[every] = saved_activation_bytes(lambda: _loss(model, idx, targets))
    model.block_wrapper = None
    plain = saved_activation_bytes(lambda: _loss(model, idx, targets))
    assert saved[1] < saved[2] < plain


def test_inference_saves_nothing() -> None:
    model, idx, _ = _gpt(n_layers=2)
    for policy in ("none", "full"):
        model.block_wrapper = ckpt.make_block_wrapper(policy)
        with torch.no_grad():
            assert new_live_bytes(lambda: model(idx)) == 0


def test_chain_arguments() -> None:
    with pytest.raises(ValueError, match="kind"):
        ckpt.make_chain(4, 8, "conv")
    with pytest.raises(ValueError, match="positive"):
        ckpt.make_chain(0, 8)
    chain = ckpt.make_chain(4, 8)
    with pytest.raises(ValueError, match="segments"):
        ckpt.segment_sweep(chain, torch.randn(2, 8), [0])
    with pytest.raises(ValueError, match="segments"):
        ckpt.segment_sweep(chain, torch.randn(2, 8), [5])
    with pytest.raises(ValueError, match="segments"):
        ckpt.segment_cost(1, 1, 4, 5)
    with pytest.raises(ValueError):
        ckpt.divisors(0)


def test_sqrt_n_optimum_for_equal_layers() -> None:
    n = 16
    chain = ckpt.make_chain(n, 16, "linear")
    x = torch.randn(8, 16)
    a, b = ckpt.chain_layer_costs(chain, x)
    assert a == b
    ks = ckpt.divisors(n)
    assert ks == [1, 2, 4, 8, 16]
    points = ckpt.segment_sweep(chain, x, ks)
    best = min(points, key=lambda p: p.saved_bytes)
    assert best.segments == 4
    # checkpoint_sequential with k equal segments keeps k - 1 boundaries + the last segment
    for p in points:
        assert p.saved_bytes == (p.segments - 1) * b + a * n // p.segments
        assert p.peak_bytes >= p.saved_bytes


def test_mlp_chain_prefers_more_segments() -> None:
    chain = ckpt.make_chain(16, 16, "mlp")
    x = torch.randn(8, 16)
    a, b = ckpt.chain_layer_costs(chain, x)
    assert 5 < a / b < 7
    points = ckpt.segment_sweep(chain, x, ckpt.divisors(16))
    assert min(points, key=lambda p: p.saved_bytes).segments == 8


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


@pytest.mark.parametrize(
    "kwargs, match",
    [({"n_layers": 0}, "n_layers"), ({"every": 0}, "every"), ({"every": 9}, "every"),
     ({"micro_batch": 0}, "micro_batch"), ({"policy": "half"}, "policy")],
)
def test_explore_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ckpt.explore(**{"n_layers": 8, "scale": "tiny", **kwargs})


def test_explore_widget_function() -> None:
    result = ckpt.explore(4, 1, 2, "full", scale="tiny", repeats=1)
    assert result.memory.breakdown["activations"] < result.baseline.breakdown["activations"]
    assert result.memory.peak_bytes < result.baseline.peak_bytes
    assert 0 < result.extra_flops <= 1.0
    assert result.memory.method == "cpu-tracker"
    none = ckpt.explore(4, 1, 2, "none", scale="tiny", repeats=1)
    assert none.extra_flops == 0 and none.memory == none.baseline
    fig = ckpt.plot_explore(result)
    assert "extra FLOPs" in fig.axes[0].get_xlabel()
    plt.close(fig)


@pytest.mark.cuda
def test_cuda_block_matches_formula_with_bool_masks() -> None:
    assert ckpt.dropout_mask_bytes("cuda") == 1.0  # CUDA keeps a bool mask
    block = _block(dropout=0.1).cuda()
    x = torch.randn(B, S, H, device="cuda")
    measured = saved_activation_bytes(lambda: block(x + 0))
    formula = ckpt.korthikanti_terms(s=S, b=B, h=H, a=A, act_bytes=4, mask_bytes=1)
    assert measured == pytest.approx(sum(formula.values()), rel=0.10)


@pytest.mark.cuda
def test_cuda_explore_checkpointing_lowers_allocator_peak() -> None:
    result = ckpt.explore(4, 1, 2, "full", scale="tiny", device="cuda", repeats=1)
    assert result.memory.method == "cuda-allocator"
    assert result.memory.peak_bytes < result.baseline.peak_bytes
