"""helpers.models and helpers.data: shapes, determinism, argument checks."""

from __future__ import annotations

import pytest
import torch

from helpers.data import image_batch, regression_batch, token_batch
from helpers.models import GPT, ConvNet, GPTConfig, ResidualMLP, param_bytes


def test_models_run_and_are_deterministic() -> None:
    torch.manual_seed(0)
    a = GPT(GPTConfig(n_layers=2, dropout=0.0))
    torch.manual_seed(0)
    b = GPT(GPTConfig(n_layers=2, dropout=0.0))
    idx, _ = token_batch(3, 64, 128)
    assert a(idx).shape == (3, 64, 128)
    assert torch.equal(a(idx), b(idx))
    x, _ = regression_batch(5, 8, 2)
    assert ResidualMLP(8, 16, 3, 2)(x).shape == (5, 2)
    imgs, labels = image_batch(4)
    for norm in ("batch", "group", "layer", "none"):
        assert ConvNet(norm=norm)(imgs).shape == (4, 10)
    assert labels.dtype == torch.int64


def test_fused_attention_matches_written_out_attention() -> None:
    torch.manual_seed(0)
    plain = GPT(GPTConfig(n_layers=2, dropout=0.0)).eval()
    fused = GPT(GPTConfig(n_layers=2, dropout=0.0, fused_attention=True)).eval()
    fused.load_state_dict(plain.state_dict())
    idx, _ = token_batch(2, 64, 128)
    torch.testing.assert_close(plain(idx), fused(idx), rtol=1e-4, atol=1e-5)


def test_block_wrapper_is_called_per_block() -> None:
    model = ResidualMLP(4, 8, 3, 1)
    seen = []
    model.block_wrapper = lambda block, x: (seen.append(block), block(x))[1]
    model(torch.randn(2, 4))
    assert seen == list(model.blocks)


def test_param_bytes_counts_each_storage_once() -> None:
    model = ResidualMLP(4, 8, 2, 1)
    assert param_bytes(model) == 4 * sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: GPTConfig(d_model=30, n_heads=4), "divisible"),
        (lambda: GPTConfig(dropout=1.0), "dropout"),
        (lambda: GPTConfig(n_layers=0), "n_layers"),
        (lambda: ConvNet(norm="instance"), "norm='instance'"),
        (lambda: ResidualMLP(4, 0, 2, 1), "width"),
        (lambda: token_batch(0, 4, 8), "n must be"),
    ],
)
def test_bad_arguments_are_named(build, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build()


def test_gpt_rejects_too_long_sequences() -> None:
    model = GPT(GPTConfig(seq_len=8, n_layers=1))
    with pytest.raises(ValueError, match="seq <= 8"):
        model(torch.zeros(1, 9, dtype=torch.long))
