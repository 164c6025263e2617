"""helpers.core.training (core): the one LM loss and the optimizer factory."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers.core.training import IGNORE_INDEX, OPTIMIZERS, lm_loss, make_optimizer, warmup_cosine


def test_lm_loss_is_cross_entropy_over_valid_tokens() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 7, generator=g)
    targets = torch.randint(0, 7, (2, 5), generator=g)
    expected = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    torch.testing.assert_close(lm_loss(logits, targets), expected)
    padded = targets.clone()
    padded[:, -2:] = IGNORE_INDEX
    valid = padded != IGNORE_INDEX
    torch.testing.assert_close(lm_loss(logits, padded), F.cross_entropy(logits[valid], targets[valid]))
    torch.testing.assert_close(lm_loss(logits, padded, reduction="sum"),
                               F.cross_entropy(logits[valid], targets[valid], reduction="sum"))
    assert lm_loss(logits, targets, reduction="none").shape == (10,)


def test_lm_loss_checks_its_arguments() -> None:
    logits = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match=r"logits must be \(batch, seq, vocab\)"):
        lm_loss(logits, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="reduction='avg' is not allowed"):
        lm_loss(logits, torch.zeros(2, 3, dtype=torch.long), reduction="avg")
    with pytest.raises(TypeError, match="targets must be a torch.Tensor"):
        lm_loss(logits, [[0, 1, 2]])  # type: ignore[arg-type]


def test_make_optimizer() -> None:
    model = torch.nn.Linear(2, 2)
    assert OPTIMIZERS == ("sgd", "sgd-momentum", "adam", "adamw")
    sgd, adam = make_optimizer("sgd", model), make_optimizer("adam", model)
    assert isinstance(sgd, torch.optim.SGD) and sgd.defaults["momentum"] == 0
    assert isinstance(adam, torch.optim.Adam)
    assert sgd.defaults["lr"] == adam.defaults["lr"] == 1e-3
    with pytest.raises(ValueError, match="optimizer='lion'"):
        make_optimizer("lion", model)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        make_optimizer("sgd", [torch.zeros(1)])  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["sgd", "sgd-momentum", "adam", "adamw"])
def test_state_per_param_matches_what_the_optimizer_keeps(name: str) -> None:
    from helpers.core.training import STATE_PER_PARAM

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    opt = make_optimizer(name, model)
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    n_params = sum(p.numel() for p in model.parameters())
    state = sum(t.numel() for s in opt.state.values() for t in s.values()
                if isinstance(t, torch.Tensor) and t.dim() > 0)
    assert state == STATE_PER_PARAM[name] * n_params


def test_linear_warmup() -> None:
    w = warmup_cosine(4)
    assert [w(u) for u in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
