"""The measurements behind lessons 01-07's claims in the ledger (lesson 08).

Each `_c_*(lab)` returns `Evidence`.

Every check calls instruments only (memory, phases, checkpointing, costs, accumulation,
pitfalls, tokens, planner), never a lesson module, so a lesson and its ledger row measure
with the same code. `helpers.ledger.claims.CLAIMS` names them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from helpers.core import training
from helpers.core.data import regression_batch
from helpers.core.training import lm_loss
from helpers.ledger.claim_lab import LAB_CONFIG, SWEEP, Evidence, Lab
from helpers.ledger.claim_lab import gib as _gib
from helpers.measure import formulas
from helpers.measure.memory import micro_step_memory, new_live_bytes, record_timeline, saved_activation_bytes
from helpers.models.gpt import deep_gpt_setup
from helpers.models.nets import ResidualMLP, param_bytes
from helpers.techniques import accumulation as acc
from helpers.techniques import amp, costs, pitfalls, tokens
from helpers.techniques.checkpointing import apply_ac
from helpers.techniques.update_memory import ConfigMemory, activation_sweep, measure_config


# -- the checks --------------------------------------------------------------------------
def _adam_step(lab: Lab) -> tuple[dict[str, float], int]:
    return lab.once("adam_step", lambda: _measure_adam_step(lab))


def _step_timeline(lab: Lab, optimizer_cls: type[torch.optim.Optimizer]):  # noqa: ANN202 - a Timeline
    """The memory timeline of one training step of the lab model on 4 sequences (grads cleared after)."""
    model, (idx, tgt) = lab.model, lab.tokens(4)
    opt = optimizer_cls(model.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        lm_loss(model(idx), tgt).backward()
        opt.step()

    try:
        return record_timeline(step, model=model, optimizer=opt)
    finally:
        opt.zero_grad(set_to_none=True)


def _measure_adam_step(lab: Lab) -> tuple[dict[str, float], int]:
    return _step_timeline(lab, torch.optim.Adam).at(-1), param_bytes(lab.model)


def _c_saved(lab: Lab) -> Evidence:
    idx, tgt = lab.tokens(4)
    saved = saved_activation_bytes(lambda: lm_loss(lab.model(idx), tgt))
    training.clear_grads(lab.model)
    params = param_bytes(lab.model)
    return Evidence(saved > 0, saved, "bytes",
                    f"a forward of 4 sequences keeps {_gib(saved)} for backward ({saved / params:.1f}x the "
                    f"parameters)")


def _c_released(lab: Lab) -> Evidence:
    timeline = _step_timeline(lab, torch.optim.SGD)
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
            training.clear_grads(model)
    forwards = extra / region
    from helpers.core.units import format_flops  # matplotlib, imported only when the check runs

    return Evidence(0 < extra <= region, forwards, "forwards of the checkpointed blocks",
                    f"lesson 02's model: {format_flops(extra)} extra per forward+backward; one forward "
                    f"of its {len(model.blocks)} blocks is {format_flops(region)} (+{extra / plain:.0%} of "
                    "the step; counted by FlopCounterMode)", {"extra_share_of_step": extra / plain})


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
    training.clear_grads(model)
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
    ref = amp.amp_update(model, loss, x, y, 8, amp=False)
    good = amp.amp_update(model, loss, x, y, 8, order="correct")
    bad = amp.amp_update(model, loss, x, y, 8, order="clip_before_unscale")
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
                    f"(within {same_flops:.1%})", {"flops_difference": same_flops})


def _c_state_floor(lab: Lab) -> Evidence:
    planner = importlib.import_module("helpers.plan.planner")
    memory_profile = importlib.import_module("helpers.measure.memory_profile")
    sweep = _sweep(lab)  # the profile reuses C05's measurements
    floor = next(iter(sweep.values())).floor_bytes
    try:
        profile = memory_profile.fit_profile(sweep.__getitem__, micro_batches=SWEEP)
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
