"""Lesson 10 (notebooks/10_frameworks_and_compiler.ipynb): sizes, figures, widgets, exercise checkers.

The measuring lives in instruments: `helpers.frameworks.installed` (finding and importing the
frameworks), `helpers.frameworks.hf` (Transformers), `helpers.frameworks.accel` (Accelerate),
`helpers.frameworks.lightning_run` (Lightning), `helpers.frameworks.compiled` (the compiler's memory budget)
and `helpers.techniques.tradeoffs` (optimizer in backward, chunked loss, offloading).

- Sizes: `lesson_sizes(scale)` -> `Sizes`; `gpt_config(sizes)`, `lm_samples(sizes, n)`.
- Figures: `plot_pareto(curve, others)`; tables print with `helpers.core.display.text_table`, the
  frameworks' versions with `helpers.frameworks.installed.versions_table`.
- Widgets: `show_accumulate(micro_batch, steps)` (Accelerate against lesson 05's loop; without
  Accelerate, lesson 05's two loops, `loop_errors`) and
  `BudgetExplorer(sizes, device, curve)` (the compiler's budget at a micro-batch size).
- Exercises: `check_exercise_1` ... `check_exercise_4`.
- Per-lesson protocol: `predicted_peak_bytes(scale)`, `widget_latency_cases(scale, device)`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from helpers.core import plots, units
from helpers.core.device import SCALES
from helpers.core.display import text_table
from helpers.core.training import warmup_cosine
from helpers.core.validate import answer_number, choice, number_in_range, positive_int
from helpers.frameworks import compiled, installed
from helpers.lessons import not_answered
from helpers.measure.formulas import gpt_step_peak_bytes
from helpers.models.gpt import GPT, GPTConfig, seeded_gpt
from helpers.techniques.accumulation import compare_grads
from helpers.techniques.token_loss import count_valid_tokens, split_micro_batches, variable_length_sequences
from helpers.techniques.tokens import fixed_step, full_batch_step, naive_step

__all__ = [
    "BudgetExplorer", "Sizes", "check_exercise_1", "check_exercise_2", "check_exercise_3", "check_exercise_4",
    "gpt_config", "lesson_sizes", "lm_samples", "loop_errors", "plot_pareto", "predicted_peak_bytes",
    "show_accumulate", "token_gpt_config", "widget_latency_cases",
]

SPREAD = 0.75  # lesson 05's length spread: lengths from 25% to 100% of max_len


# -- sizes -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sizes:
    """How large lesson 10's experiments are at one scale.

    `lm` sizes the Transformers models (`helpers.frameworks.hf_models.causal_lm`); `micro_batch` (B),
    `k` (K) and `lr` set every accumulation comparison; the GPT (`d_model`, `heads`,
    `seq_len`, `layers`, `vocab`) is the lessons' own model, used with Accelerate, the
    compiler and the trade-offs; `ce_tokens` x `ce_vocab` are the large-vocabulary logits,
    cut into chunks of `ce_chunk`; `widget_b` / `widget_k` are the sliders' maxima.
    """

    lm: dict[str, int]
    micro_batch: int
    k: int
    lr: float
    d_model: int
    heads: int
    seq_len: int
    layers: int
    vocab: int
    ce_tokens: int
    ce_vocab: int
    ce_chunk: int
    widget_b: int
    widget_k: int
    updates: int = 2
    clip: float = 0.05
    extra: dict[str, int] = field(default_factory=dict)


_SIZES = {
    "tiny": Sizes(dict(vocab_size=64, hidden=32, layers=2, heads=2, max_len=16), 2, 2, 0.5,
                  32, 2, 16, 2, 64, 256, 2048, 16, 4, 4),  # 16 chunks: fixed costs small beside the logits
    "small": Sizes(dict(vocab_size=256, hidden=64, layers=2, heads=4, max_len=32), 4, 4, 0.5,
                   64, 4, 64, 2, 256, 512, 8192, 64, 8, 8),
    "medium": Sizes(dict(vocab_size=8192, hidden=256, layers=4, heads=8, max_len=128), 8, 4, 0.5,
                    256, 8, 256, 4, 8192, 4096, 32768, 512, 16, 8),
    "full": Sizes(dict(vocab_size=32768, hidden=512, layers=6, heads=8, max_len=256), 8, 8, 0.5,
                  512, 8, 512, 6, 32768, 8192, 128256, 1024, 16, 16),  # Llama-3's vocabulary
}


def lesson_sizes(scale: str) -> Sizes:
    """The sizes of every experiment of lesson 10 at `scale` (one of `helpers.device.SCALES`)."""
    return _SIZES[choice("scale", scale, SCALES)]


def gpt_config(sizes: Sizes) -> GPTConfig:
    """The lessons' GPT at these sizes: dropout 0, attention written out (lesson 02's model).

    Args:
        sizes: the lesson's `Sizes`.

    Returns:
        The `GPTConfig`.
    """
    return GPTConfig(vocab_size=sizes.vocab, seq_len=sizes.seq_len, d_model=sizes.d_model,
                     n_heads=sizes.heads, n_layers=sizes.layers, dropout=0.0)


def token_gpt_config(sizes: Sizes) -> GPTConfig:
    """The lessons' GPT sized like the Transformers models (`lm`), for lesson 05's sequences.

    Args:
        sizes: the lesson's `Sizes`.

    Returns:
        The `GPTConfig`.
    """
    lm = sizes.lm
    return GPTConfig(vocab_size=lm["vocab_size"], seq_len=lm["max_len"], d_model=lm["hidden"],
                     n_heads=lm["heads"], n_layers=lm["layers"], dropout=0.0)


def lm_samples(sizes: Sizes, n: int, *, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`n` of lesson 05's variable-length sequences (lengths 25-100% of `lm["max_len"]`).

    Args:
        sizes: the lesson's `Sizes`.
        n: sequences.
        seed: seeds them.

    Returns:
        (input ids, labels) pairs.
    """
    return variable_length_sequences(positive_int("n", n), sizes.lm["max_len"], sizes.lm["vocab_size"],
                                     spread=SPREAD, seed=seed)


# -- text and figures --------------------------------------------------------------------------
def plot_pareto(curve: Sequence[compiled.RecomputePoint], others: Sequence[compiled.RecomputePoint],
                *, highlight: compiled.RecomputePoint | None = None, title: str = "") -> object:
    """Saved activation bytes against recompute FLOPs: the compiled budgets and eager policies.

    Args:
        curve: the compiled points, one per budget, joined by a line.
        others: other points (the eager policies), one marker each.
        highlight: a point to ring.
        title: the axes title.

    Returns:
        The figure (not shown).
    """
    fig, (ax,) = plots.figure(width=7.6, height=4.2)
    unit, size = plots.byte_unit(max(p.saved_bytes for p in [*curve, *others]))
    ax.plot([p.recompute_flops / 1e6 for p in curve], [p.saved_bytes / size for p in curve],
            marker="o", color="#4C72B0", label="torch.compile, activation_memory_budget")
    for p in curve:
        ax.annotate(p.label.rsplit(" ", 1)[-1], (p.recompute_flops / 1e6, p.saved_bytes / size),
                    textcoords="offset points", xytext=(6, 4), fontsize=8, color="#4C72B0")
    markers = iter("sD^vP")
    for p in others:
        ax.scatter([p.recompute_flops / 1e6], [p.saved_bytes / size], marker=next(markers, "x"), s=55,
                   zorder=3, label=p.label)
    if highlight is not None:
        ax.scatter([highlight.recompute_flops / 1e6], [highlight.saved_bytes / size], s=160,
                   facecolors="none", edgecolors="#C44E52", linewidths=2, zorder=4, label=highlight.label)
    ax.set_xlabel("recompute: backward MFLOPs beyond the plain backward (FlopCounterMode)")
    ax.set_ylabel(f"saved activations ({unit})")
    ax.set_title(title or "What the backward keeps vs what it recomputes")
    ax.legend(fontsize=8, loc="upper right")
    return fig


# -- widget 1: Accelerate against the loop -----------------------------------------------------
_WIDGET_MODELS: dict[tuple[str, str], GPT] = {}


def _widget_model(scale: str, device: torch.device) -> GPT:
    key = (scale, str(device))
    if key not in _WIDGET_MODELS:
        _WIDGET_MODELS[key] = seeded_gpt(token_gpt_config(lesson_sizes(scale)), device)
    return _WIDGET_MODELS[key]


def accumulate_errors(micro_batch: int, steps: int, *, scale: str = "small",
                      device: torch.device | str = "cpu") -> tuple[list[bool], float, float]:
    """Accelerate's accumulate loop on B x K padded sequences, against lesson 05's loop.

    Returns the `sync_gradients` of each micro-step and the max_rel gradient error of
    the token-mean loss (the naive loop) and of `accel.token_loss` (Accelerate's recipe).
    """
    from helpers.core.training import lm_loss
    from helpers.frameworks import accel

    positive_int("micro_batch", micro_batch)
    positive_int("steps", steps)
    device = torch.device(device)
    model = _widget_model(scale, device)
    mbs = split_micro_batches(lm_samples(lesson_sizes(scale), micro_batch * steps, seed=7), micro_batch,
                              device=device)
    reference = fixed_step(model, mbs).grad
    n_group = count_valid_tokens([mb.labels for mb in mbs])
    errors, syncs = [], []
    for loss_fn in (lm_loss, lambda lg, lb: accel.token_loss(lg, lb, n_group, steps)):
        syncs, grad = accel.stepped_gradient(model, [(mb.input_ids, mb.labels) for mb in mbs], loss_fn, steps,
                                             device=device)
        errors.append(compare_grads(reference, grad).max_rel)
    return syncs, errors[0], errors[1]


def loop_errors(micro_batch: int, steps: int, *, scale: str = "small",
                device: torch.device | str = "cpu") -> tuple[float, float]:
    """Lesson 05's two loops on B x K padded sequences, against one padded batch of all of them.

    Needs no framework: widget 1 shows this when Accelerate is not installed.

    Args:
        micro_batch, steps: B and K.
        scale: the lesson's scale.
        device: where it runs.

    Returns:
        The max_rel gradient error of the naive loop (token mean / K) and of the fix (summed
        token loss / the group's token count).
    """
    positive_int("micro_batch", micro_batch)
    positive_int("steps", steps)
    device = torch.device(device)
    model = _widget_model(scale, device)
    samples = lm_samples(lesson_sizes(scale), micro_batch * steps, seed=7)
    mbs = split_micro_batches(samples, micro_batch, device=device)
    reference = full_batch_step(model, samples).grad
    return (compare_grads(reference, naive_step(model, mbs).grad).max_rel,
            compare_grads(reference, fixed_step(model, mbs).grad).max_rel)


def show_accumulate(micro_batch: int = 4, steps: int = 4, *, scale: str = "small",
                    device: torch.device | str = "cpu") -> None:
    """Widget 1: the effective batch, then Accelerate's sync pattern and both gradient errors for B and K.

    Without Accelerate it shows lesson 05's two loops instead (`loop_errors`), so the B and K
    controls work whatever is installed.

    Args:
        micro_batch, steps: B and K.
        scale: the lesson's scale.
        device: where it runs.
    """
    print(f"effective batch B x K = {micro_batch} x {steps} = {micro_batch * steps} padded sequences")
    if installed.missing("accelerate"):
        naive, fixed = loop_errors(micro_batch, steps, scale=scale, device=device)
        print(f"Accelerate is not installed ({installed.install_hint(['accelerate'])}); lesson 05's loops "
              f"alone, the optimizer stepping after micro-step {steps}:")
        print(text_table([("token mean of each micro-batch / K (naive)", f"{naive:.2e}"),
                          ("summed token loss / the group's tokens (lesson 05)", f"{fixed:.2e}")],
                         ("loss back-propagated per micro-step", "max_rel vs one padded batch")))
        return
    syncs, naive, recipe = accumulate_errors(micro_batch, steps, scale=scale, device=device)
    print("sync_gradients per micro-step: " + " ".join("S" if s else "." for s in syncs)
          + f"  ({sum(syncs)} sync, {len(syncs) - sum(syncs)} accumulate-only)")
    print(text_table([("token mean of each micro-batch (naive)", f"{naive:.2e}"),
                      ("accel.token_loss (group count x K)", f"{recipe:.2e}")],
                     ("loss passed to accelerator.backward", "max_rel vs lesson 05's loop")))


# -- widget 2: the compiler's budget -----------------------------------------------------------
class BudgetExplorer:
    """The compiled blocks at a micro-batch size and budget, drawn on the lesson's measured curve.

    Each (B, budget) is compiled and measured once (about a second on a CPU), then cached;
    `show(micro_batch, budget)` is widget 2.

    Args:
        sizes: the lesson's `Sizes`.
        device: where the blocks run.
        curve: section 5's measured points (they fill the cache).
        others: the eager policies' points, drawn beside the curve.
    """

    def __init__(self, sizes: Sizes, device: torch.device, curve: Sequence[compiled.RecomputePoint],
                 others: Sequence[compiled.RecomputePoint] = ()) -> None:
        self.sizes, self.device, self.curve, self.others = sizes, device, list(curve), list(others)
        self.model = seeded_gpt(gpt_config(sizes), device)
        # What section 5 measured needs no second compile: the numbers depend on shapes, not values.
        self.cache: dict[tuple[int, float], compiled.RecomputePoint] = {
            (sizes.micro_batch, p.budget): p for p in self.curve if p.budget is not None}

    def point(self, micro_batch: int, budget: float) -> compiled.RecomputePoint:
        """The measured point for `micro_batch` sequences at `budget` (cached)."""
        key = (positive_int("micro_batch", micro_batch), number_in_range("budget", budget, 0.0, 1.0))
        if key not in self.cache:
            gen = torch.Generator().manual_seed(micro_batch)
            shape = (micro_batch, self.sizes.seq_len, self.sizes.d_model)
            h = torch.randn(shape, generator=gen).to(self.device)
            self.cache[key] = compiled.compiled_point(self.model, h.requires_grad_(), budget,
                                                      label=f"B = {micro_batch}, budget {budget:g}")
        return self.cache[key]

    def show(self, micro_batch: int = 4, budget: float = 0.5) -> None:
        """Widget 2: print the point and draw it on the curve measured in section 5."""
        p = self.point(micro_batch, budget)
        print(f"micro-batch B = {micro_batch}, activation_memory_budget = {budget:g}: saved "
              f"{units.format_bytes(p.saved_bytes)} ({units.format_bytes(p.saved_bytes / micro_batch)} per "
              f"sequence), recompute {p.recompute_flops / 1e6:.1f} MFLOPs "
              f"({p.recompute_flops / max(p.baseline_flops, 1):.0%} of the plain backward)")
        plots.show(plot_pareto(self.curve, self.others, highlight=p,
                               title=f"Section 5's curve (B = {self.sizes.micro_batch}) and your point"))


# -- exercises ---------------------------------------------------------------------------------
def check_exercise_1(fraction: object) -> str:
    """Exercise 1: the second update's learning rate (a fraction of `learning_rate`) under the
    Trainer's default schedule, with `max_steps=2`. The checker asks the installed Transformers'
    own scheduler (`transformers.get_scheduler`), the one the Trainer builds."""
    value = answer_number(fraction)
    if value is None:
        return not_answered("pass a number, e.g. 0.25 for a quarter of the learning rate.")
    import transformers

    from helpers.frameworks.hf import SWITCHED_OFF

    default = transformers.TrainingArguments.__dataclass_fields__["lr_scheduler_type"].default
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = transformers.get_scheduler(default, opt, num_warmup_steps=0, num_training_steps=2)
    opt.step()
    sched.step()
    truth = sched.get_last_lr()[0]
    why = next(w for n, _, w in SWITCHED_OFF if n == "lr_scheduler_type")
    if abs(value - truth) <= 1e-6:
        return (f"Correct: {truth:g}. The default {getattr(default, 'value', default)!r} schedule decays "
                f"the rate to 0 over max_steps, so a two-update run takes its second step at {truth:g} x the "
                f"rate: {why}. One update hides it, which is why section 2 could compare one.")
    return (f"Not quite. The default schedule is {getattr(default, 'value', default)!r} with no warmup over "
            "max_steps=2: where does it stand after one scheduler step?")


def check_exercise_2(second_lr: object, *, scale: str = "small") -> str:
    """Exercise 2: the second update's learning rate if the scheduler stepped every micro-batch."""
    value = answer_number(second_lr)
    if value is None:
        return not_answered("pass a learning rate (a number).")
    s = lesson_sizes(scale)
    right, per_update = s.lr * warmup_cosine(4 * s.k)(s.k), s.lr * warmup_cosine(4 * s.k)(1)
    if abs(value - right) <= 1e-9 + 1e-6 * right:
        return (f"Correct: {right:g}. Stepped per micro-batch, the warmup has advanced K = {s.k} steps "
                f"by the second update (Lightning issue #1476), instead of 1 ({per_update:g}).")
    if abs(value - per_update) <= 1e-9 + 1e-6 * per_update:
        return (f"That ({per_update:g}) is what Lightning does with interval 'step': one scheduler step "
                f"per update. Per micro-batch, K = {s.k} steps have passed by the second update.")
    return ("Not quite. The factor is warmup_cosine(4K)(u) for scheduler step u; which u is the second "
            "update at?")


def check_exercise_3(policy: object) -> str:
    """Exercise 3: the `CheckpointPolicy` that lets torch.compile save less than the policy asked."""
    if policy is None:
        return not_answered("pass a CheckpointPolicy or its name, e.g. 'MUST_SAVE'.")
    name = str(getattr(policy, "name", policy)).strip().upper().removeprefix("CHECKPOINTPOLICY.")
    if name == "PREFER_SAVE":
        return ("Correct: PREFER_SAVE. The partitioner treats it as no constraint and keeps only its own "
                "cut. MUST_SAVE is kept at the default budget (a little more than the compiler's cut), and "
                "PREFER_RECOMPUTE is read as a must in this torch (section 11 measured both).")
    if name == "MUST_SAVE":
        return ("Not quite: at the default budget the compiler keeps what MUST_SAVE asks. (Only a budget of "
                "0.0 overrides it, and every other tag too.) Which one left the compiler's own cut?")
    if name in ("MUST_RECOMPUTE", "PREFER_RECOMPUTE"):
        return (f"Not quite: {name} asks to keep nothing of that op, and the compiler recomputes it, so it "
                "cannot keep less than asked. Which save policy left the compiler's own cut?")
    return f"Answer with one of MUST_SAVE, PREFER_SAVE, MUST_RECOMPUTE, PREFER_RECOMPUTE (got {policy!r})."


def check_exercise_4(steps: object, *, scale: str = "small") -> str:
    """Exercise 4: optimizer steps each parameter takes in one update of K micro-batches, in backward."""
    value = answer_number(steps)
    if value is None:
        return not_answered("pass a number: read optimizers[p].state[p]['step'] after one update.")
    k = lesson_sizes(scale).k
    if value == k:
        return (f"Correct: {k}. Each micro-batch's backward completes every gradient once, and the hook "
                "steps at once: K small updates from K different points, not one from the sum.")
    return f"Not quite. How many backward passes complete a parameter's gradient in one update of K = {k}?"


# -- per-lesson protocol -----------------------------------------------------------------------
def predicted_peak_bytes(scale: str) -> int:
    """Predicted peak of lesson 10's largest experiment at `scale`, in bytes (float32).

    The larger of: the full (not chunked) cross-entropy, which holds about three logits-sized
    tensors (logits, softmax, their gradient) beside the head and its gradient; and one Adam
    step of the lesson's GPT at the widget's largest micro-batch (`gpt_step_peak_bytes`:
    Korthikanti's per-layer activations in fp32 with CPU masks, 16 bytes per parameter, three
    logits tensors).
    """
    s = lesson_sizes(scale)
    logits = s.ce_tokens * s.ce_vocab * 4
    ce = 3 * logits + 2 * 4 * s.ce_vocab * s.d_model + 2 * 4 * s.ce_tokens * s.d_model
    return int(max(ce, gpt_step_peak_bytes(gpt_config(s), max(s.widget_b, s.micro_batch))))


def widget_latency_cases(scale: str, device: torch.device) -> dict[str, Callable[[], object]]:
    """One zero-argument callable per slider move of lesson 10's two widgets (Accelerate, budget)."""
    s = lesson_sizes(scale)
    explorer = BudgetExplorer(s, device, curve=[], others=[])
    explorer.curve = [explorer.point(s.micro_batch, b) for b in (1.0, 0.0)]

    def accumulate(b: int, k: int) -> Callable[[], object]:
        return lambda: show_accumulate(b, k, scale=scale, device=device)

    return {
        "B=1": accumulate(1, s.k), f"B={s.widget_b}": accumulate(s.widget_b, s.k),
        "K=1": accumulate(s.micro_batch, 1), f"K={s.widget_k}": accumulate(s.micro_batch, s.widget_k),
        "budget 0": lambda: explorer.show(s.micro_batch, 0.0),
        "budget 1": lambda: explorer.show(s.micro_batch, 1.0),
    }

