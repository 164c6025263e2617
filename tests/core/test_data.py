"""helpers.core.data (core): synthetic batches, seeded by private generators, with checked arguments."""

from __future__ import annotations

import pytest
import torch

from helpers.core.data import image_batch, regression_batch, token_batch


def test_batches_have_the_promised_shapes() -> None:
    x, y = regression_batch(5, 8, 2)
    assert x.shape == (5, 8) and y.shape == (5, 2)
    idx, targets = token_batch(3, 6, 10)
    assert idx.shape == targets.shape == (3, 6) and idx.dtype == torch.int64
    assert torch.equal(idx[:, 1:], targets[:, :-1])  # targets are the inputs shifted by one
    assert int(idx.max()) < 10
    images, labels = image_batch(4, channels=2, size=5, num_classes=3)
    assert images.shape == (4, 2, 5, 5) and labels.shape == (4,) and int(labels.max()) < 3


def test_same_seed_same_data_and_the_global_rng_is_left_alone() -> None:
    state = torch.random.get_rng_state()
    for make in (lambda s: regression_batch(4, 3, seed=s), lambda s: token_batch(4, 5, 7, seed=s),
                 lambda s: image_batch(4, seed=s)):
        a, b, c = make(0), make(0), make(1)
        assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
        assert not all(torch.equal(u, v) for u, v in zip(a, c, strict=True))
    assert torch.equal(torch.random.get_rng_state(), state)


@pytest.mark.parametrize(
    "build, error, match",
    [
        (lambda: regression_batch(True, 4), TypeError, "n must be a positive int, got bool True"),
        (lambda: regression_batch(4, 0), ValueError, "d_in must be a positive int, got 0"),
        (lambda: token_batch(0, 4, 8), ValueError, "n must be a positive int"),
        (lambda: token_batch(2, 4, 8.0), TypeError, "vocab_size must be a positive int"),
        (lambda: image_batch(2, size=0), ValueError, "size must be a positive int"),
        (lambda: image_batch(2, seed=-1), ValueError, "seed must be a non-negative int, got -1"),
        (lambda: token_batch(2, 4, 8, seed=True), TypeError, "seed must be a non-negative int"),
    ],
)
def test_bad_arguments_are_named(build, error: type, match: str) -> None:  # noqa: ANN001
    with pytest.raises(error, match=match):
        build()
