"""helpers.techniques.tokens (lesson 05): the key claims, the widget's reports, the lesson's model.

The data and the group-normalised loss (`helpers.techniques.token_loss`) are tested in
`tests/techniques/test_token_loss.py`.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from support.fixtures import L, V, token_samples

from helpers.techniques import tokens
from helpers.techniques.accumulation import compare_grads
from helpers.techniques.token_loss import (
    count_valid_tokens,
    pad_sequences,
    split_micro_batches,
    variable_length_sequences,
)
from helpers.techniques.tokens import (
    accumulation_report,
    fixed_step,
    full_batch_step,
    naive_step,
    pretrain,
    tiny_lm,
    tiny_lm_config,
    token_weighting_report,
)


@pytest.fixture(scope="module")
def model(tiny_token_lm: torch.nn.Module) -> torch.nn.Module:
    return tiny_token_lm


# -- the claims --------------------------------------------------------------------------
def test_naive_is_wrong_and_fixed_is_right_with_variable_lengths(model: torch.nn.Module) -> None:
    samples = token_samples(8, spread=0.8)
    mbs = split_micro_batches(samples, 2)
    assert len({mb.n_tokens for mb in mbs}) > 1
    full = full_batch_step(model, samples)
    naive = compare_grads(full.grad, naive_step(model, mbs).grad)
    fixed = compare_grads(full.grad, fixed_step(model, mbs).grad)
    assert naive.max_rel > 1e-3
    assert fixed.max_rel <= 1e-5
    assert all(p.grad is None for p in model.parameters()), "steps leave no gradients behind"


def test_equal_lengths_make_the_naive_loop_exact(model: torch.nn.Module) -> None:
    samples = token_samples(8, spread=0.0)
    full = full_batch_step(model, samples)
    naive = naive_step(model, split_micro_batches(samples, 2))
    assert compare_grads(full.grad, naive.grad).max_rel <= 1e-5
    assert naive.loss == pytest.approx(full.loss, rel=1e-6)


def test_partial_final_group(model: torch.nn.Module) -> None:
    group = token_samples(4, seed=3)  # the last group: 2 micro-batches where K = 4
    mbs = split_micro_batches(group, 2)
    full = full_batch_step(model, group)
    assert compare_grads(full.grad, fixed_step(model, mbs).grad).max_rel <= 1e-5
    assert compare_grads(full.grad, naive_step(model, mbs, divide_by=4).grad).norm_ratio < 0.75


def test_workers_need_the_global_count_and_a_factor_w(model: torch.nn.Module) -> None:
    samples, w = token_samples(8, seed=5), 4
    shards = [split_micro_batches(samples[2 * i : 2 * i + 2], 1) for i in range(w)]
    counts = [count_valid_tokens([mb.labels for mb in s]) for s in shards]
    full = full_batch_step(model, samples).grad

    def reduced(**kwargs: object) -> torch.Tensor:
        return torch.stack([fixed_step(model, s, **kwargs).grad for s in shards]).mean(0)

    assert len(set(counts)) > 1
    assert compare_grads(full, reduced()).max_rel > 1e-3
    assert compare_grads(full, reduced(num_items_in_batch=sum(counts))).norm_ratio == (
        pytest.approx(1 / w, rel=1e-5)
    )
    right = reduced(num_items_in_batch=sum(counts), scale=float(w))
    assert compare_grads(full, right).max_rel <= 1e-5


# -- the widget's function ---------------------------------------------------------------
def test_report_is_pure_and_shows_the_bug(model: torch.nn.Module) -> None:
    before = [p.detach().clone() for p in model.parameters()]
    r = token_weighting_report(model, 4, 1.0, n_seqs=8, seed=0)
    again = token_weighting_report(model, 4, 1.0, n_seqs=8, seed=0)
    assert r == again
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    assert len(r.tokens_per_micro_batch) == 4
    assert r.naive.max_rel > 1e-3 and r.fixed.max_rel <= 1e-5
    assert r.fixed_loss == pytest.approx(r.full_loss, rel=1e-5)
    assert r.loss_gap == pytest.approx(r.naive_loss - r.full_loss)  # the property, once
    assert token_weighting_report(model, 4, 0.0, n_seqs=8).naive.max_rel <= 1e-5
    assert token_weighting_report(model, 1, 1.0, n_seqs=8).naive.max_rel <= 1e-5


@pytest.mark.parametrize("k", [0, 3, 2.0])
def test_report_rejects_a_k_that_does_not_divide(model: torch.nn.Module, k: object) -> None:
    with pytest.raises(ValueError, match="divides"):
        token_weighting_report(model, k, 0.5, n_seqs=8)  # type: ignore[arg-type]


@pytest.mark.cuda
def test_fix_matches_the_full_batch_on_cuda() -> None:
    gpu = tiny_lm(vocab_size=V, max_len=L, d_model=32, n_layers=2, seed=0).to("cuda")
    samples = token_samples(16, spread=1.0, seed=7)
    mbs = split_micro_batches(samples, 2, device="cuda")
    full = full_batch_step(gpu, samples)
    assert compare_grads(full.grad, fixed_step(gpu, mbs).grad).max_rel <= 1e-5
    assert compare_grads(full.grad, naive_step(gpu, mbs).grad).max_rel > 1e-3


# -- no hidden global state ----------------------------------------------------------------
def test_tiny_lm_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a = tiny_lm(vocab_size=V, max_len=L, d_model=16, n_layers=1, seed=5)
    assert torch.equal(torch.rand(3), expected)
    b = tiny_lm(vocab_size=V, max_len=L, d_model=16, n_layers=1, seed=5)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


# -- the widget's B x K function and the figures ---------------------------------------------
def test_accumulation_report_uses_b_times_k_sequences(model: torch.nn.Module) -> None:
    r = accumulation_report(model, 2, 4, 1.0, seed=0)
    assert (r.micro_batch, r.k, r.effective_batch) == (2, 4, 8)
    assert r == token_weighting_report(model, 4, 1.0, n_seqs=8, seed=0)
    assert accumulation_report(model, 3, 1, 1.0).naive.max_rel <= 1e-5
    for bad in ({"micro_batch": 0}, {"k": -1}, {"spread": 1.5}):
        args = {"micro_batch": 2, "k": 2, "spread": 0.5} | bad
        with pytest.raises(ValueError, match=next(iter(bad))):
            accumulation_report(model, args["micro_batch"], args["k"], args["spread"])
    with pytest.raises(TypeError, match="micro_batch"):
        accumulation_report(model, True, 2, 0.5)  # type: ignore[arg-type]


def test_report_losses_match_a_hand_computed_cross_entropy(model: torch.nn.Module) -> None:
    """The logged losses, computed here with F.cross_entropy on each sequence, not with the helpers.

    Full batch: every valid token's loss over the number of valid tokens. Naive: each
    micro-batch's own token mean, averaged over the K micro-batches.
    """
    samples = variable_length_sequences(8, L, V, spread=1.0, seed=0)  # what the report draws
    with torch.no_grad():
        per_seq = [F.cross_entropy(model(x[None])[0], y, reduction="none") for x, y in samples]
    k, b = 4, 2
    tokens = [sum(len(t) for t in per_seq[i * b:(i + 1) * b]) for i in range(k)]
    sums = [sum(float(t.sum()) for t in per_seq[i * b:(i + 1) * b]) for i in range(k)]
    full = sum(sums) / sum(tokens)
    naive = sum(s / n for s, n in zip(sums, tokens, strict=True)) / k
    r = token_weighting_report(model, k, 1.0, n_seqs=8, seed=0)
    assert r.tokens_per_micro_batch == tokens
    assert len(set(tokens)) > 1 and abs(naive - full) > 1e-3  # the lengths differ enough to matter
    assert r.full_loss == pytest.approx(full, rel=1e-5)
    assert r.fixed_loss == pytest.approx(full, rel=1e-5)
    assert r.naive_loss == pytest.approx(naive, rel=1e-5)
    assert r.loss_gap == pytest.approx(naive - full, rel=1e-4, abs=1e-6)
    assert r.micro_batch == b and r.effective_batch == 8


def test_pretrain_lowers_the_loss_and_leaves_no_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    """With its defaults (spread 0, lr 1e-2): every batch is full length (n_seqs x L valid labels,
    no padding) and the loss falls."""
    batches = []

    def spy(samples, **kwargs):  # noqa: ANN001, ANN003, ANN202
        batches.append(pad_sequences(samples, **kwargs))
        return batches[-1]

    monkeypatch.setattr(tokens, "pad_sequences", spy)
    lm = tiny_lm(vocab_size=V, max_len=L, d_model=16, n_layers=1, seed=0)
    before = [p.detach().clone() for p in lm.parameters()]
    losses = pretrain(lm, steps=30, n_seqs=8)
    assert len(batches) == 30 and all(mb.labels.shape == (8, L) and mb.n_tokens == 8 * L for mb in batches)
    assert len(losses) == 30 and all(isinstance(v, float) for v in losses)
    assert sum(losses[-5:]) / 5 < 0.9 * sum(losses[:5]) / 5  # Adam at lr 1e-2 learns the pattern
    assert any(not torch.equal(a, p) for a, p in zip(before, lm.parameters(), strict=True))
    assert all(p.grad is None for p in lm.parameters())


def test_naive_step_rejects_a_zero_divisor(model: torch.nn.Module) -> None:
    mbs = split_micro_batches(token_samples(4), 2)
    with pytest.raises(ValueError, match="divide_by"):
        naive_step(model, mbs, divide_by=0)
    with pytest.raises(ValueError, match="at least one micro-batch"):
        naive_step(model, [])


def test_accumulation_report_takes_any_spread_in_range(model: torch.nn.Module) -> None:
    for spread in (0.0, 0.5, 1.0):
        r = accumulation_report(model, 2, 2, spread)
        assert r.micro_batch == 2 and r.k == 2 and r.spread == spread
    with pytest.raises(ValueError, match="spread"):
        accumulation_report(model, 2, 2, 1.5)


# -- issue 16: survivors of the mutation run ---------------------------------------------------
@pytest.mark.parametrize(("d_model", "heads"), [(8, 1), (16, 1), (32, 2), (48, 3), (64, 4), (40, 2)])
def test_the_lesson_model_has_one_head_per_16_channels(d_model: int, heads: int) -> None:
    cfg = tiny_lm_config(vocab_size=V, max_len=L, d_model=d_model, n_layers=1)
    assert type(cfg.n_heads) is int and cfg.n_heads == heads
    assert cfg.dropout == 0.0 and cfg.seq_len == L


def test_results_are_frozen(model: torch.nn.Module) -> None:
    r = accumulation_report(model, 2, 2, 1.0)
    step = full_batch_step(model, token_samples(2))
    mb = pad_sequences(token_samples(2))
    for obj, name in ((r, "k"), (step, "loss"), (mb, "labels")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, None)


def test_report_sizes_are_whole_numbers(model: torch.nn.Module) -> None:
    """The widget prints "effective batch B x K = N": B and N are ints, not 2.0 and 8.0."""
    r = token_weighting_report(model, 4, 1.0, n_seqs=8)
    assert f"{r.micro_batch} x {r.k} = {r.effective_batch}" == "2 x 4 = 8"
