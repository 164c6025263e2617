"""Synthetic data, generated in-process: nothing is downloaded (core, lessons 01-08).

Each function takes a `seed` and builds its tensors with a private
`torch.Generator`, so the data does not depend on (or disturb) the global RNG.

- `regression_batch`: inputs and targets of a noisy linear map (ResidualMLP lessons).
- `token_batch`: token sequences and their next-token targets (GPT lessons).
- `image_batch`: small labelled images (ConvNet lessons).
- `BatchSpec`: what one batch of a model is (token sequences, or inputs of a shape with classes),
  and how to make it on a device: the planner's and the model builders' common description.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from helpers.core.training import lm_loss
from helpers.core.validate import ArgTypeError, non_negative_int, positive_int

__all__ = ["BatchSpec", "image_batch", "regression_batch", "token_batch"]


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


@dataclass(frozen=True)
class BatchSpec:
    """What one example looks like: token ids for a language model, or a tensor for a classifier.

    Use `BatchSpec.lm(seq_len, vocab_size)` (inputs (b, seq_len) token ids, targets the
    same shape, loss `helpers.core.training.lm_loss`) or `BatchSpec.classifier(input_shape,
    num_classes)` (inputs (b, *input_shape) floats, targets (b,) class ids, cross-entropy).
    """

    kind: str
    seq_len: int = 0
    vocab_size: int = 0
    input_shape: tuple[int, ...] = ()
    num_classes: int = 0

    @classmethod
    def lm(cls, seq_len: int, vocab_size: int) -> BatchSpec:
        """A language-model batch: `seq_len` token ids in, logits over `vocab_size` out."""
        return cls(
            "lm", seq_len=positive_int("seq_len", seq_len), vocab_size=positive_int("vocab_size", vocab_size)
        )

    @classmethod
    def classifier(cls, input_shape: tuple[int, ...], num_classes: int) -> BatchSpec:
        """A classifier batch: inputs of `input_shape` (without the batch dim), `num_classes` logits out."""
        if not isinstance(input_shape, tuple | list) or not input_shape:
            raise ArgTypeError(f"input_shape must be a non-empty tuple of ints, got {input_shape!r}")
        shape = tuple(positive_int("input_shape[i]", d) for d in input_shape)
        return cls("classifier", input_shape=shape, num_classes=positive_int("num_classes", num_classes))

    def batch(self, b: int, device: torch.device | str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) for a micro-batch of `b` examples on `device` (a local generator)."""
        b = positive_int("b", b)
        gen = torch.Generator().manual_seed(seed)
        if self.kind == "lm":
            ids = torch.randint(self.vocab_size, (b, self.seq_len + 1), generator=gen)
            return ids[:, :-1].contiguous().to(device), ids[:, 1:].contiguous().to(device)
        x = torch.randn((b, *self.input_shape), generator=gen)
        return x.to(device), torch.randint(self.num_classes, (b,), generator=gen).to(device)

    def loss(self, outputs: object, targets: torch.Tensor) -> torch.Tensor:
        """The loss of `outputs` (a tensor, a tuple whose first item is one, or an object with `.logits`)."""
        logits = getattr(outputs, "logits", outputs)
        if isinstance(logits, tuple | list):
            logits = logits[0]
        if self.kind == "lm":
            if logits.dtype in (torch.float16, torch.bfloat16):
                logits = logits.float()  # as Transformers' ForCausalLMLoss upcasts them: a copy in fp32
            return lm_loss(logits, targets)
        return F.cross_entropy(logits, targets)

    def describe(self) -> str:
        """E.g. 'sequences of 1024 tokens (vocabulary 50257)'."""
        if self.kind == "lm":
            return f"sequences of {self.seq_len} tokens (vocabulary {self.vocab_size})"
        return f"inputs of shape {self.input_shape}, {self.num_classes} classes"
