"""helpers.models.gpt (core): shapes, determinism, argument checks, the explainer-sized GPT."""

from __future__ import annotations

import pytest
import torch

from helpers.core.data import image_batch, regression_batch, token_batch
from helpers.core.device import SCALES
from helpers.models.gpt import GPT, GPTConfig, explainer_config, explainer_model, seeded_gpt
from helpers.models.nets import ConvNet, ResidualMLP


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


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: GPTConfig(d_model=30, n_heads=4), "divisible"),
        (lambda: GPTConfig(dropout=1.0), "dropout"),
        (lambda: GPTConfig(n_layers=0), "n_layers"),
        (lambda: ConvNet(norm="instance"), "norm='instance'"),
        (lambda: ResidualMLP(4, 0, 2, 1), "width"),
        (lambda: GPTConfig(d_model=True), "d_model must be a positive int"),
        (lambda: GPTConfig(dropout="0.1"), "dropout must be a number"),
        (lambda: explainer_config("huge"), "scale='huge'"),
    ],
)
def test_bad_arguments_are_named(build, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build()


def test_gpt_rejects_too_long_sequences() -> None:
    model = GPT(GPTConfig(seq_len=8, n_layers=1))
    with pytest.raises(ValueError, match="seq <= 8"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_explainer_model_is_seeded_and_leaves_the_global_rng_alone() -> None:
    state = torch.random.get_rng_state()
    model = explainer_model("tiny", "cpu")
    assert torch.equal(torch.random.get_rng_state(), state)
    torch.manual_seed(0)  # what explainer_model did before it forked the RNG: the same weights
    reference = GPT(explainer_config("tiny"))
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(a, b)
    other = explainer_model("tiny", "cpu", seed=1)
    assert not torch.equal(next(model.parameters()), next(other.parameters()))
    assert model.training and model.cfg == explainer_config("tiny")
    with pytest.raises(TypeError, match="seed"):
        explainer_model("tiny", "cpu", seed=True)  # type: ignore[arg-type]


def test_explainer_config_at_every_scale() -> None:
    for scale in SCALES:
        cfg = explainer_config(scale)
        assert cfg.dropout == 0.0 and not cfg.fused_attention
    assert explainer_config("medium") != explainer_config("small")


def test_seeded_gpt_is_repeatable() -> None:
    cfg = GPTConfig(vocab_size=16, seq_len=8, d_model=8, n_heads=2, n_layers=1, dropout=0.0)
    a, b = seeded_gpt(cfg, "cpu", seed=3), seeded_gpt(cfg, "cpu", seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    with pytest.raises(TypeError, match="cfg must be a helpers.models.gpt.GPTConfig"):
        seeded_gpt({"d_model": 8}, "cpu")  # type: ignore[arg-type]
