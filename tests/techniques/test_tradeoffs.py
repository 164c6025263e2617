"""helpers.techniques.tradeoffs: optimizer in backward, chunked cross-entropy, offloading, measured."""

from __future__ import annotations

import copy

import pytest
import torch

from helpers.core.training import IGNORE_INDEX, lm_loss
from helpers.measure.memory import saved_activation_bytes
from helpers.measure.tracker import MemoryTracker
from helpers.models.gpt import GPTConfig, seeded_gpt
from helpers.techniques import tradeoffs
from helpers.techniques.accumulation import compare_grads

CFG = GPTConfig(vocab_size=64, seq_len=8, d_model=32, n_heads=2, n_layers=2, dropout=0.0)


def _sgd(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1)


def test_optimizer_in_backward_frees_each_gradient_at_once() -> None:
    model = seeded_gpt(CFG, "cpu")
    x = torch.randint(0, CFG.vocab_size, (1, 6))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def plain() -> None:
        lm_loss(model(x), x.roll(-1, 1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    params = sum(p.numel() * 4 for p in model.parameters())
    largest = max(p.numel() * 4 for p in model.parameters())
    plain_tl = tradeoffs.gradient_peak(model, plain)
    fused_tl = tradeoffs.gradient_peak(model, lambda: lm_loss(model(x), x.roll(-1, 1)).backward(),
                                       make_optimizer=_sgd)
    assert max(plain_tl.series["gradients"]) == params
    assert max(fused_tl.series["gradients"]) <= 2 * largest < params
    assert max(fused_tl.total) < max(plain_tl.total)
    assert all(p.grad is None for p in model.parameters())  # the hooks freed them, and are gone
    before = [p.detach().clone() for p in model.parameters()]
    lm_loss(model(x), x.roll(-1, 1)).backward()
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))


def test_in_backward_is_one_step_without_accumulation_and_k_steps_with_it() -> None:
    base = seeded_gpt(CFG, "cpu")
    x = torch.randint(0, CFG.vocab_size, (6, CFG.seq_len))
    y = x.roll(-1, 1)
    full, fused, fused_k = copy.deepcopy(base), copy.deepcopy(base), copy.deepcopy(base)
    opt = _sgd(list(full.parameters()))
    lm_loss(full(x), y).backward()
    opt.step()
    with tradeoffs.optimizer_in_backward(fused, _sgd):
        lm_loss(fused(x), y).backward()  # one backward: the same update as the full batch
    with tradeoffs.optimizer_in_backward(fused_k, lambda ps: torch.optim.Adam(ps, lr=1e-3)) as opts:
        for xb, yb in zip(x.split(2), y.split(2), strict=True):
            (lm_loss(fused_k(xb), yb) / 3).backward()
    flat = lambda m: torch.cat([p.detach().flatten() for p in m.parameters()])  # noqa: E731
    assert compare_grads(flat(full) - flat(base), flat(fused) - flat(base)).max_rel <= 1e-5
    assert {int(o.state[p]["step"]) for p, o in opts.items()} == {3}  # K Adam steps per update
    with pytest.raises(ValueError, match="make_optimizer"), tradeoffs.optimizer_in_backward(base, "sgd"):
        pass


@pytest.mark.parametrize("chunk", [7, 64, 1000])
def test_chunked_cross_entropy_is_the_same_loss_with_one_chunk_of_logits(chunk: int) -> None:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(64, 16, generator=gen, requires_grad=True)
    weight = torch.nn.Parameter(torch.randn(2000, 16, generator=gen) * 0.05)
    targets = torch.randint(0, 2000, (64,), generator=gen)
    targets[::5] = IGNORE_INDEX
    results = []
    for fn in (tradeoffs.full_cross_entropy, lambda h, w, t: tradeoffs.chunked_cross_entropy(h, w, t, chunk)):
        with MemoryTracker() as tracker:
            loss = fn(hidden, weight, targets)
            loss.backward()
        results.append((loss.item(), max(tracker.timeline().total), hidden.grad.clone(), weight.grad.clone()))
        hidden.grad = weight.grad = None
    (l0, peak0, dh0, dw0), (l1, peak1, dh1, dw1) = results
    assert l1 == pytest.approx(l0, rel=1e-6)
    torch.testing.assert_close(dh1, dh0, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(dw1, dw0, rtol=1e-4, atol=1e-7)
    logits = 64 * 2000 * 4
    assert peak0 >= 2.5 * logits
    if chunk < 64:
        assert peak1 < peak0 / 3
    kept = saved_activation_bytes(lambda: tradeoffs.chunked_cross_entropy(hidden, weight, targets, chunk))
    assert kept < logits / 10  # each chunk's checkpoint keeps its inputs only, never logits


def test_chunked_cross_entropy_checks_its_arguments() -> None:
    h, w = torch.zeros(4, 3), torch.zeros(5, 3)
    with pytest.raises(ValueError, match="hidden must be"):
        tradeoffs.chunked_cross_entropy(h, w, torch.zeros(3, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="no valid token"):
        tradeoffs.chunked_cross_entropy(h, w, torch.full((4,), IGNORE_INDEX), 2)
    with pytest.raises(ValueError, match="chunk"):
        tradeoffs.chunked_cross_entropy(h, w, torch.zeros(4, dtype=torch.long), 0)


def test_save_on_cpu_on_a_cpu_moves_nothing_and_packs_the_saved_tensors() -> None:
    model = seeded_gpt(CFG, "cpu")
    x = torch.randint(0, CFG.vocab_size, (2, CFG.seq_len))
    forward = lambda: lm_loss(model(x), x.roll(-1, 1))  # noqa: E731
    kept = saved_activation_bytes(forward)
    model.zero_grad(set_to_none=True)
    plain = tradeoffs.offload_traffic(forward, parameters=tuple(model.parameters()))
    pinned = tradeoffs.offload_traffic(forward, parameters=tuple(model.parameters()), pin_memory=True)
    assert plain.tensors == plain.unpacked > 0 and plain.copied_bytes == 0
    assert abs(plain.packed_bytes - plain.parameter_bytes - kept) <= 0.02 * kept
    assert 0 < plain.parameter_bytes <= sum(p.numel() * 4 for p in model.parameters())
    assert pinned.copied_bytes >= plain.packed_bytes - plain.parameter_bytes  # a host copy of each


def test_cuda_offload_needs_a_gpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the cuda-marked test covers it")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        tradeoffs.cuda_offload_step(lambda: None)


@pytest.mark.cuda
def test_cuda_offload_lowers_the_device_peak() -> None:
    cfg = GPTConfig(vocab_size=256, seq_len=128, d_model=128, n_heads=4, n_layers=4, dropout=0.0)
    model = seeded_gpt(cfg, "cuda")
    x = torch.randint(0, cfg.vocab_size, (8, cfg.seq_len), device="cuda")

    def step() -> None:
        lm_loss(model(x), x.roll(-1, 1)).backward()
        model.zero_grad(set_to_none=True)

    result = tradeoffs.cuda_offload_step(step)
    assert result.peak_offloaded < result.peak_plain
