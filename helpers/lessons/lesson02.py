"""Lesson 02 (notebooks/02_activation_checkpointing.ipynb): sizes, the trade-off widget, exercise checkers.

The widget's measuring (memory, FLOPs and time of B x K) is `helpers.techniques.costs.TradeOffs`; the
sqrt(n) chains are `helpers.techniques.segments`, the checkpointing itself `helpers.techniques.checkpointing`.
"""

from __future__ import annotations

import functools
import gc
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

from helpers.core import plots, units
from helpers.core.device import SCALES, by_scale
from helpers.core.validate import answer_number, choice
from helpers.measure.formulas import KORTHIKANTI, gpt_step_peak_bytes, korthikanti_terms
from helpers.measure.memory import saved_activation_bytes
from helpers.models.gpt import GPTBlock, GPTConfig, deep_gpt_setup, explainer_config, explainer_model
from helpers.techniques.costs import TradeOff, TradeOffs
from helpers.techniques.segments import EXERCISE_CHAIN, chain_layer_costs, divisors, make_chain, segment_sweep

__all__ = [
    "CHAIN_LENGTHS", "REFERENCE_ROWS", "WIDGET_MAX_STEPS", "LessonSizes", "TradeOffLab",
    "block_shape",
    "chain_shape", "check_exercise_1", "check_exercise_2", "check_exercise_3", "check_exercise_4",
    "exercise_3_measurement", "lesson_sizes", "plot_trade_offs", "predicted_peak_bytes", "selective_shape",
    "widget_latency_cases", "widget_max_micro_batch",
]


def block_shape(scale: str) -> tuple[int, int, int, int]:
    """The single block of section 1.

    Args:
        scale: "tiny", "small", "medium" or "full".

    Returns:
        (b, s, h, a): micro-batch, sequence, hidden, heads.
    """
    return by_scale(scale, tiny=(4, 32, 32, 2), small=(8, 64, 64, 4), medium=(4, 1024, 512, 8),
                    full=(8, 1024, 1024, 16))


def selective_shape(scale: str) -> tuple[int, int, int, int]:
    """The block that tests Korthikanti's selective recomputation (a*s/h = 16).

    Args:
        scale: "tiny", "small", "medium" or "full".

    Returns:
        (b, s, h, a): micro-batch, sequence, hidden, heads.
    """
    return by_scale(scale, tiny=(2, 64, 16, 4), small=(4, 256, 64, 4), medium=(2, 1024, 512, 8),
                    full=(4, 1024, 1024, 16))


def chain_shape(scale: str) -> tuple[int, int]:
    """The layer chains of the sqrt(n) section.

    Args:
        scale: "tiny", "small", "medium" or "full".

    Returns:
        (width, batch).
    """
    return by_scale(scale, tiny=(32, 16), small=(128, 64), medium=(1024, 512), full=(1024, 1024))


def widget_max_micro_batch(scale: str) -> int:
    """The largest micro-batch the widget's slider offers.

    Args:
        scale: "tiny", "small", "medium" or "full".

    Returns:
        That micro-batch.
    """
    return by_scale(scale, tiny=8, small=16, medium=8, full=8)


WIDGET_MAX_STEPS = 16


CHAIN_LENGTHS = (16, 36, 64)


@dataclass(frozen=True)
class LessonSizes:
    """The sizes lesson 02 uses at one scale (see `lesson_sizes`).

    `block` and `selective` are (b, s, h, a) of the single blocks of sections 1 and 5,
    `chain` is (width, batch) of the sqrt(n) chains, `gpt` and `gpt_micro_batch` the GPT that
    sections 2-9 checkpoint; the widget's sliders go up to `widget_max_micro_batch` and
    `widget_max_steps`.
    """

    block: tuple[int, int, int, int]
    selective: tuple[int, int, int, int]
    chain: tuple[int, int]
    chain_lengths: tuple[int, ...]
    gpt: GPTConfig
    gpt_micro_batch: int
    widget_max_micro_batch: int
    widget_max_steps: int


def lesson_sizes(scale: str) -> LessonSizes:
    """Every size lesson 02 uses at `scale` ("tiny", "small", "medium" or "full")."""
    choice("scale", scale, SCALES)
    cfg, b = deep_gpt_setup(scale)
    return LessonSizes(block_shape(scale), selective_shape(scale), chain_shape(scale), CHAIN_LENGTHS, cfg, b,
                       widget_max_micro_batch(scale), WIDGET_MAX_STEPS)


def predicted_peak_bytes(scale: str) -> int:
    """Predicted peak memory of lesson 02's largest experiment at `scale`, from its formulas.

    The candidates: the section GPT's Adam step (section 7), the widget's model at
    its largest micro-batch (section 10), and the single blocks of sections 1 and 5
    (twice their Korthikanti bytes: saved tensors plus backward's temporaries).
    No tensor is allocated.
    """
    choice("scale", scale, SCALES)
    cfg, b = deep_gpt_setup(scale)
    candidates = [gpt_step_peak_bytes(cfg, b),
                  gpt_step_peak_bytes(explainer_config(scale), widget_max_micro_batch(scale))]
    for bb, s, h, a in (block_shape(scale), selective_shape(scale)):
        candidates.append(2 * sum(korthikanti_terms(s=s, b=bb, h=h, a=a, act_bytes=4, mask_bytes=4).values()))
    width, batch = chain_shape(scale)
    candidates.append(max(CHAIN_LENGTHS) * 8 * width * batch * 4)  # MLP chain, k = 1: ~6-7 boundaries a layer
    return int(max(candidates))


REFERENCE_ROWS = ((8, 4, False), (4, 8, False), (4, 8, True))


class TradeOffLab(TradeOffs):
    """The widget's lab: `helpers.techniques.costs.TradeOffs` on one model, and `show`, the widget's work.

    Args:
        model: the GPT measured.
        repeats: timed runs of each micro-step.
        optimizer: a name in `OPTIMIZERS`.
    """

    def show(self, micro_batch: int = 4, steps: int = 8, checkpointed: bool = False) -> None:
        """The widget's work: your B x K beside the explainer's three rows, drawn and printed."""
        yours = self.measure(micro_batch, steps, checkpointed)
        print(f"effective batch B x K = {micro_batch} x {steps} = {micro_batch * steps}")
        if yours is None:
            print(f"{micro_batch} x {steps}: OOM on this device; pick a smaller micro-batch")
            return
        rows = [r for r in (self.measure(*ref) for ref in REFERENCE_ROWS) if r is not None]
        labels = [r.label for r in rows] + [f"yours: {yours.label}"]
        rows.append(yours)
        fig = plot_trade_offs(rows, [label.replace(", ", "\n").replace(": ", ":\n") for label in labels])
        for label, r in zip(labels, rows, strict=True):
            print(f"{label:>26}: peak {units.format_bytes(r.memory.peak_bytes):>10}, activations "
                  f"{units.format_bytes(r.memory.breakdown['activations']):>10}, extra FLOPs/update "
                  f"{100 * r.extra_flops / r.plain_flops_per_update:+4.0f}%, time/update "
                  f"{r.time_per_update.describe()}")
        print("Time is K x the median micro-step of interleaved runs: shown, not asserted "
              "(noisy on a shared CPU).")
        plots.show(fig)


def plot_trade_offs(rows: Sequence[TradeOff], labels: Sequence[str]) -> object:
    """Left: peak broken into floor / activations / other. Right: time per update, extra FLOPs on top."""
    if not rows or len(rows) != len(labels):
        raise ValueError(f"need one label per row, got {len(rows)} rows and {len(labels)} labels")
    fig, (left, right) = plots.figure(2, width=11, height=3.6)
    data = {label: {"parameters + gradients + optimizer_state": r.memory.floor_bytes,
                    "activations": r.memory.breakdown["activations"],
                    "other": r.memory.breakdown["other"]} for label, r in zip(labels, rows, strict=True)}
    plots.stacked_bars(left, data, title=f"peak of one update ({rows[0].memory.method})")
    left.tick_params(axis="x", labelsize=8)
    ms = [1e3 * r.time_per_update.median for r in rows]
    err = [[1e3 * (r.time_per_update.median - r.time_per_update.low) for r in rows],
           [1e3 * (r.time_per_update.high - r.time_per_update.median) for r in rows]]
    xs = range(len(rows))
    right.bar(xs, ms, yerr=err, capsize=3, color=["#4C72B0"] * (len(rows) - 1) + ["#DD8452"])
    for x, r in zip(xs, rows, strict=True):
        top = 1e3 * r.time_per_update.high
        right.annotate(f"{100 * r.extra_flops / r.plain_flops_per_update:+.0f}% FLOPs", (x, top),
                       ha="center", va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
    right.set_xticks(list(xs), list(labels), fontsize=8)
    right.set_ylim(0, 1.15 * max(1e3 * r.time_per_update.high for r in rows))
    right.set_ylabel("ms per update (median, min-max)")
    right.set_title("time per update: shown, not asserted")
    return fig


def widget_latency_cases(scale: str, device: torch.device) -> dict[str, Callable[[], object]]:
    """One zero-argument callable per widget control move, doing that move's full work.

    Builds the widget's model (`helpers.models.gpt.explainer_model`) and a `TradeOffLab`
    as the notebook does; each case redraws from the default (B=4, K=8, off).
    """
    choice("scale", scale, SCALES)
    lab = TradeOffLab(explainer_model(scale, device))
    top = widget_max_micro_batch(scale)
    return {
        "B=2": lambda: lab.show(2, 8, False),
        f"B={top}": lambda: lab.show(top, 8, False),
        "K=1": lambda: lab.show(4, 1, False),
        f"K={WIDGET_MAX_STEPS}": lambda: lab.show(4, WIDGET_MAX_STEPS, False),
        "checkpoint on": lambda: lab.show(4, 8, True),
    }


def check_exercise_1(s: object) -> str:
    """Exercise 1: the sequence length at which 5as/h overtakes 34 for h = 64, a = 4 (16-bit)."""
    value = answer_number(s)
    exact = 34 * 64 / (5 * 4)  # 108.8
    if value is None:
        return f"Hint: answer with a number (a sequence length), got {s!r}."
    if abs(value - exact) <= 1.5:
        # The same break-even in fp32 with 4-byte CPU masks, from the per-term table itself.
        terms = korthikanti_terms(s=1, b=1, h=1, a=1, act_bytes=4, mask_bytes=4)
        by_size = {"sbh": 0.0, "as2b": 0.0}
        for (_, _, size, _), value_bytes in zip(KORTHIKANTI, terms.values(), strict=True):
            by_size[size] += value_bytes
        linear, square = by_size["sbh"], by_size["as2b"]
        return (f"Correct: 5as/h > 34 means s > 34h / (5a) = {exact:.1f}, so from s = 109 on the s^2 "
                f"terms are the bigger part (in fp32 with 4-byte CPU masks: {square:g}as/h > {linear:g}, "
                f"s > {linear * 64 / (square * 4):g}).")
    return "Hint: set 5 * a * s / h equal to 34 and solve for s with h = 64, a = 4."


class _PolicyFailed(Exception):
    """A learner's policy raised; the message names its exception."""


def _checkpointed_or_raise(block: torch.nn.Module, x: torch.Tensor, context: Callable) -> torch.Tensor:
    """`checkpoint(block, x + 0, use_reentrant=False, context_fn=context)`, failures cleaned up.

    On torch 2.5 the non-reentrant checkpoint keeps its forward context (the policy's dispatch
    mode) in a generator that is closed only when the failed call's frames are collected. Closed
    after an outer mode (the measuring tracker) has exited, it restores torch's "a dispatch mode is
    on" flag, and `torch.compile` then compiles nothing for the rest of the process. So the
    exception is dropped and garbage collected here, inside the tracker, and a plain one raised.
    """
    try:
        return checkpoint(block, x + 0, use_reentrant=False, context_fn=context)
    except Exception as exc:  # noqa: BLE001 - a learner's policy may fail in any way
        message = f"{type(exc).__name__}: {exc}"
    gc.collect()  # the failed call's generator exits now, in order
    raise _PolicyFailed(message)


def check_exercise_2(policy: object) -> str:
    """Exercise 2: a selective policy that saves only the softmax output.

    Runs a small block with the policy and compares what it keeps with "full"
    (only the input) and "none" (everything): the policy should keep the input
    plus one softmax output, a*s^2*b floats.
    """
    if not callable(policy):
        return ("Hint: pass your policy function (ctx, op, *args, **kwargs) -> CheckpointPolicy, "
                f"got {policy!r}.")
    b, s, h, a = 2, 32, 16, 2
    with torch.random.fork_rng(devices=[]):  # leaves the notebook's random stream alone
        torch.default_generator.manual_seed(0)
        block = GPTBlock(GPTConfig(seq_len=s, d_model=h, n_heads=a, dropout=0.0))
        x = torch.randn(b, s, h, requires_grad=True)
    context = functools.partial(create_selective_checkpoint_contexts, policy)
    try:
        kept = saved_activation_bytes(lambda: _checkpointed_or_raise(block, x, context))
    except _PolicyFailed as failed:
        return f"Hint: running a block with your policy raised {failed}"
    full = saved_activation_bytes(lambda: checkpoint(block, x + 0, use_reentrant=False))
    softmax = a * s * s * b * 4
    if abs(kept - (full + softmax)) <= 0.02 * softmax:
        return (f"Correct: it keeps {kept} B = the block input ({full} B) + one softmax output "
                f"({softmax} B). In FLOPs it costs about as much as full checkpointing: every matmul "
                "is recomputed.")
    return (f"Hint: your policy keeps {kept} B; the input alone is {full} B and one softmax output "
            f"{softmax} B. Return MUST_SAVE only for torch.ops.aten._softmax.default.")


def exercise_3_measurement(n: int = 16, scale: str = "tiny") -> dict[str, tuple[float, int]]:
    """Exercise 3 measured as section 4 measures: (m/c, best k by saved bytes) per chain kind.

    Builds an `n`-layer "linear" and "linear-relu" chain at `chain_shape(scale)`, takes
    m and c from `chain_layer_costs` and the best k from `segment_sweep` over the
    divisors of `n`. Runs on the CPU in well under a second at "tiny".
    """
    width, batch = chain_shape(scale)
    out = {}
    with torch.random.fork_rng(devices=[]):  # leaves the notebook's random stream alone
        torch.default_generator.manual_seed(0)
        x = torch.randn(batch, width)
        for kind in ("linear", EXERCISE_CHAIN):
            chain = make_chain(n, width, kind)
            m, c = chain_layer_costs(chain, x)
            points = segment_sweep(chain, x, divisors(n))
            best = min(points, key=lambda p: p.saved_bytes).segments
            out[kind] = (m / c, best)
    return out


def check_exercise_3(m_over_c: object) -> str:
    """Exercise 3: m/c of a Linear + ReLU layer, checked against the lesson's own measurement.

    The truth is measured, as section 4 measures: `chain_layer_costs` on a
    "linear-relu" chain (`exercise_3_measurement`). The ReLU keeps its output and the
    next Linear keeps that same tensor as its input, one storage counted once, so m/c
    is about 1, as for the plain Linear chain, and the best k does not move.
    """
    value = answer_number(m_over_c)
    if value is None:
        return f"Hint: answer with the ratio m/c as a number, got {m_over_c!r}."
    measured = exercise_3_measurement()
    ratio, best = measured[EXERCISE_CHAIN]
    plain_ratio, plain_best = measured["linear"]
    if abs(value - ratio) <= 0.1:
        return (f"Correct: measured m/c = {ratio:.2f} (the Linear chain: {plain_ratio:.2f}). The ReLU keeps "
                "its output, and that output is the next Linear's saved input: one storage, kept once. So "
                f"the best k does not move: {best} segments for n = 16 with the ReLUs, {plain_best} without, "
                f"sqrt(m·n/c) = {math.sqrt(ratio * 16):.1f}.")
    if abs(value - 2 * ratio) <= 0.1:
        return ("Hint: 2 counts one tensor twice. What the ReLU keeps (its output) is the tensor the next "
                "Linear keeps (its input): autograd stores it once. Measure m with ckpt.chain_layer_costs.")
    return ("Hint: count what backward needs: a Linear keeps its input, a ReLU its output. Which of them "
            "are the same tensor? Measure m and c with ckpt.chain_layer_costs on the new chain.")


def check_exercise_4(flops_factor: object, peak_factor: object) -> str:
    """Exercise 4: doubling K at a fixed B multiplies extra FLOPs per update and the peak by what?"""
    f, p = answer_number(flops_factor), answer_number(peak_factor)
    if f is None or p is None:
        return f"Hint: answer with two numbers, got {flops_factor!r}, {peak_factor!r}."
    if abs(f - 2) <= 0.05 and abs(p - 1) <= 0.05:
        return ("Correct: the recompute runs once per backward pass, and the loop makes one backward per "
                "micro-step, so extra FLOPs per update double; the peak holds one micro-batch's activations "
                "at a time, so it stays flat.")
    if abs(f - 2) <= 0.05:
        return ("Half right: the FLOPs double. Look at the peak again: how many micro-batches are "
                "alive at once?")
    return ("Hint: the recompute happens once per backward pass through the blocks, and the loop runs one "
            "backward per micro-step. How many micro-steps does doubling K add?")
