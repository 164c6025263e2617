"""Synthetic data, generated in-process: nothing is downloaded (core, lessons 01-08).

Each function takes a `seed` and builds its tensors with a private
`torch.Generator`, so the data does not depend on (or disturb) the global RNG.

- `regression_batch`: inputs and targets of a noisy linear map (ResidualMLP lessons).
- `token_batch`: token sequences and their next-token targets (GPT lessons).
- `image_batch`: small labelled images (ConvNet lessons).
"""

from __future__ import annotations

import torch

from helpers.validate import non_negative_int, positive_int

__all__ = ["image_batch", "regression_batch", "token_batch"]


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(non_negative_int("seed", seed))


def regression_batch(
    n: int, d_in: int, d_out: int = 1, *, seed: int = 0, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """`n` inputs of size `d_in` and targets from a fixed random linear map plus noise.

    Args:
        n, d_in, d_out: examples, input size and target size (each >= 1).
        seed: seeds a private generator; the global RNG is left alone.
        device: where the tensors go.

    Returns:
        (inputs (n, d_in), targets (n, d_out)).
    """
    for name, value in (("n", n), ("d_in", d_in), ("d_out", d_out)):
        positive_int(name, value)
    g = _generator(seed)
    x = torch.randn(n, d_in, generator=g)
    w = torch.randn(d_in, d_out, generator=g) / d_in**0.5
    y = x @ w + 0.1 * torch.randn(n, d_out, generator=g)
    return x.to(device), y.to(device)


def token_batch(
    n: int, seq_len: int, vocab_size: int, *, seed: int = 0, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """`n` token sequences and their next-token targets (inputs shifted by one).

    The sequences follow a simple learnable rule (each token is the previous
    one plus a per-sequence step, modulo the vocabulary), so a model can fit them.

    Args:
        n, seq_len, vocab_size: sequences, their length and the vocabulary (each >= 1).
        seed: seeds a private generator; the global RNG is left alone.
        device: where the tensors go.

    Returns:
        (inputs, targets), both (n, seq_len) int64 token ids.
    """
    for name, value in (("n", n), ("seq_len", seq_len), ("vocab_size", vocab_size)):
        positive_int(name, value)
    g = _generator(seed)
    start = torch.randint(0, vocab_size, (n, 1), generator=g)
    step = torch.randint(1, 4, (n, 1), generator=g)
    seq = (start + step * torch.arange(seq_len + 1)) % vocab_size
    return seq[:, :-1].contiguous().to(device), seq[:, 1:].contiguous().to(device)


def image_batch(
    n: int, *, channels: int = 3, size: int = 16, num_classes: int = 10, seed: int = 0,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """`n` small images whose class sets the mean of one channel band, plus labels.

    Args:
        n, channels, size, num_classes: images, channels, side in pixels and classes (each >= 1).
        seed: seeds a private generator; the global RNG is left alone.
        device: where the tensors go.

    Returns:
        (images (n, channels, size, size), labels (n,)).
    """
    for name, value in (("n", n), ("channels", channels), ("size", size), ("num_classes", num_classes)):
        positive_int(name, value)
    g = _generator(seed)
    labels = torch.randint(0, num_classes, (n,), generator=g)
    images = torch.randn(n, channels, size, size, generator=g)
    images += (labels.float() / num_classes).view(n, 1, 1, 1)
    return images.to(device), labels.to(device)
