"""The explainer's claims, each with a quick check that measures it again (lesson 08).

Every `Claim` restates one sentence of the explainer in our words, names the lesson
and section that teach it, and carries a check: a function of a shared `Lab` that returns
`Evidence` (pass/fail, a number with its unit, and a sentence). The checks reuse the
lessons' own helpers, so a lesson and its ledger row cannot drift apart. `helpers.review`
runs them.

Most checks run on a small, fast GPT (`LAB_CONFIG`). The headline numbers
(`LESSON_MODEL_CLAIMS`) run on the model of the lesson that shows them, at this device's
scale: what checkpointing saves and costs (C09, C11) on lesson 02's GPT
(`helpers.models.deep_gpt_setup`), the explainer's table (C08, C25) on lesson 01's
(`helpers.models.explainer_model`). So the ledger and the lessons show one set of numbers.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from helpers import accumulation as acc
from helpers import costs, formulas, pitfalls, tokens
from helpers.checkpointing import apply_ac
from helpers.data import regression_batch, token_batch
from helpers.device import lesson_scale
from helpers.memory import micro_step_memory, new_live_bytes, record_timeline, saved_activation_bytes
from helpers.models import (
    GPT,
    GPTConfig,
    ResidualMLP,
    deep_gpt_setup,
    explainer_model,
    param_bytes,
    seeded_gpt,
)
from helpers.phases import ConfigMemory, activation_sweep, measure_config
from helpers.training import lm_loss
from helpers.validate import choice

__all__ = ["CLAIMS", "LAB_CONFIG", "LESSON_MODELS", "LESSON_MODEL_CLAIMS", "Claim", "Evidence", "Lab"]


# -- the lab every check shares --------------------------------------------------------
# Micro-batches for the sweep: from 4 up the forward pass sets the peak (below, the optimizer step can).
SWEEP = (4, 6, 8)
LAB_CONFIG = GPTConfig(vocab_size=64, seq_len=32, d_model=32, n_heads=2, n_layers=2, dropout=0.0)
# The claims whose numbers the lessons headline, and the lesson whose model (and micro-batch) they use.
LESSON_MODEL_CLAIMS = {"C08": "01", "C09": "02", "C11": "02", "C25": "01"}
LESSON_MODELS = ("01", "02")


@dataclass
class Lab:
    """The models and data the quick checks share (built once per ledger run).

    `model` is the fast lab GPT (`LAB_CONFIG`); `lesson_model("01")` and `lesson_model("02")`
    are those lessons' GPTs at `scale` (this device's lesson scale unless given), built on
    first use.
    """

    device: torch.device
    scale: str = ""
    model: GPT = field(init=False)
    cache: dict[str, object] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.scale = self.scale or lesson_scale(self.device)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self.model = GPT(LAB_CONFIG).to(self.device).train()

    def lesson_model(self, lesson: str) -> GPT:
        """The GPT lesson `lesson` ("01" or "02") measures at `self.scale`, seeded as the lesson seeds it.

        "01": `explainer_model(scale)`; "02": `GPT(deep_gpt_setup(scale)[0])`, the
        model of lesson 02's sections 2-9 (8 blocks, dropout 0.1).
        """
        choice("lesson", lesson, LESSON_MODELS)

        def build() -> GPT:
            if lesson == "01":
                return explainer_model(self.scale, self.device)
            return seeded_gpt(deep_gpt_setup(self.scale)[0], self.device)

        return self.once(f"lesson_model {lesson}", build)

    def lesson_tokens(self, lesson: str, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """`n` random sequences for `lesson_model(lesson)`."""
        cfg = self.lesson_model(lesson).cfg
        return token_batch(n, cfg.seq_len, cfg.vocab_size, seed=seed, device=self.device)

    def once(self, key: str, make: Callable[[], object]) -> object:
        """`make()` the first time `key` is asked for, the cached result afterwards."""
        if key not in self.cache:
            self.cache[key] = make()
        return self.cache[key]

    def tokens(self, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """`n` random sequences (inputs, next-token targets) on the lab's device."""
        return token_batch(n, LAB_CONFIG.seq_len, LAB_CONFIG.vocab_size, seed=seed, device=self.device)


@dataclass(frozen=True)
class Evidence:
    """What a check measured: pass/fail, the headline number with its unit, and a sentence."""

    passed: bool
    value: float
    unit: str
    detail: str


@dataclass(frozen=True)
class Claim:
    """One claim of the explainer, in our words, with where it is taught and how it is checked."""

    id: str
    text: str
    lesson: str  # "NN §section": the notebook and the section (cell) that teaches it
    check: str
    run: Callable[[Lab], Evidence]
    condition: str = ""  # when the claim holds only under a condition, the row says which
    needs: str = ""  # a helpers module the check needs (rows wait until that lesson exists)


# -- the checks --------------------------------------------------------------------------
def _gib(n: float) -> str:
    from helpers.plots import format_bytes

    return format_bytes(n)


def _adam_step(lab: Lab) -> tuple[dict[str, float], int]:
    return lab.once("adam_step", lambda: _measure_adam_step(lab))


def _measure_adam_step(lab: Lab) -> tuple[dict[str, float], int]:
    model, (idx, tgt) = lab.model, lab.tokens(4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        lm_loss(model(idx), tgt).backward()
        opt.step()

    try:
        timeline = record_timeline(step, model=model, optimizer=opt)
    finally:
        opt.zero_grad(set_to_none=True)
    return timeline.at(-1), param_bytes(model)


def _c_saved(lab: Lab) -> Evidence:
    idx, tgt = lab.tokens(4)
    saved = saved_activation_bytes(lambda: lm_loss(lab.model(idx), tgt))
    acc.clear_grads(lab.model)
    params = param_bytes(lab.model)
    return Evidence(saved > 0, saved, "bytes",
                    f"a forward of 4 sequences keeps {_gib(saved)} for backward ({saved / params:.1f}x the "
                    f"parameters)")


def _c_released(lab: Lab) -> Evidence:
    model, (idx, tgt) = lab.model, lab.tokens(4)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        lm_loss(model(idx), tgt).backward()
        opt.step()

    timeline = record_timeline(step, model=model, optimizer=opt)
    opt.zero_grad(set_to_none=True)
    acts, phases = timeline.series["activations"], timeline.phases
    left = acts[phases.index("optimizer") - 1] / max(acts)
    return Evidence(left < 0.05, left, "fraction of peak",
                    f"activations peak at {_gib(max(acts))}; {left:.1%} of that is left when backward ends")


def _c_grads_equal_params(lab: Lab) -> Evidence:
    after, params = _adam_step(lab)
    ratio = after["gradients"] / params
    return Evidence(abs(ratio - 1) <= 0.01, ratio, "x parameters",
                    f"gradients {_gib(after['gradients'])} for {_gib(params)} of parameters")


def _c_adam_state(lab: Lab) -> Evidence:
    after, params = _adam_step(lab)
    ratio = after["optimizer_state"] / params
    return Evidence(abs(ratio - 2) <= 0.02, ratio, "x parameters",
                    f"Adam keeps {_gib(after['optimizer_state'])} (exp_avg + exp_avg_sq + step counters)")


def _sweep(lab: Lab) -> dict[int, object]:
    return lab.once("sweep", lambda: activation_sweep(lab.model, SWEEP, progress=False))


def _c_linear(lab: Lab) -> Evidence:
    sweep = _sweep(lab)
    fit = formulas.linear_fit(list(sweep), [m.breakdown["activations"] for m in sweep.values()])
    return Evidence(fit.r2 >= 0.99 and fit.slope > 0, fit.r2, "R²",
                    f"activations = {_gib(fit.slope)} per example + {_gib(fit.intercept)}")


def _c_floor(lab: Lab) -> Evidence:
    floors = [m.floor_bytes for m in _sweep(lab).values()]
    spread = (max(floors) - min(floors)) / max(floors)
    return Evidence(spread <= 0.01, spread, "relative spread",
                    f"parameters + gradients + Adam state = {_gib(floors[0])} at micro-batch 4, 6 and 8")


def _c_peak_one_micro_batch(lab: Lab) -> Evidence:
    k2 = measure_config(lab.model, micro_batch=4, steps=2)
    k4 = measure_config(lab.model, micro_batch=4, steps=4)
    ratio = k4.peak_bytes / k2.peak_bytes
    return Evidence(abs(ratio - 1) <= 0.01, ratio, "peak(K=4) / peak(K=2)",
                    f"micro-batch 4: peak {_gib(k2.peak_bytes)} at K=2, {_gib(k4.peak_bytes)} at K=4")


def _rows(lab: Lab) -> list[ConfigMemory]:
    """The explainer's three rows (8x4, 4x8, 4x8 checkpointed) on lesson 01's model, once per ledger run.

    Each update runs its first two micro-steps and the optimizer step: from the second micro-step
    on every micro-step holds the same memory (C07 checks it), so the peak is that of all K.
    """
    model = lab.lesson_model("01")
    return lab.once("rows", lambda: [
        measure_config(model, micro_batch=8, steps=4, max_micro_steps=2),
        measure_config(model, micro_batch=4, steps=8, max_micro_steps=2),
        measure_config(model, micro_batch=4, steps=8, block_wrapper="full", max_micro_steps=2)])


def _c_smaller_micro_batch(lab: Lab) -> Evidence:
    big, small, _ = _rows(lab)
    ratio = small.activations_bytes / big.activations_bytes
    ok = 0.4 <= ratio <= 0.65 and small.peak_bytes < big.peak_bytes and small.effective_batch == 32
    return Evidence(ok, ratio, "activations 4x8 / 8x4",
                    f"lesson 01's model, effective batch 32 both ways: peak {_gib(big.peak_bytes)} -> "
                    f"{_gib(small.peak_bytes)}")


def _c_combined(lab: Lab) -> Evidence:
    rows = _rows(lab)
    peaks = [r.peak_bytes for r in rows]
    floors = [r.floor_bytes for r in rows]
    ok = peaks[0] > peaks[1] > peaks[2] and max(floors) - min(floors) <= 0.01 * max(floors)
    return Evidence(ok, peaks[2] / peaks[0], "peak 4x8 ckpt / 8x4",
                    "lesson 01's model: peaks " + " > ".join(_gib(p) for p in peaks)
                    + f"; floor {_gib(floors[0])} in all three")


def _ckpt_saved(lab: Lab) -> tuple[int, int]:
    idx, tgt = lab.lesson_tokens("02", deep_gpt_setup(lab.scale)[1])  # lesson 02's micro-batch
    model = lab.lesson_model("02")
    plain = saved_activation_bytes(lambda: lm_loss(model(idx), tgt))
    with apply_ac(model):
        ckpt = saved_activation_bytes(lambda: lm_loss(model(idx), tgt))
    return plain, ckpt


def _c_ckpt_saves(lab: Lab) -> Evidence:
    plain, ckpt = _ckpt_saved(lab)
    return Evidence(ckpt <= 0.5 * plain, plain / ckpt, "x fewer saved bytes",
                    f"lesson 02's model: {_gib(plain)} saved for backward plain, {_gib(ckpt)} with every "
                    "block checkpointed")


def _grad_with(lab: Lab, mode: str) -> torch.Tensor:
    idx, tgt = lab.tokens(4)
    with apply_ac(lab.model, mode):
        return acc.full_batch_grad(lab.model, lm_loss, idx, tgt)


def _c_ckpt_same_grads(lab: Lab) -> Evidence:
    diff = acc.compare_grads(_grad_with(lab, "none"), _grad_with(lab, "full"))
    return Evidence(diff.max_rel <= 1e-5, diff.max_rel, "max relative difference",
                    "gradients with and without checkpointing (dropout off, so no RNG to replay)")


def _c_ckpt_flops(lab: Lab) -> Evidence:
    idx, tgt = lab.lesson_tokens("02", deep_gpt_setup(lab.scale)[1])  # lesson 02's micro-batch
    model = lab.lesson_model("02")

    def step() -> None:
        lm_loss(model(idx), tgt).backward()

    region = costs.blocks_forward_flops(model, len(idx))  # one forward of the checkpointed region
    plain = costs.count_flops(step)
    with apply_ac(model):
        try:
            extra = costs.count_flops(step) - plain
        finally:
            acc.clear_grads(model)
    forwards = extra / region
    return Evidence(0 < extra <= region, forwards, "forwards of the checkpointed blocks",
                    f"lesson 02's model: {extra:,} extra FLOPs per forward+backward; one forward of its "
                    f"{len(model.blocks)} blocks is {region:,} (+{extra / plain:.0%} of the step; "
                    "counted by FlopCounterMode)")


def _c_ckpt_inference(lab: Lab) -> Evidence:
    idx, _ = lab.tokens(4)
    model = lab.model
    with torch.no_grad():
        plain = new_live_bytes(lambda: model(idx))
        with apply_ac(model):
            ckpt = new_live_bytes(lambda: model(idx))
    return Evidence(plain == ckpt == 0, ckpt, "bytes kept",
                    f"under torch.no_grad(): {plain} B kept plain, {ckpt} B kept checkpointed")


def _c_accum_equal(lab: Lab) -> Evidence:
    x, y = lab.tokens(16)
    batch_dependent = [m for m in lab.model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    full = acc.full_batch_grad(lab.model, lm_loss, x, y)
    diff = acc.compare_grads(full, acc.accumulated_grad(lab.model, lm_loss, x, y, 4))
    ok = diff.max_rel <= 1e-4 and not batch_dependent and LAB_CONFIG.dropout == 0.0
    return Evidence(ok, diff.max_rel, "max relative difference",
                    "16 sequences as 4 micro-batches of 4 with loss/K vs one batch of 16")


def _c_unscaled(lab: Lab) -> Evidence:
    x, y = lab.tokens(16)
    full = acc.full_batch_grad(lab.model, lm_loss, x, y)
    diff = acc.compare_grads(full, acc.accumulated_grad(lab.model, lm_loss, x, y, 4, scale=False))
    return Evidence(abs(diff.norm_ratio - 4) <= 1e-3, diff.norm_ratio, "x the full-batch gradient norm",
                    "K = 4 mean losses summed without dividing by K")


def _micro_step_growth(lab: Lab, keep_graph: bool) -> tuple[int, int]:
    batches = [lab.tokens(4, seed=s) for s in range(4)]
    model = lab.model
    kept: list[torch.Tensor] = []

    def loop(mark: Callable[[str], int]) -> None:
        for i, (x, y) in enumerate(batches):
            loss = lm_loss(model(x), y) / len(batches)
            loss.backward(retain_graph=keep_graph)
            if keep_graph:
                kept.append(loss)
            mark(f"micro-step {i + 1}")

    mem = micro_step_memory(loop, model)
    kept.clear()
    unit = saved_activation_bytes(lambda: lm_loss(model(batches[0][0]), batches[0][1]))
    acc.clear_grads(model)
    return mem.growth(1, -1), unit


def _c_flat(lab: Lab) -> Evidence:
    growth, unit = _micro_step_growth(lab, keep_graph=False)
    return Evidence(abs(growth) <= 0.01 * unit, growth, "bytes grown over micro-steps 1..4",
                    f"one micro-batch's activations are {_gib(unit)}; the correct loop grows {growth} B")


def _c_leak(lab: Lab) -> Evidence:
    growth, unit = _micro_step_growth(lab, keep_graph=True)
    per_step = growth / 3 / unit
    return Evidence(per_step >= 0.9, per_step, "micro-batches of activations per micro-step",
                    f"retain_graph=True, losses kept in a list: grows {_gib(growth)} over 3 micro-steps")


def _clip(g: torch.Tensor, max_norm: float) -> torch.Tensor:
    return g * min(1.0, max_norm / (g.norm().item() + 1e-6))  # clip_grad_norm_'s rule on one flat vector


def _c_clip(lab: Lab) -> Evidence:
    x, y = regression_batch(32, 8, 1, seed=0, device=lab.device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = ResidualMLP(8, 32, 2, 1).to(lab.device)
    loss = torch.nn.functional.mse_loss
    full = acc.full_batch_grad(model, loss, x, y)
    max_norm = 0.5 * full.norm().item()
    once = _clip(acc.accumulated_grad(model, loss, x, y, 8), max_norm)
    each = sum(_clip(acc.full_batch_grad(model, loss, xs, ys), max_norm) / 4
               for xs, ys in zip(x.split(8), y.split(8), strict=True))
    reference = _clip(full, max_norm)
    right = acc.compare_grads(reference, once).max_rel
    wrong = ((each - reference).norm() / reference.norm()).item()
    return Evidence(right <= 1e-4 and wrong >= 1e-3, wrong, "relative error of per-micro-step clipping",
                    f"clipping once after accumulating matches the clipped full batch to {right:.1e}")


def _c_partial_group(lab: Lab) -> Evidence:
    x, y = lab.tokens(14)
    full = acc.full_batch_grad(lab.model, lm_loss, x, y)
    weighted = acc.compare_grads(full, acc.accumulated_grad(lab.model, lm_loss, x, y, 4)).max_rel
    naive = sum(acc.full_batch_grad(lab.model, lm_loss, xs, ys) / 4 for xs, ys in zip(x.split(4), y.split(4),
                                                                                        strict=True))
    naive_err = ((naive - full).norm() / full.norm()).item()
    return Evidence(weighted <= 1e-4 and naive_err >= 1e-2, naive_err, "relative error of loss/K",
                    f"14 examples as 4+4+4+2: weighting by n_i/N matches to {weighted:.1e}")


def _c_batchnorm(lab: Lab) -> Evidence:
    dev = lab.device
    small = dict(batch=16, width=8, depth=2, size=8, device=dev)
    bn = pitfalls.norm_error_curve("batch", micro_batches=[4, 16], **small)
    gn = pitfalls.norm_error_curve("group", micro_batches=[4], **small)
    ok = bn[4] >= 1e-2 and bn[16] <= 1e-5 and gn[4] <= 1e-4
    return Evidence(ok, bn[4], "relative gradient error",
                    f"BatchNorm at micro-batch 4 of 16: {bn[4]:.2f} (0 at 16); GroupNorm: {gn[4]:.1e}")


def _c_dropout(lab: Lab) -> Evidence:
    full, own = pitfalls.dropout_grads(8, shared_masks=False, batch=16, device=lab.device)
    full_s, shared = pitfalls.dropout_grads(8, shared_masks=True, batch=16, device=lab.device)
    err = ((own - full).norm() / full.norm()).item()
    fixed = ((shared - full_s).norm() / full_s.norm()).item()
    return Evidence(err >= 1e-2 and fixed <= 1e-5, err, "relative gradient error",
                    f"own dropout masks per micro-batch; slicing the full batch's masks gives {fixed:.1e}")


def _c_scheduler(lab: Lab) -> Evidence:
    right = pitfalls.lr_schedule(8, per="update", updates=32, warmup=8)
    wrong = pitfalls.lr_schedule(8, per="micro", updates=32, warmup=8)
    ratio = right.warmup_end_examples / wrong.warmup_end_examples
    return Evidence(ratio >= 4, ratio, "x earlier end of warmup",
                    f"warmup ends after {wrong.warmup_end_examples} examples when stepped per micro-step, "
                    f"{right.warmup_end_examples} when stepped per update (K = 8)")


def _c_amp(lab: Lab) -> Evidence:
    x, y = regression_batch(32, 8, 1, seed=0, device=lab.device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = ResidualMLP(8, 32, 2, 1).to(lab.device)
    loss = torch.nn.functional.mse_loss
    ref = pitfalls.amp_update(model, loss, x, y, 8, amp=False)
    good = pitfalls.amp_update(model, loss, x, y, 8, order="correct")
    bad = pitfalls.amp_update(model, loss, x, y, 8, order="clip_before_unscale")
    good_err = ((good.applied - ref.applied).norm() / ref.applied.norm()).item()
    shrink = (bad.applied.norm() / ref.applied.norm()).item()
    return Evidence(good_err <= 2e-2 and shrink <= 0.1, shrink, "x the true gradient norm",
                    f"unscale -> clip -> step matches float32 to {good_err:.1e}; clipping the scaled "
                    "gradients shrinks the update")


def _c_tokens(lab: Lab) -> Evidence:
    with torch.random.fork_rng(devices=[]):
        model = tokens.tiny_lm(vocab_size=32, max_len=32, d_model=32, n_layers=1).to(lab.device)
    report = tokens.token_weighting_report(model, 4, 0.75, n_seqs=16)
    ok = report.naive.max_rel >= 1e-3 and report.fixed.max_rel <= 1e-4
    return Evidence(ok, report.naive.max_rel, "max relative difference (naive)",
                    f"K = 4, tokens per micro-batch {report.tokens_per_micro_batch}: the group token count "
                    f"fixes it ({report.fixed.max_rel:.1e})")


def _c_launches(lab: Lab) -> Evidence:
    x, y = lab.tokens(8)
    counts, flops = {}, {}
    for k in (1, 8):
        counts[k] = costs.count_ops(lambda k=k: acc.accumulated_grad(lab.model, lm_loss, x, y, 8 // k))
        flops[k] = costs.count_flops(
            lambda k=k: acc.accumulated_grad(lab.model, lm_loss, x, y, 8 // k))
    ratio = counts[8] / counts[1]
    same_flops = abs(flops[8] / flops[1] - 1)
    return Evidence(ratio >= 4 and same_flops <= 0.02, ratio, "x more ops launched",
                    f"effective batch 8 as 1 x 8 vs 8 x 1: {counts[1]} -> {counts[8]} ops, same FLOPs "
                    f"(within {same_flops:.1%})")


def _c_state_floor(lab: Lab) -> Evidence:
    planner = importlib.import_module("helpers.planner")
    sweep = _sweep(lab)  # the profile reuses C05's measurements
    floor = next(iter(sweep.values())).floor_bytes
    try:
        profile = planner.fit_profile(sweep.__getitem__, micro_batches=SWEEP)
        planner.recommend(int(0.9 * floor), 32, profile)
    except ValueError as exc:
        return Evidence("floor" in str(exc).lower(), floor, "bytes of model state",
                        "a budget 10% below the floor: the planner says neither technique fits")
    return Evidence(False, floor, "bytes of model state", "the planner found a plan below the floor")


def _c_b_k_w(lab: Lab) -> Evidence:
    dist = importlib.import_module("helpers.distributed")
    sizes = dist.check_batch_sizes(micro_batch=4, accumulation_steps=8, world_size=2)
    return Evidence(sizes.train_batch == 64, sizes.train_batch, "examples per update",
                    "B = 4, K = 8, W = 2 gives an effective batch of 64")


# -- lesson 10: the frameworks and the compiler, each against the loop (C28-C32) ----------------
_LM = dict(vocab_size=64, hidden=32, layers=2, heads=2, max_len=16)  # a tiny Llama, from a config


def _lm_rows(n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    hf = importlib.import_module("helpers.hf")
    return hf.training_rows(tokens.variable_length_sequences(n, _LM["max_len"], _LM["vocab_size"],
                                                             spread=0.75, seed=seed))


def _c_hf_checkpointing(lab: Lab) -> Evidence:
    hf = importlib.import_module("helpers.hf")
    model = hf.causal_lm("llama", device=lab.device, **_LM)
    batch = hf.micro_batches(_lm_rows(4, 0), 4, device=lab.device)[0]
    plain, (_, g_plain) = hf.saved_bytes(model, batch), hf.loss_and_grad(model, batch)
    hf.enable_checkpointing(model, reentrant=False)
    kept, (_, g_ckpt) = hf.saved_bytes(model, batch), hf.loss_and_grad(model, batch)
    gap = ((g_ckpt - g_plain).abs().max() / g_plain.abs().max()).item()
    return Evidence(2 * kept <= plain and gap <= 1e-6, plain / kept, "x fewer saved bytes",
                    f"Llama with checkpointing on: {_gib(plain)} -> {_gib(kept)} kept for backward; "
                    f"gradients equal to {gap:.1e}")


def _c_trainer_accumulation(lab: Lab) -> Evidence:
    import tempfile

    hf = importlib.import_module("helpers.hf")
    rows = _lm_rows(8, 1)
    loop = hf.causal_lm("llama", device=lab.device, **_LM)
    start = hf.snapshot(loop)
    hf.group_token_step(loop, hf.micro_batches(rows, 2, device=lab.device))
    torch.optim.SGD(loop.parameters(), lr=0.5).step()
    with tempfile.TemporaryDirectory() as out:
        update = hf.trainer_update(hf.causal_lm("llama", device=lab.device, **_LM), rows, micro_batch=2,
                                   accumulation_steps=4, learning_rate=0.5, output_dir=out)
    diff = acc.compare_grads(hf.parameter_change(loop, start), update)
    return Evidence(diff.max_rel <= 1e-5, diff.max_rel, "max_rel",
                    "Trainer(gradient_accumulation_steps=4) vs the group-token-count loop, one update of 8 "
                    "padded sequences (clipping, decay, warmup, schedule and shuffling off)")


def _c_accelerate_accumulation(lab: Lab) -> Evidence:
    import copy

    accel = importlib.import_module("helpers.accel")
    idx, tgt = lab.tokens(8, seed=4)
    micro = list(zip(idx.split(2), tgt.split(2), strict=True))
    loop, model = copy.deepcopy(lab.model), copy.deepcopy(lab.model)
    start = torch.cat([p.detach().flatten() for p in loop.parameters()])
    sgd = torch.optim.SGD(loop.parameters(), lr=0.5)
    for x, y in micro:  # lesson 03's loop: loss / K, one step after K micro-steps
        (lm_loss(loop(x), y) / len(micro)).backward()
    sgd.step()
    accelerator = accel.fresh_accelerator(len(micro), device=lab.device)
    prepared, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.5))
    syncs = accel.accumulate_run(accelerator, prepared, opt, micro, lm_loss)
    diff = acc.compare_grads(torch.cat([p.detach().flatten() for p in loop.parameters()]) - start,
                             torch.cat([p.detach().flatten() for p in model.parameters()]) - start)
    return Evidence(syncs == [False, False, False, True] and diff.max_rel <= 1e-5, sum(syncs),
                    "syncs in 4 micro-steps", f"accumulate() synced {syncs}; its update = the loss/K loop's "
                    f"to {diff.max_rel:.1e}")


def _c_lightning_accumulation(lab: Lab) -> Evidence:
    from helpers.frameworks import caught_warnings

    pl_run = importlib.import_module("helpers.lightning_run")
    x, y = regression_batch(16, 8, 2, seed=5, device=lab.device)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = ResidualMLP(8, 16, 1, 2).to(lab.device)
    module = pl_run.loop_module(net, torch.nn.functional.mse_loss, lr=0.1, lr_lambda=lambda u: 1 / (u + 1))
    trainer = pl_run.quiet_trainer(device=lab.device, max_steps=2, accumulate_grad_batches=4,
                                   gradient_clip_val=0.01)
    with caught_warnings():  # Lightning's notices about a CPU run and its own deprecations
        trainer.fit(module, loader)
    steps = pl_run.scheduler_of(trainer).last_epoch
    ok = len(module.clip_norms) == 2 and steps == 2 and module.clip_lrs == [0.1, 0.05]
    return Evidence(ok, len(module.clip_norms) / 2, "clips per update",
                    f"8 micro-batches, K = 4: {len(module.clip_norms)} clips, {steps} scheduler steps, "
                    f"learning rates {module.clip_lrs}")


def _c_compile_budget(lab: Lab) -> Evidence:
    comp = importlib.import_module("helpers.compiled")
    with torch.random.fork_rng(devices=[]):  # lesson 03's residual MLP: a small graph compiles fast
        torch.manual_seed(0)
        model = ResidualMLP(8, 64, 2, 2).to(lab.device)
    gen = torch.Generator().manual_seed(6)
    h = torch.randn(32, 64, generator=gen).to(lab.device).requires_grad_()
    high, low = comp.compiled_point(model, h, 1.0), comp.compiled_point(model, h, 0.0)
    full = comp.eager_point(model, h, comp.full_checkpoint, "full checkpoint")
    ok = (low.saved_bytes * 4 <= high.saved_bytes and high.recompute_flops == 0
          and 0 < low.recompute_flops <= full.recompute_flops)
    return Evidence(ok, high.saved_bytes / low.saved_bytes, "x fewer saved bytes at budget 0",
                    f"compiled MLP blocks, activation_memory_budget 1.0 -> 0.0: {_gib(high.saved_bytes)} -> "
                    f"{_gib(low.saved_bytes)} saved, recompute 0 -> {low.recompute_flops / 1e6:.2f} MFLOPs "
                    f"(full checkpoint {full.recompute_flops / 1e6:.2f})")

CLAIMS: tuple[Claim, ...] = (
    Claim("C01", "The forward pass keeps intermediate tensors (activations) because backward needs them.",
           "01 §2", "bytes kept alive by one training forward", _c_saved),
    Claim("C02", "Backward releases the activations as it uses them.", "01 §2",
           "share of the activation peak still alive when backward ends", _c_released),
    Claim("C03", "Gradient buffers take as much memory as the parameters.", "01 §1",
           "gradient bytes / parameter bytes after a step", _c_grads_equal_params),
    Claim("C04", "Adam's state (two running averages) is twice the parameters.", "01 §1",
           "optimizer-state bytes / parameter bytes", _c_adam_state),
    Claim("C05", "Activations grow with the micro-batch, in a straight line.", "01 §3",
           "linear fit of activations at micro-batch 4, 6, 8", _c_linear),
    Claim("C06", "Weights, gradients and optimizer state are a floor that the micro-batch does not move.",
           "01 §3", "spread of the floor across micro-batch 4, 6, 8", _c_floor),
    Claim("C07", "Accumulation keeps one micro-batch's activations at a time, whatever K.", "01 §5",
           "peak at K = 4 vs K = 2 for micro-batch 4", _c_peak_one_micro_batch),
    Claim("C08", "A smaller micro-batch with more steps builds the same effective batch with less memory.",
           "01 §4", "activations of 4x8 vs 8x4 (effective batch 32)", _c_smaller_micro_batch),
    Claim("C09", "Checkpointing discards a region's internal activations and keeps its boundaries.",
           "02 §2", "saved bytes with every block checkpointed vs plain", _c_ckpt_saves),
    Claim("C10", "The recomputed activations give the same gradients.", "02 §2",
           "gradient with vs without checkpointing", _c_ckpt_same_grads,
           condition="dropout off, or its RNG state replayed (preserve_rng_state=True)"),
    Claim("C11", "Checkpointing pays for the memory with extra forward compute, at most one forward.",
           "02 §3", "extra counted FLOPs of a checkpointed step / one forward of the checkpointed blocks",
           _c_ckpt_flops),
    Claim("C12", "Checkpointing does nothing for inference: without backward nothing is saved.", "02 §7",
           "bytes kept by a forward under torch.no_grad(), plain and checkpointed", _c_ckpt_inference),
    Claim("C13", "Accumulation with loss / K reproduces the full batch's gradient.", "03 §2",
           "accumulated vs full-batch gradient", _c_accum_equal,
           condition="an additive loss and no batch-dependent operations (no BatchNorm, dropout off)"),
    Claim("C14", "Without dividing by K the accumulated gradient is K times too large.", "03 §2",
           "norm ratio of unscaled accumulation to the full batch", _c_unscaled),
    Claim("C15", "A correct accumulation loop does not grow memory from one micro-step to the next.",
           "03 §3", "live bytes after micro-step 4 minus after micro-step 1", _c_flat),
    Claim("C16", "Keeping the graph alive (retain_graph, a list of losses) grows memory every micro-step.",
           "03 §3", "activation-sized growth per micro-step with the losses kept", _c_leak),
    Claim("C17", "Clip once, after accumulating; clipping every micro-batch is a different algorithm.",
           "03 §4", "clip-once vs clip-each against the clipped full batch", _c_clip),
    Claim("C18", "A short final group must be weighted by its real size, not by 1/K.", "03 §5",
           "loss/K vs n_i/N weighting on 14 examples in micro-batches of 4", _c_partial_group),
    Claim("C19", "BatchNorm normalises with each micro-batch's statistics, so accumulation differs.",
           "04 §1", "gradient error under BatchNorm vs GroupNorm", _c_batchnorm),
    Claim("C20", "Dropout draws different masks per micro-batch than for the full batch.", "04 §2",
           "gradient error with own masks vs sliced full-batch masks", _c_dropout),
    Claim("C21", "Step the learning-rate scheduler once per update, not per micro-step.", "04 §3",
           "examples seen when warmup ends, per update vs per micro-step", _c_scheduler),
    Claim("C22", "Under mixed precision, unscale once, then clip, then step and update the scaler.",
           "04 §4", "applied update vs float32; clipping before unscaling", _c_amp),
    Claim("C23", "With padding, micro-batches hold different token counts; divide by the group's tokens.",
           "05 §2", "naive token means vs the group-token-count fix", _c_tokens),
    Claim("C24", "Many small micro-steps launch more kernels for the same arithmetic.", "03 §7",
           "ops dispatched and FLOPs, 1 x 8 vs 8 x 1", _c_launches),
    Claim("C25", "Checkpointing and accumulation combine: each lowers a different part of the peak.",
           "06 §1", "peaks of 8x4, 4x8 and 4x8 checkpointed; floor unchanged", _c_combined),
    Claim("C26", "When model state alone exceeds the budget, neither technique helps.", "06 §5",
           "the planner with a budget below the measured floor", _c_state_floor, needs="helpers.planner"),
    Claim("C27", "The effective batch is micro-batch x accumulation steps x workers.", "07 §1",
           "check_batch_sizes(B=4, K=8, W=2)", _c_b_k_w, needs="helpers.distributed"),
    Claim("C28", "Transformers' checkpointing switch keeps less for backward and gives the same gradients.",
           "10 §1", "saved bytes and gradients of a Llama, plain vs checkpointing on", _c_hf_checkpointing,
           needs="transformers"),
    Claim("C29", "Trainer(gradient_accumulation_steps=K) gives the group-token-count update on padded data.",
           "10 §2", "one Trainer update vs lesson 05's loop (K = 4)", _c_trainer_accumulation,
           condition="clipping, weight decay, warmup, schedule and shuffling off; a model whose loss_type "
                     "says its labels are shifted (Llama; not GPT-2)",
           needs="transformers"),
    Claim("C30", "Accelerate's accumulate() syncs and steps once per K micro-steps, with the loss/K update.",
           "10 §3", "sync_gradients over 4 micro-steps and the update vs loss / K",
           _c_accelerate_accumulation, needs="accelerate"),
    Claim("C31", "Lightning clips once per update and steps the scheduler once per update.", "10 §4",
           "clips and scheduler steps for 2 updates of K = 4", _c_lightning_accumulation, needs="lightning"),
    Claim("C32", "torch.compile's activation memory budget trades saved bytes for recompute.", "10 §5",
           "saved bytes and recompute FLOPs of compiled MLP blocks at budget 1.0 and 0.0", _c_compile_budget,
           needs="helpers.compiled"),
)
