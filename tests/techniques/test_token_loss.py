"""helpers.techniques.token_loss (lesson 05): variable-length data, padding, micro-batches, the
group-normalised loss and its errors.

The loss is held against `F.cross_entropy` over the whole padded batch; the claims built on it
(the naive loop against the fix) are in `tests/techniques/test_tokens.py`.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from support.fixtures import token_samples

from helpers.core.training import IGNORE_INDEX
from helpers.techniques.token_loss import (
    count_valid_tokens,
    group_normalised_loss,
    micro_batch_loss,
    pad_sequences,
    sequence_lengths,
    split_micro_batches,
)


# -- data --------------------------------------------------------------------------------
def test_lengths_follow_the_spread() -> None:
    assert sequence_lengths(50, 20, 0.0) == [20] * 50
    wide = sequence_lengths(200, 20, 1.0, seed=1)
    assert min(wide) >= 2 and max(wide) <= 20 and len(set(wide)) > 10
    half = sequence_lengths(200, 20, 0.5, seed=1)
    assert min(half) >= 10


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"n": 0}, "n must"), ({"max_len": 1}, "max_len"), ({"spread": 1.5}, "spread")],
)
def test_lengths_reject_bad_arguments(kwargs: dict, match: str) -> None:
    args = {"n": 4, "max_len": 8, "spread": 0.5} | kwargs
    with pytest.raises(ValueError, match=match):
        sequence_lengths(args["n"], args["max_len"], args["spread"])


def test_the_shortest_sequences_have_two_tokens() -> None:
    assert sequence_lengths(5, 2, 1.0) == [2] * 5  # max_len 2 is allowed: one input, one label
    with pytest.raises(ValueError, match="max_len"):
        sequence_lengths(5, 1, 1.0)


def test_padding_marks_labels_and_pads_to_the_longest() -> None:
    samples = token_samples()
    mb = pad_sequences(samples[:3])
    longest = max(len(x) for x, _ in samples[:3])
    assert mb.input_ids.shape == mb.labels.shape == (3, longest)
    assert mb.labels.dtype == torch.long
    assert mb.n_tokens == sum(len(x) for x, _ in samples[:3])
    for row, (x, y) in enumerate(samples[:3]):
        assert torch.equal(mb.labels[row, : len(y)], y)
        assert (mb.labels[row, len(y) :] == IGNORE_INDEX).all()
        assert torch.equal(mb.input_ids[row, : len(x)], x)


# issue 16: a survivor of the mutation run
def test_padding_uses_token_0_by_default() -> None:
    a = (torch.tensor([5, 6, 7]), torch.tensor([6, 7, 8]))
    b = (torch.tensor([9]), torch.tensor([3]))
    mb = pad_sequences([a, b])
    assert mb.input_ids.tolist() == [[5, 6, 7], [9, 0, 0]]
    assert mb.labels.tolist() == [[6, 7, 8], [3, IGNORE_INDEX, IGNORE_INDEX]]
    assert pad_sequences([a, b], pad_id=4).input_ids.tolist() == [[5, 6, 7], [9, 4, 4]]


def test_split_micro_batches() -> None:
    samples = token_samples(10)
    mbs = split_micro_batches(samples, 4)
    assert [mb.labels.shape[0] for mb in mbs] == [4, 4, 2]
    assert sum(mb.n_tokens for mb in mbs) == sum(len(x) for x, _ in samples)
    for bad in (0, 11):
        with pytest.raises(ValueError, match="micro_batch"):
            split_micro_batches(samples, bad)
    with pytest.raises(ValueError, match="empty"):
        pad_sequences([])


# -- the group-normalised loss -----------------------------------------------------------
def _group(model: torch.nn.Module):
    mbs = split_micro_batches(token_samples(), 2)
    return [model(mb.input_ids) for mb in mbs], [mb.labels for mb in mbs]


def test_group_loss_equals_the_full_batch_token_mean(tiny_token_lm: torch.nn.Module) -> None:
    samples = token_samples()
    full = pad_sequences(samples)
    logits = tiny_token_lm(full.input_ids)
    reference = F.cross_entropy(logits.flatten(0, 1), full.labels.flatten(),
                                ignore_index=IGNORE_INDEX)
    logits_list, labels_list = _group(tiny_token_lm)
    loss = group_normalised_loss(logits_list, labels_list)
    assert loss.item() == pytest.approx(reference.item(), rel=1e-6)
    assert count_valid_tokens(labels_list) == sum(len(x) for x, _ in samples)


def test_group_loss_rejects_a_group_without_valid_tokens(tiny_token_lm: torch.nn.Module) -> None:
    logits_list, labels_list = _group(tiny_token_lm)
    empty = [torch.full_like(labels, IGNORE_INDEX) for labels in labels_list]
    with pytest.raises(ValueError, match="0 valid tokens"):
        group_normalised_loss(logits_list, empty)
    with pytest.raises(ValueError, match="empty"):
        group_normalised_loss([], [])


def test_group_loss_rejects_mismatched_shapes(tiny_token_lm: torch.nn.Module) -> None:
    logits_list, labels_list = _group(tiny_token_lm)
    with pytest.raises(ValueError, match="shape"):
        group_normalised_loss(logits_list, [labels[:, :-1] for labels in labels_list])
    with pytest.raises(ValueError, match="shape"):
        group_normalised_loss([lg[..., 0] for lg in logits_list], labels_list)
    with pytest.raises(ValueError, match="one of each"):
        group_normalised_loss(logits_list, labels_list[:-1])


@pytest.mark.parametrize("dtype", [torch.int32, torch.float32, torch.bool])
def test_group_loss_rejects_labels_of_the_wrong_dtype(
    tiny_token_lm: torch.nn.Module, dtype: torch.dtype
) -> None:
    logits_list, labels_list = _group(tiny_token_lm)
    with pytest.raises(ValueError, match="int64"):
        group_normalised_loss(logits_list, [labels.to(dtype) for labels in labels_list])
    with pytest.raises(ValueError, match="int64"):
        count_valid_tokens([labels.to(dtype) for labels in labels_list])


def test_group_loss_rejects_lists_of_different_lengths(tiny_token_lm: torch.nn.Module) -> None:
    mb = pad_sequences(token_samples(2))
    logits = tiny_token_lm(mb.input_ids)
    with pytest.raises(ValueError):
        group_normalised_loss([logits], [mb.labels, mb.labels])


def test_micro_batch_loss_rejects_a_bad_count(tiny_token_lm: torch.nn.Module) -> None:
    logits_list, labels_list = _group(tiny_token_lm)
    for bad in (0, -3, 2.5):
        with pytest.raises(ValueError, match="num_items_in_batch"):
            micro_batch_loss(logits_list[0], labels_list[0], bad)
