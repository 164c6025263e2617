"""Token-weighted losses under gradient accumulation: data, losses and measured steps (lesson 05).

A language model's loss is a mean over *tokens*, not over sequences. When the
sequences of a batch have different lengths and each micro-batch is padded on
its own, micro-batches hold different numbers of valid (non-padding) tokens.
Dividing each micro-batch's token mean by K then weights a token of a sparse
micro-batch more than a token of a dense one, and the accumulated gradient is
no longer the full batch's gradient. The fix counts the valid tokens of the
whole group first and divides the *summed* token loss of every micro-batch by
that one count (what Hugging Face Transformers passes as `num_items_in_batch`).

- Data: `variable_length_sequences`, `pad_sequences`, `split_micro_batches`.
- Losses: `count_valid_tokens`, `micro_batch_loss`, `group_normalised_loss`.
- The model: `tiny_lm` (from `tiny_lm_config`) and its warm-up, `pretrain`.
- Measured steps: `full_batch_step`, `naive_step`, `fixed_step`.
- Reports: `token_weighting_report` (one K, spread), `accumulation_report` (one B, K, spread).

The lesson's sizes, figures, widget, exercise checkers and per-lesson protocol are in
`helpers.lessons.lesson05`. Labels use `IGNORE_INDEX` (-100, PyTorch's and Hugging Face's
convention) at padding positions; `helpers.training.lm_loss` skips them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from helpers.accumulation import GradDiff, clear_grads, cleared_grads, compare_grads, flat_grad
from helpers.data import token_batch
from helpers.models import GPT, GPTConfig
from helpers.training import IGNORE_INDEX, lm_loss
from helpers.validate import int_at_least, int_in_range, number_in_range, positive_int, tensor_arg

__all__ = [
    "IGNORE_INDEX",
    "MicroBatch",
    "Sample",
    "StepResult",
    "TokenReport",
    "accumulation_report",
    "count_valid_tokens",
    "fixed_step",
    "full_batch_step",
    "group_normalised_loss",
    "micro_batch_loss",
    "naive_step",
    "pad_sequences",
    "pretrain",
    "sequence_lengths",
    "split_micro_batches",
    "tiny_lm",
    "tiny_lm_config",
    "token_weighting_report",
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

    The tokens follow `helpers.data.token_batch`'s rule (each token is the
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


# -- measured steps --------------------------------------------------------------------
@dataclass(frozen=True)
class StepResult:
    """A gradient (flat, detached) and the loss value a training loop would log."""

    grad: torch.Tensor
    loss: float


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def full_batch_step(model: nn.Module, samples: Sequence[Sample]) -> StepResult:
    """The reference: all samples padded together, one token-mean loss, one backward.

    Args:
        model: the model (gradients cleared before and after).
        samples: (input ids, labels) pairs.

    Returns:
        A `StepResult`: the flat gradient and the loss.
    """
    with cleared_grads(model):
        batch = pad_sequences(samples, device=_device(model))
        loss = lm_loss(model(batch.input_ids), batch.labels)
        loss.backward()
        return StepResult(flat_grad(model), loss.item())


def naive_step(
    model: nn.Module, micro_batches: Sequence[MicroBatch], *, divide_by: int | None = None
) -> StepResult:
    """The naive loop: each micro-batch's token mean divided by K, one backward each.

    Args:
        model: the model (gradients cleared before and after).
        micro_batches: the group.
        divide_by: K, the nominal group size (default: the number of micro-batches).

    Returns:
        A `StepResult`: the flat gradient, and the logged loss (the sum of the
        back-propagated values).

    Raises:
        ValueError: for no micro-batch or `divide_by < 1`.
    """
    k = len(micro_batches) if divide_by is None else divide_by
    if k < 1 or not micro_batches:
        raise ValueError(f"need at least one micro-batch and divide_by >= 1, got {k}")
    with cleared_grads(model):
        logged = 0.0
        for mb in micro_batches:
            loss = lm_loss(model(mb.input_ids), mb.labels) / k
            loss.backward()
            logged += loss.item()
        return StepResult(flat_grad(model), logged)


def fixed_step(
    model: nn.Module,
    micro_batches: Sequence[MicroBatch],
    *,
    num_items_in_batch: int | None = None,
    scale: float = 1.0,
) -> StepResult:
    """The fix: summed token loss / the group's valid-token count, one backward each.

    Args:
        model: the model (gradients cleared before and after).
        micro_batches: the group.
        num_items_in_batch: the token count to divide by; defaults to the valid tokens of
            `micro_batches`. Pass the count summed over all workers to simulate data parallelism.
        scale: multiplies each back-propagated loss; `scale=W` undoes the all-reduce's division by W.

    Returns:
        A `StepResult`: the flat gradient, and the logged loss (the sum of the unscaled
        back-propagated values).
    """
    n = num_items_in_batch
    if n is None:
        n = count_valid_tokens([mb.labels for mb in micro_batches])
    with cleared_grads(model):
        logged = 0.0
        for mb in micro_batches:
            loss = micro_batch_loss(model(mb.input_ids), mb.labels, n)
            (loss * scale).backward()
            logged += loss.item()
        return StepResult(flat_grad(model), logged)


def tiny_lm(
    *, vocab_size: int, max_len: int, d_model: int, n_layers: int, seed: int = 0
) -> GPT:
    """A small GPT (dropout 0, so repeated forwards agree), built from `seed`.

    The weights depend only on `seed`; the global random state is left as it was.

    Args:
        vocab_size, max_len, d_model, n_layers: its sizes (see `tiny_lm_config`).
        seed: the seed of its weights.

    Returns:
        The `GPT`.
    """
    cfg = tiny_lm_config(vocab_size=vocab_size, max_len=max_len, d_model=d_model, n_layers=n_layers)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GPT(cfg)


def tiny_lm_config(*, vocab_size: int, max_len: int, d_model: int, n_layers: int) -> GPTConfig:
    """The lesson's GPT configuration: `d_model // 16` heads, dropout 0, sequences of `max_len`."""
    return GPTConfig(vocab_size=vocab_size, seq_len=max_len, d_model=d_model,
                     n_heads=max(1, d_model // 16), n_layers=n_layers, dropout=0.0)


def pretrain(
    model: GPT, *, steps: int, n_seqs: int, spread: float = 0.0, lr: float = 1e-2, seed: int = 0
) -> list[float]:
    """Train `model` briefly with Adam on fresh batches.

    After a few dozen steps the first token of a sequence stays hard (its step
    is unknown) while later ones become easy, so short sequences have a higher
    per-token loss, as in real text. Gradients are cleared afterwards.

    Args:
        model: the GPT, trained in place.
        steps: optimizer steps.
        n_seqs: sequences per batch.
        spread: how much the lengths vary (0: full length).
        lr: Adam's learning rate.
        seed: seeds the batches.

    Returns:
        The loss of each step.
    """
    cfg = model.cfg
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        samples = variable_length_sequences(n_seqs, cfg.seq_len, cfg.vocab_size, spread=spread,
                                            seed=10_000 + seed * steps + step)
        batch = pad_sequences(samples, device=_device(model))
        loss = lm_loss(model(batch.input_ids), batch.labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    clear_grads(model)
    return losses


# -- reports ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenReport:
    """Naive and fixed accumulation against the full batch, for one (B, K, spread)."""

    k: int
    spread: float
    tokens_per_micro_batch: list[int]
    naive: GradDiff
    fixed: GradDiff
    full_loss: float
    naive_loss: float
    fixed_loss: float
    micro_batch: int

    @property
    def effective_batch(self) -> int:
        """Sequences per update: B x K."""
        return self.micro_batch * self.k

    @property
    def loss_gap(self) -> float:
        """Naive logged loss minus the full batch's loss."""
        return self.naive_loss - self.full_loss


def token_weighting_report(
    model: GPT, k: int, spread: float, *, n_seqs: int, seed: int = 0
) -> TokenReport:
    """Measure naive and fixed K-step accumulation on `n_seqs` fresh sequences.

    Pure: the data come from `seed`, the model's weights are not changed and
    its gradients are cleared.

    Args:
        model: the GPT.
        k: micro-batches per group; it must divide `n_seqs`.
        spread: how much the sequence lengths vary, in [0, 1].
        n_seqs: sequences in the group.
        seed: seeds the data.

    Returns:
        The `TokenReport`: both loops compared with the full batch, and the tokens per micro-batch.

    Raises:
        ValueError: if `k` is not a positive int that divides `n_seqs`.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1 or n_seqs % k:
        raise ValueError(f"k must be a positive int that divides n_seqs={n_seqs}, got {k!r}")
    cfg = model.cfg
    samples = variable_length_sequences(n_seqs, cfg.seq_len, cfg.vocab_size, spread=spread,
                                        seed=seed)
    mbs = split_micro_batches(samples, n_seqs // k, device=_device(model))
    full = full_batch_step(model, samples)
    naive = naive_step(model, mbs)
    fixed = fixed_step(model, mbs)
    return TokenReport(
        k=k, spread=spread, tokens_per_micro_batch=[mb.n_tokens for mb in mbs],
        naive=compare_grads(full.grad, naive.grad), fixed=compare_grads(full.grad, fixed.grad),
        full_loss=full.loss, naive_loss=naive.loss, fixed_loss=fixed.loss,
        micro_batch=n_seqs // k,
    )


def accumulation_report(
    model: GPT, micro_batch: int, k: int, spread: float, *, seed: int = 0
) -> TokenReport:
    """`token_weighting_report` for K micro-batches of `micro_batch` sequences (B x K in all).

    Args:
        model: the GPT (its weights are not changed).
        micro_batch, k: B and K.
        spread: how much the sequence lengths vary, in [0, 1].
        seed: seeds the data.

    Returns:
        The `TokenReport`.
    """
    positive_int("micro_batch", micro_batch)
    positive_int("k", k)
    number_in_range("spread", spread, 0.0, 1.0)
    return token_weighting_report(model, k, spread, n_seqs=micro_batch * k, seed=seed)
