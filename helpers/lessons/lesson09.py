"""Lesson 09 (notebooks/09_plan_your_model.ipynb): the real step the meta profile is checked on, the widget.

Also the exercise checkers and the per-lesson protocol.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from helpers.core import units
from helpers.core.data import BatchSpec
from helpers.core.device import SCALES, by_scale
from helpers.core.validate import answer_number, choice, number_in_range, positive_int, positive_number
from helpers.measure.memory_profile import MemoryProfile
from helpers.meta.profiler import Profiler
from helpers.models.architecture_config import param_count
from helpers.models.gpt import GPT, GPTConfig
from helpers.plan.planner import recommend
from helpers.plan.preset_profiles import preset_profile
from helpers.plan.presets import DEFAULT_CUDA_MARGIN, GB, preset_spec
from helpers.plan.report import margin_line, reported_card_bytes

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "CHECK_MICRO_BATCH", "LessonSizes", "check_config", "check_exercise_1", "check_exercise_2",
    "check_exercise_3", "ESTIMATOR_COLORS",
    "estimators_figure", "lesson_sizes", "logits_memory", "per_example_bytes", "predicted_peak_bytes",
    "show_plan", "widget_latency_cases",
]


def show_plan(
    preset: str = "llama-3.2-1b",
    seq_len: int = 2048,
    micro_batch: int = 4,
    accumulation_steps: int = 8,
    checkpoint: bool = False,
    budget_gb: float = 24.0,
    precision: str = "bf16",
) -> None:
    """One widget move: the predicted peak of B x K for a preset, the estimates, and the planner's choice.

    The default is the lesson's case: Llama-3.2-1B, sequences of 2,048, bf16 mixed precision, a 24 GB
    card (`budget_gb` is the card's marketed size in decimal GB; everything printed is in GiB).
    """
    from helpers.core import plots

    b = positive_int("micro_batch", micro_batch)
    k = positive_int("accumulation_steps", accumulation_steps)
    budget = positive_number("budget_gb", budget_gb) * GB
    usable = budget * (1 - DEFAULT_CUDA_MARGIN)
    try:
        _, spec, cfg = preset_spec(preset, seq_len)
    except ValueError as err:
        print(f"no profile: {err}")
        return
    precision = choice("precision", precision, ("fp32", "bf16"))
    plain = preset_profile(preset, spec.seq_len, "none", precision=precision)
    ckpt = preset_profile(preset, spec.seq_len, "blocks", precision=precision)
    profile = ckpt if checkpoint else plain
    peak = profile.predict_peak(b, accumulation_steps=k)
    n = param_count(cfg)
    print(f"{preset} ({cfg.name}), sequence {spec.seq_len}: {n / 1e9:.2f} B parameters; Adam, "
          f"{'bf16 mixed precision' if precision == 'bf16' else 'fp32'}, CUDA target")
    print(f"effective batch B x K = {b} x {k} = {b * k}{', checkpointed' if checkpoint else ''}")
    fits = peak <= usable
    print(
        f"predicted peak {units.format_bytes(peak)} "
        f"({profile.binding_phase(b, accumulation_steps=k)} phase binds) "
        f"-> {'fits' if fits else 'does NOT fit'} in {units.format_bytes(usable)} "
        f"(after a {DEFAULT_CUDA_MARGIN:.0%} CUDA margin)"
    )
    print(margin_line(budget, usable))
    try:
        plan = recommend(usable, b * k, plain, ckpt)
        print(f"planner for {b * k} examples per update: {plan.describe()}\n  {plan.reason}")
    except ValueError as err:
        print(
            f"planner: no plan. The floor is {units.format_bytes(plain.floor_bytes)}; shard, offload or "
            f"lower the precision of the model state ({str(err).split('Remedies for the model state: ')[-1]})"
        )
    fig, (ax,) = plots.figure(width=7.0, height=3.0)
    acts = profile.activations(b) + profile.other_bytes + profile.other_bytes_per_example * b
    bars = {
        "weights only": {"parameters": 4 * n},
        "model states": {"parameters": 4 * n, "gradients": 4 * n, "optimizer_state": 8 * n},
        "ours (profiled)": {
            "parameters": 4 * n,
            "gradients": 4 * n,
            "optimizer_state": 8 * n,
            "activations": max(0.0, peak - 16 * n - max(0.0, acts - profile.activations(b))),
            "other": max(0.0, acts - profile.activations(b)),
        },
    }
    size = plots.stacked_bars(ax, bars, title=f"{preset}: {b} x {k}{' checkpointed' if checkpoint else ''}")
    tallest = max(sum(v.values()) for v in bars.values())
    card = _card_lines(ax, budget, usable, size)
    ax.set_ylim(0, 1.25 * max(tallest, card) / size)
    plots.show(fig)


def _card_lines(ax: Axes, budget: float, usable: float, unit: float) -> float:
    """Draw the card a budget stands for and the planner's limit on `ax`; return the card's bytes.

    The card is dashed, at what it reports (`plan_report.reported_card_bytes`: a budget of 24e9
    bytes, "--budget 24GB", is a card sold as 24 GB, which reports at most 24 GiB), labelled in GiB
    with the GB it is sold as; the limit is dotted, at `usable` (the budget less the CUDA margin),
    as `plan_report.margin_line` prints them. Nothing is allocated: both are capacities.
    """

    card = reported_card_bytes(budget)
    name = (f"card: at most {units.format_bytes(card)}\n(sold as {budget / GB:.0f} GB)" if card != budget
            else f"card: {units.format_bytes(card)}")
    for y, label, style, side in ((card, name, "--", "bottom"),
                                  (usable, f"plan within {units.format_bytes(usable)}", ":", "top")):
        ax.axhline(y / unit, color="crimson", ls=style, lw=1.2)  # card labelled above, limit below
        ax.annotate(label, (0.0, y / unit), xycoords=("axes fraction", "data"),
                    xytext=(2, 2 if side == "bottom" else -2), textcoords="offset points", ha="left", va=side,
                    color="crimson", fontsize=8)
    return card


ESTIMATOR_COLORS = {
    "parameters": "#4C72B0", "gradients": "#55A868", "optimizer_state": "#8172B2",
    "floor": "#2B2B2B", "activations and other": "#DD8452", "optimizer-step temporaries": "#C9A227",
}


def estimators_figure(profiles: dict[str, dict[str, MemoryProfile]], n_params: int,
                      budget_bytes: float, cuda_margin: float = DEFAULT_CUDA_MARGIN) -> Figure:
    """Weights-only and 16 B/param estimates beside the profiled peaks at micro-batch 1, one axes per case.

    Args:
        profiles: {case: {"none": plain profile, ...}}, e.g. full fine-tune and LoRA.
        n_params: the model's parameter count (the estimates are 4 and 16 bytes per parameter).
        budget_bytes: the planner's budget, as `--budget` reads it: 24e9 ("24GB") stands for a card
            sold as "24 GB", which reports at most 24 GiB (`plan_report.reported_card_bytes`).
        cuda_margin: the share of the budget the planner keeps free on CUDA.

    Returns:
        The figure: two profiled bars, the forward/backward peak (floor + activations and other) and the
        optimizer step's peak (floor + its temporaries), each block in its own colour, with one
        legend for both axes. Two lines: the card, at what it reports (labelled in GiB, with the GB it
        is sold as), and the planner's limit below it, the budget less the margin.
    """
    from helpers.core import plots

    positive_int("n_params", n_params)
    budget = positive_number("budget_bytes", budget_bytes)
    usable = budget * (1 - number_in_range("cuda_margin", cuda_margin, 0.0, 1.0, high_open=True))
    fig, axes = plots.figure(len(profiles), width=10, height=3.8)
    unit = 2**30
    seen: dict[str, object] = {}
    for ax, (name, prof) in zip(axes, profiles.items(), strict=True):
        plain = prof["none"]
        floor, passes, step = plain.floor_bytes, plain.forward_peak(1), plain.optimizer_peak(1)
        bars = {"weights\nonly": {"parameters": 4 * n_params},
                "16 B/\nparam": {"parameters": 4 * n_params, "gradients": 4 * n_params,
                               "optimizer_state": 8 * n_params},
                "ours:\nfwd/bwd": {"floor": floor, "activations and other": max(0, passes - floor)},
                "ours:\nopt. step": {"floor": floor, "optimizer-step temporaries": max(0, step - floor)}}
        peak = max(passes, step)
        for x, parts in enumerate(bars.values()):
            bottom = 0.0
            for cat, v in parts.items():
                seen[cat] = ax.bar(x, v / unit, bottom=bottom, color=ESTIMATOR_COLORS[cat], width=0.6)
                bottom += v / unit
        ax.set_xticks(range(len(bars)), list(bars))
        card = _card_lines(ax, budget, usable, unit)
        ax.set_ylim(0, 1.25 * max(peak, 16 * n_params, card) / unit)
        ax.set_ylabel("GiB")
        ax.set_title(name)
    order = [c for c in ESTIMATOR_COLORS if c in seen]
    axes[-1].legend([seen[c] for c in order], [c.replace("_", " ") for c in order], fontsize=8,
                    loc="upper left", bbox_to_anchor=(1.0, 1.0))  # one legend for both axes, outside them
    return fig


def check_config(scale: str) -> GPTConfig:
    """The small GPT whose meta profile the lesson checks against a real measurement."""
    return by_scale(
        scale,
        tiny=GPTConfig(256, 32, 64, 4, 2, dropout=0.0, fused_attention=True),
        small=GPTConfig(512, 128, 128, 4, 4, dropout=0.0, fused_attention=True),
        medium=GPTConfig(4096, 512, 512, 8, 8, dropout=0.0, fused_attention=True),
        full=GPTConfig(8192, 1024, 768, 12, 12, dropout=0.0, fused_attention=True),
    )


CHECK_MICRO_BATCH = 4


@dataclass(frozen=True)
class LessonSizes:
    """The sizes lesson 09 uses at one scale: the GPT of its only real run and that run's micro-batch."""

    config: GPTConfig
    micro_batch: int


def lesson_sizes(scale: str) -> LessonSizes:
    """Every size lesson 09 uses at `scale` ("tiny", "small", "medium" or "full")."""
    choice("scale", scale, SCALES)
    return LessonSizes(check_config(scale), CHECK_MICRO_BATCH)


def predicted_peak_bytes(scale: str) -> int:
    """The peak of the lesson's only real run: `check_config(scale)` at micro-batch 4 with Adam.

    Computed by the meta profile the lesson checks against that very run (no memory
    is allocated for it). Everything else in the lesson lives on the meta device.
    """
    choice("scale", scale, SCALES)
    cfg = check_config(scale)
    profiler = Profiler(functools.partial(GPT, cfg), BatchSpec.lm(cfg.seq_len, cfg.vocab_size), "adam")
    return profiler.step(CHECK_MICRO_BATCH).peak_bytes


def widget_latency_cases(scale: str, device: torch.device) -> dict[str, Callable[[], object]]:
    """One callable per control of the lesson's widget (all work is on the meta device)."""
    choice("scale", scale, SCALES)
    base = {
        "preset": "gpt2-xl",
        "seq_len": 1024,
        "micro_batch": 4,
        "accumulation_steps": 8,
        "checkpoint": False,
        "budget_gb": 24.0,
    }
    moves = {
        "preset llama-3.2-1b": {"preset": "llama-3.2-1b"},
        "preset llama-3.1-8b": {"preset": "llama-3.1-8b", "seq_len": 4096},
        "sequence 2048 (llama-3.2-1b)": {"preset": "llama-3.2-1b", "seq_len": 2048},
        "sequence 2048 (gpt2-xl: refused)": {"seq_len": 2048},
        "B=1": {"micro_batch": 1},
        "B=16": {"micro_batch": 16},
        "K=1": {"accumulation_steps": 1},
        "K=32": {"accumulation_steps": 32},
        "checkpoint on": {"checkpoint": True},
        "budget 80 GB": {"budget_gb": 80.0},
    }
    return {name: (lambda kw={**base, **change}: show_plan(**kw)) for name, change in moves.items()}


def check_exercise_1(floor_gb: object) -> str:
    """Exercise 1: the floor of Llama-3.1-8B with fp32 Adam, in GB (decimal)."""
    x = answer_number(floor_gb)
    truth = 0.0 if x is None else preset_profile("llama-3.1-8b", 4096, "none").floor_bytes / GB
    if x is None:
        msg = f"Give a number of GB, got {type(floor_gb).__name__}."
    elif abs(x - truth) <= 0.02 * truth:
        msg = (
            f"Correct: about {truth:.0f} GB, 16 bytes per parameter. It exceeds an 80 GB card before a "
            "single activation: no micro-batch, accumulation or checkpointing helps; "
            "shard or offload the state."
        )
    else:
        msg = "Not yet. Count 4 bytes of weights, 4 of gradients and 8 of Adam state per parameter."
    print(msg)
    return msg


def check_exercise_2(micro_batch: object, accumulation_steps: object, checkpoint: object) -> str:
    """Exercise 2: the planner's choice for gpt2-xl (sequence 1024), 40 GB card, 32 examples per update."""
    answer = (micro_batch, accumulation_steps, checkpoint)
    if answer == (None, None, None):
        msg = "Give (micro_batch, accumulation_steps, checkpoint), e.g. (4, 8, False)."
        print(msg)
        return msg
    plain, ckpt = preset_profile("gpt2-xl", 1024, "none"), preset_profile("gpt2-xl", 1024, "blocks")
    plan = recommend(40 * GB * (1 - DEFAULT_CUDA_MARGIN), 32, plain, ckpt)
    if answer == (plan.micro_batch, plan.accumulation_steps, plan.checkpoint):
        msg = f"Correct: {plan.describe()}. {plan.reason}"
    elif answer[:2] == (plan.micro_batch, plan.accumulation_steps):
        msg = "Close: the sizes are right; does that micro-batch need checkpointing to fit?"
    else:
        msg = (
            "Not yet. Move the widget to gpt2-xl, 40 GB, and try B = 32, 16, 8, ... without checkpointing "
            "first, then with it; K = 32 / B."
        )
    print(msg)
    return msg


def per_example_bytes(profile: MemoryProfile) -> float:
    """Bytes per example at the forward phase's peak: activations plus the rest that grows with the batch.

    The split between the two categories moves with the point of the pass where the peak sits
    (at one sequence of GPT-2 XL it is late in backward, at two at the loss), so the lesson
    compares their sum, the slope of the peak itself.
    """
    return profile.activation_bytes_per_example + profile.other_bytes_per_example


def check_exercise_3(bytes_saved: object) -> str:
    """Exercise 3: bytes per example that checkpointing saves for gpt2-xl at sequence 1024."""
    x = answer_number(bytes_saved)
    truth = 0.0 if x is None else (per_example_bytes(preset_profile("gpt2-xl", 1024, "none"))
                                   - per_example_bytes(preset_profile("gpt2-xl", 1024, "blocks")))
    if x is None:
        msg = f"Give a number of bytes, got {type(bytes_saved).__name__}."
    elif abs(x - truth) <= 0.03 * truth:
        msg = f"Correct: about {truth / 2**30:.2f} GiB per example, paid for with one extra forward pass."
    else:
        msg = (
            "Not yet. Subtract the checkpointed profile's lesson09.per_example_bytes from the plain one's "
            "(preset_profile('gpt2-xl', 1024, ...))."
        )
    print(msg)
    return msg


def logits_memory(tokens: int = 128, hidden: int = 64, vocab: int = 8192, chunk: int = 16) -> dict[str, int]:
    """Peak bytes of the LM head + loss + backward, measured on this CPU, with and without chunking.

    Runs `helpers.techniques.tradeoffs.full_cross_entropy` and `chunked_cross_entropy` (head and loss a
    chunk of tokens at a time, each chunk recomputed in backward) on random fp32 hidden states under
    `helpers.memory.measure_step` (the CPU allocator's record). Returns {"full": ..., "chunked": ...},
    the peak above the head's weight and the hidden states, and "logits": one fp32 logits tensor.
    """
    from helpers.measure.memory import measure_step
    from helpers.techniques.tradeoffs import chunked_cross_entropy, full_cross_entropy

    for name, value in (("tokens", tokens), ("hidden", hidden), ("vocab", vocab), ("chunk", chunk)):
        positive_int(name, value)
    gen = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(hidden, vocab, bias=False)
    h = torch.randn(tokens, hidden, generator=gen, requires_grad=True)
    y = torch.randint(vocab, (tokens,), generator=gen)
    out = {"logits": tokens * vocab * 4}
    for name, loss in (("full", lambda: full_cross_entropy(h, head.weight, y)),
                       ("chunked", lambda: chunked_cross_entropy(h, head.weight, y, chunk))):
        head.weight.grad, h.grad = None, None
        m = measure_step(lambda loss=loss: loss().backward(), model=head)
        out[name] = m.peak_bytes - m.breakdown["parameters"]
    head.weight.grad, h.grad = None, None
    return out
