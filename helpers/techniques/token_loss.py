"""The token-weighted loss and the padded variable-length batches it is computed on (lesson 05).

- Data: `sequence_lengths`, `variable_length_sequences`, `MicroBatch`, `pad_sequences`,
  `split_micro_batches`.
- Losses: `count_valid_tokens`, `micro_batch_loss`, `group_normalised_loss`.

Labels use `IGNORE_INDEX` (-100, PyTorch's and Hugging Face's convention) at padding
positions. The measured steps and reports built on these are in `helpers.techniques.tokens`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from helpers.core.data import token_batch
from helpers.core.training import IGNORE_INDEX
from helpers.core.validate import int_at_least, int_in_range, number_in_range, positive_int, tensor_arg

__all__ = [
    "MicroBatch",
    "Sample",
    "count_valid_tokens",
    "group_normalised_loss",
    "micro_batch_loss",
    "pad_sequences",
    "sequence_lengths",
    "split_micro_batches",
    "variable_length_sequences",
]

MIN_LEN = 2
Sample = tuple[torch.Tensor, torch.Tensor]  # (input ids, labels), both 1-D int64


# -- data ------------------------------------------------------------------------------
def sequence_lengths(n: int, max_len: int, spread: float, *, seed: int = 0) -> list[int]:
    """`n` lengths drawn uniformly from [lo, max_len], lo = max(2, round(max_len * (1 - spread))).

    `spread=0` gives every sequence `max_len` tokens; `spread=1` gives lengths
    anywhere from 2 to `max_len`.
    """
    positive_int("n", n)
    int_at_least("max_len", max_len, MIN_LEN)
    number_in_range("spread", spread, 0.0, 1.0)
    lo = max(MIN_LEN, round(max_len * (1.0 - spread)))
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, max_len + 1, (n,), generator=g).tolist()


def variable_length_sequences(
    n: int, max_len: int, vocab_size: int, *, spread: float, seed: int = 0
) -> list[Sample]:
    """`n` (input ids, labels) pairs of lengths from `sequence_lengths`, on the CPU.

    The tokens follow `helpers.core.data.token_batch`'s rule (each token is the
    previous one plus a per-sequence step), cut to each sequence's length.

    Args:
        n: sequences.
        max_len: the longest length.
        vocab_size: the vocabulary.
        spread: how much the lengths vary, in [0, 1].
        seed: seeds the tokens and the lengths.

    Returns:
        The (input ids, labels) pairs.
    """
    lengths = sequence_lengths(n, max_len, spread, seed=seed + 1)
    inputs, labels = token_batch(n, max_len, vocab_size, seed=seed)
    return [(inputs[i, :length], labels[i, :length]) for i, length in enumerate(lengths)]


@dataclass(frozen=True)
class MicroBatch:
    """One padded micro-batch: `input_ids` and `labels`, both (batch, longest) int64."""

    input_ids: torch.Tensor
    labels: torch.Tensor

    @property
    def n_tokens(self) -> int:
        """Valid (non-padding) label positions in this micro-batch."""
        return int((self.labels != IGNORE_INDEX).sum())


def pad_sequences(
    samples: Sequence[Sample], *, pad_id: int = 0, device: torch.device | str = "cpu"
) -> MicroBatch:
    """Right-pad `samples` to the longest one among them; padded labels are `IGNORE_INDEX`.

    Right padding with a causal model leaves the logits at valid positions
    unchanged, so padding a micro-batch or the whole batch gives the same
    per-token losses.

    Args:
        samples: (input ids, labels) pairs.
        pad_id: the token id of padding.
        device: where the batch goes.

    Returns:
        The `MicroBatch` (input ids and labels, both (len(samples), longest)).

    Raises:
        ValueError: if `samples` is empty.
    """
    if not samples:
        raise ValueError("samples is empty; give at least one (input ids, labels) pair")
    longest = max(len(x) for x, _ in samples)
    ids = torch.full((len(samples), longest), pad_id, dtype=torch.long)
    labels = torch.full((len(samples), longest), IGNORE_INDEX, dtype=torch.long)
    for row, (x, y) in enumerate(samples):
        ids[row, : len(x)] = x
        labels[row, : len(y)] = y
    return MicroBatch(ids.to(device), labels.to(device))


def split_micro_batches(
    samples: Sequence[Sample], micro_batch: int, *, device: torch.device | str = "cpu"
) -> list[MicroBatch]:
    """Cut `samples` into consecutive micro-batches of `micro_batch`, each padded on its own.

    Args:
        samples: (input ids, labels) pairs.
        micro_batch: sequences per micro-batch (1 to len(samples)); the last may be smaller.
        device: where the batches go.

    Returns:
        The `MicroBatch`es, in order.
    """
    int_in_range("micro_batch", micro_batch, 1, len(samples))  # at most the number of samples
    return [
        pad_sequences(samples[i : i + micro_batch], device=device)
        for i in range(0, len(samples), micro_batch)
    ]


# -- losses ----------------------------------------------------------------------------
def _check_labels(labels: torch.Tensor) -> None:
    tensor_arg("labels", labels)
    if labels.dtype != torch.long:
        raise ValueError(
            f"labels must be int64 (torch.long) class indices with {IGNORE_INDEX} at padding, "
            f"got dtype {labels.dtype}"
        )


def _check_pair(logits: torch.Tensor, labels: torch.Tensor) -> None:
    _check_labels(labels)
    if logits.dim() != labels.dim() + 1 or logits.shape[:-1] != labels.shape:
        raise ValueError(
            f"logits must be labels' shape plus a vocabulary dimension, got logits "
            f"{tuple(logits.shape)} and labels {tuple(labels.shape)}"
        )


def count_valid_tokens(
    labels_list: Sequence[torch.Tensor], *, ignore_index: int = IGNORE_INDEX
) -> int:
    """Valid (label != `ignore_index`) positions over every micro-batch of a group.

    Args:
        labels_list: the group's int64 labels, one tensor per micro-batch.
        ignore_index: the label of a position that does not count.

    Returns:
        The group's valid-token count (`num_items_in_batch`).

    Raises:
        ValueError: for an empty group, labels that are not int64, or a group with no valid
            token at all (its token mean would be 0/0).
    """
    if len(labels_list) == 0:
        raise ValueError("the group is empty; give the labels of at least one micro-batch")
    for labels in labels_list:
        _check_labels(labels)
    total = sum(int((labels != ignore_index).sum()) for labels in labels_list)
    if total == 0:
        raise ValueError(
            f"the group has 0 valid tokens (every label is ignore_index={ignore_index}); "
            "its token-mean loss is undefined, so skip the group instead"
        )
    return total


def micro_batch_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    num_items_in_batch: int,
    *,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """Summed token cross-entropy of one micro-batch divided by the *group's* token count.

    Back-propagating this for every micro-batch of a group accumulates the
    gradient of the group's global token mean.

    Args:
        logits, labels: the micro-batch's (batch, seq, vocab) logits and (batch, seq) labels.
        num_items_in_batch: the group's valid tokens, from `count_valid_tokens` (Hugging
            Face's name for it).
        ignore_index: the label of a position that does not count.

    Returns:
        The loss, a scalar tensor.
    """
    _check_pair(logits, labels)
    positive_int("num_items_in_batch", num_items_in_batch)  # valid tokens in the whole group
    total = F.cross_entropy(
        logits.flatten(0, -2), labels.flatten(), ignore_index=ignore_index, reduction="sum"
    )
    return total / num_items_in_batch


def group_normalised_loss(
    logits_list: Sequence[torch.Tensor],
    labels_list: Sequence[torch.Tensor],
    *,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """The group's loss: every micro-batch's summed token loss over the group's valid tokens.

    Equals the full batch's token-mean cross-entropy, whatever the padding and lengths.

    Args:
        logits_list, labels_list: one (logits, labels) pair per micro-batch.
        ignore_index: the label of a position that does not count.

    Returns:
        The loss, a scalar tensor.

    Raises:
        ValueError: when the lists differ in length or are empty, a pair does not match in
            shape, labels are not int64, or the group has no valid token.
    """
    if len(logits_list) != len(labels_list):
        raise ValueError(
            f"got {len(logits_list)} logits tensors and {len(labels_list)} labels tensors; "
            "give one of each per micro-batch"
        )
    for logits, labels in zip(logits_list, labels_list, strict=True):
        _check_pair(logits, labels)
    n = count_valid_tokens(labels_list, ignore_index=ignore_index)
    losses = [
        micro_batch_loss(lg, lb, n, ignore_index=ignore_index)
        for lg, lb in zip(logits_list, labels_list, strict=True)
    ]
    return torch.stack(losses).sum()
