"""The planner plans the explainer's loop as written, and is never below it (issue 21, item 1).

The explainer's loop binds the model's output to a variable (`predictions = model(x)`), which keeps
one micro-step's logits alive into the next micro-step and the last ones through `optimizer.step()`.
Every test here writes that loop out by hand, measures it with `helpers.memory.measure_step` (the
CPU allocator's record), and holds the planner's figures against it: the sign first.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers.memory import measure_step
from helpers.meta_profile import BatchSpec, Profiler
from helpers.models import GPT, GPTConfig
from helpers.phases import UpdateMeasurer
from helpers.planner import fit_profile
from helpers.training import lm_loss

CFG = GPTConfig(vocab_size=700, seq_len=40, d_model=48, n_heads=4, n_layers=2, dropout=0.0,
                fused_attention=True)


class _TiedLM(nn.Module):
    """A language model with a different output head: the embedding's transpose (tied), no bias."""

    def __init__(self, vocab: int = 900, d: int = 40, seq: int = 40) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        layer = nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.ModuleList(nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
                                    for _ in range(2))
        self.norm = nn.LayerNorm(d)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx) + self.pos[: idx.shape[1]]
        mask = nn.Transformer.generate_square_subsequent_mask(idx.shape[1])
        for block in self.blocks:
            x = block(x, mask=mask, is_causal=True)
        return self.norm(x) @ self.emb.weight.t()


MODELS = {
    "gpt": (functools.partial(GPT, CFG), BatchSpec.lm(CFG.seq_len, CFG.vocab_size)),
    "tied-head": (_TiedLM, BatchSpec.lm(40, 900)),
}


def _explainer_loop(model: nn.Module, opt: torch.optim.Optimizer, batches: list, *, drop: bool = False):  # noqa: ANN202
    """The explainer's loop, written out (with `drop`, a `del predictions` right after the loss)."""

    def update() -> None:
        opt.zero_grad(set_to_none=True)
        for x, y in batches:
            predictions = model(x)
            loss = lm_loss(predictions, y)
            if drop:
                del predictions
            (loss / len(batches)).backward()
        opt.step()

    return update


def _measured(build, spec: BatchSpec, b: int, k: int, *, drop: bool = False) -> int:  # noqa: ANN001
    """The real CPU peak of the hand-written loop: B = b, K = k, Adam, after one warm-up update."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = build().train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    _explainer_loop(model, opt, [spec.batch(1, "cpu", 99)])()
    update = _explainer_loop(model, opt, [spec.batch(b, "cpu", i) for i in range(k)], drop=drop)
    return measure_step(update, model=model, optimizer=opt).peak_bytes


@pytest.mark.parametrize("name", list(MODELS))
def test_meta_plan_is_never_below_the_explainers_loop(name: str) -> None:
    """The meta profile's plan (fitted at B = 1, 2) at K = 1, 2 and 4, against the real loop."""
    build, spec = MODELS[name]
    profile = Profiler(build, spec, "adam", target="cpu").memory_profile("none", (1, 2))
    errors = {}
    for b in (1, 3):
        for k in (1, 2, 4):
            measured = _measured(build, spec, b, k)
            errors[b, k] = profile.predict_peak(b, accumulation_steps=k) / measured - 1
    assert all(0 <= e <= 0.10 for e in errors.values()), errors


def test_measured_plan_is_never_below_the_explainers_loop() -> None:
    """Lesson 06's way: fit_profile on UpdateMeasurer at B = 2, 4; held out B = 1, 3, 6 at K = 1, 2, 4."""
    torch.manual_seed(0)
    model = GPT(CFG).train()
    profile = fit_profile(UpdateMeasurer(model), (2, 4))
    spec = MODELS["gpt"][1]
    errors = {}
    for b in (1, 3, 6):
        for k in (1, 2, 4):
            measured = _measured(functools.partial(GPT, CFG), spec, b, k)
            errors[b, k] = profile.predict_peak(b, accumulation_steps=k) / measured - 1
    assert all(0 <= e <= 0.10 for e in errors.values()), errors


def test_the_loop_as_written_holds_one_micro_batch_of_logits_more() -> None:
    """Hand count: at K >= 2 the loop as written peaks one micro-batch of logits (b s V floats) above
    the loop with `del predictions`; the profile's del figure is that loop's, to the byte."""
    build, spec = MODELS["gpt"]
    b, k = 3, 2
    keep, drop = _measured(build, spec, b, k), _measured(build, spec, b, k, drop=True)
    logits = 4 * b * CFG.seq_len * CFG.vocab_size
    assert keep - drop == logits
    step = Profiler(build, spec, "adam", device="cpu").step(b, accumulation_steps=k)
    assert (step.peak_bytes, step.released.peak_bytes) == (keep, drop)
    profile = Profiler(build, spec, "adam", target="cpu").memory_profile("none", (1, 2))
    predicted_drop = profile.predict_peak(b, accumulation_steps=k, keep_output=False)
    assert 0 <= predicted_drop / drop - 1 <= 0.01, (predicted_drop, drop)
    assert profile.held_output_bytes(b, accumulation_steps=k) == pytest.approx(logits, rel=0.01)
    assert profile.held_output_bytes_per_example == pytest.approx(4 * CFG.seq_len * CFG.vocab_size, rel=0.01)


def test_profiler_k1_after_k2_on_one_profiler_matches_the_hand_written_loops() -> None:
    """One Profiler, K = 2 then K = 1 (meta and real CPU), against the loops measured on their own.

    Hand count: K = 2 peaks higher than K = 1 by exactly the gradients (alive from micro-step 2 on),
    because both peak at the start of the last micro-step's backward.
    """
    build, spec = MODELS["gpt"]
    params = sum(p.numel() * 4 for p in build().parameters())
    expected = {k: _measured(build, spec, 2, k) for k in (2, 1)}
    assert expected[2] - expected[1] == params
    for device in ("meta", "cpu"):
        profiler = Profiler(build, spec, "adam", device=device)
        got = {k: profiler.step(2, accumulation_steps=k) for k in (2, 1)}
        assert {k: s.accumulation_steps for k, s in got.items()} == {2: 2, 1: 1}
        for k, s in got.items():
            assert 0 <= s.peak_bytes - expected[k] <= 64, (device, k, s.peak_bytes, expected[k])
        assert got[2].first_step_peak_bytes == got[1].peak_bytes


class _Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(30, 200), nn.Tanh(), nn.Linear(200, 50))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def test_del_predictions_waits_for_a_loss_that_saved_them() -> None:
    """An MSE loss saves its input for backward: `del predictions` frees nothing until that node ran.

    The released figure (measured in the same run as the loop as written) equals a measured loop
    that does `del predictions`, and is not lower.
    """
    torch.manual_seed(0)
    model = _Regressor()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [(torch.randn(64, 30), torch.randn(64, 50)) for _ in range(2)]

    def loop(drop: bool):  # noqa: ANN202
        def update() -> None:
            opt.zero_grad(set_to_none=True)
            for x, y in batches:
                predictions = model(x)
                loss = F.mse_loss(predictions, y)
                if drop:
                    del predictions
                (loss / 2).backward()
            opt.step()

        return update

    from helpers.memory import MemoryTracker, tracked_run
    from helpers.phases import phase_peaks
    from helpers.tracker import release_point

    def marked() -> None:
        opt.zero_grad(set_to_none=True)
        for x, y in batches:
            predictions = model(x)
            loss = F.mse_loss(predictions, y)
            release_point(predictions, loss)
            (loss / 2).backward()
        opt.step()

    keep, drop = (measure_step(loop(d), model=model, optimizer=opt).peak_bytes for d in (False, True))
    tracker = MemoryTracker(model=model, optimizer=opt)
    timeline_of = tracked_run(marked, tracker)
    assert phase_peaks(timeline_of(False))["overall"][0] == keep
    assert phase_peaks(timeline_of(True))["overall"][0] == drop
    assert keep - drop == 64 * 50 * 4  # the outputs held through the optimizer step, no more
