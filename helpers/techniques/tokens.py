"""Token-weighted losses under gradient accumulation: data, losses and measured steps (lesson 05).

A language model's loss is a mean over *tokens*, not over sequences. When the
sequences of a batch have different lengths and each micro-batch is padded on
its own, micro-batches hold different numbers of valid (non-padding) tokens.
Dividing each micro-batch's token mean by K then weights a token of a sparse
micro-batch more than a token of a dense one, and the accumulated gradient is
no longer the full batch's gradient. The fix counts the valid tokens of the
whole group first and divides the *summed* token loss of every micro-batch by
that one count (what Hugging Face Transformers passes as `num_items_in_batch`).

- Data (`variable_length_sequences`, `pad_sequences`, `split_micro_batches`) and losses
  (`count_valid_tokens`, `micro_batch_loss`, `group_normalised_loss`): in `helpers.techniques.token_loss`.
- The model: `tiny_lm` (from `tiny_lm_config`) and its warm-up, `pretrain`.
- Measured steps: `full_batch_step`, `naive_step`, `fixed_step`.
- Reports: `token_weighting_report` (one K, spread), `accumulation_report` (one B, K, spread).

The lesson's sizes, figures, widget, exercise checkers and per-lesson protocol are in
`helpers.lessons.lesson05`. Labels use `IGNORE_INDEX` (-100, PyTorch's and Hugging Face's
convention) at padding positions; `helpers.core.training.lm_loss` skips them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from helpers.core.training import clear_grads, cleared_grads, lm_loss
from helpers.core.validate import number_in_range, positive_int
from helpers.models.gpt import GPT, GPTConfig
from helpers.techniques.accumulation import GradDiff, compare_grads, flat_grad
from helpers.techniques.token_loss import (
    MicroBatch,
    Sample,
    count_valid_tokens,
    micro_batch_loss,
    pad_sequences,
    split_micro_batches,
    variable_length_sequences,
)

__all__ = [
    "StepResult", "TokenReport", "accumulation_report", "fixed_step", "full_batch_step", "naive_step",
    "pretrain", "tiny_lm", "tiny_lm_config", "token_weighting_report",
]

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
