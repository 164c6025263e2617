"""Token-weighted losses (lesson 05): sizes per scale, figures, the widget, exercise checkers.

The data, losses and measured steps the lesson teaches are in `helpers.techniques.tokens`.

- Sizes: `lesson_sizes(scale)` -> `TokenSizes` (data, model, sweeps and widget ranges).
- Figures: `draw_errors` (gradient errors on a log axis, exact zeros marked),
  `plot_training_curves` (naive vs fix vs full batch over updates, the drift measured by
  `helpers.accumulation.weight_distance`).
- Widget: `show_token_report`, a pure function of (model, B, K, spread).
- Exercises: `check_exercise_1` to `check_exercise_4`.
- Per-lesson protocol: `predicted_peak_bytes(scale)` (from `predicted_step_peak_bytes`),
  `widget_latency_cases(scale, device)`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from helpers.core import plots
from helpers.core.device import SCALES
from helpers.core.training import IGNORE_INDEX, cleared_grads, lm_loss
from helpers.core.validate import choice, number_in_range
from helpers.lessons import not_answered
from helpers.measure.formulas import gpt_param_count, predicted_step_peak_bytes
from helpers.models.gpt import GPT, GPTConfig
from helpers.techniques.accumulation import compare_grads, flat_grad
from helpers.techniques.token_loss import pad_sequences, split_micro_batches, variable_length_sequences
from helpers.techniques.tokens import TokenReport, accumulation_report, tiny_lm, tiny_lm_config

__all__ = [
    "ERROR_FLOOR", "TOLERANCE", "TokenSizes", "check_exercise_1", "check_exercise_2", "check_exercise_3",
    "check_exercise_4", "draw_errors", "lesson_sizes", "plot_training_curves", "predicted_peak_bytes",
    "show_token_report", "widget_latency_cases",
]

ERROR_FLOOR = 1e-9  # an exact-zero error is drawn here on a log axis, with its own marker
TOLERANCE = 1e-5  # the max_rel the lesson's checks allow for "matches the full batch"


# -- sizes -------------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenSizes:
    """How large lesson 05's experiments get at one scale.

    `n_seqs` sequences of up to `max_len` tokens make one update (the full
    batch); the GPT has `d_model` width and `n_layers` blocks and is warmed up
    for `steps` Adam steps at `lr`. `k_spread` is K in the spread sweep,
    `k_local` the micro-batches per simulated worker, `curve_k` and
    `curve_updates` set the training-curve comparison, and `widget_b` /
    `widget_k` are the widget's slider values.
    """

    n_seqs: int
    max_len: int
    vocab_size: int
    d_model: int
    n_layers: int
    steps: int
    lr: float
    k_spread: int
    k_local: int
    curve_k: int
    curve_updates: int
    widget_b: tuple[int, ...]
    widget_k: tuple[int, ...]

    def config(self) -> GPTConfig:
        """The lesson's GPT configuration (dropout 0, written-out attention)."""
        return tiny_lm_config(vocab_size=self.vocab_size, max_len=self.max_len, d_model=self.d_model,
                       n_layers=self.n_layers)

    @property
    def largest_batch(self) -> int:
        """Most sequences one full-batch step sees: the update, or the widget's largest B x K."""
        return max(self.n_seqs, max(self.widget_b) * max(self.widget_k))


_SIZES = {
    "tiny": TokenSizes(8, 16, 16, 16, 1, 80, 1e-2, 4, 1, 8, 8, (1, 2, 4), (1, 2, 4, 8)),
    "small": TokenSizes(16, 32, 32, 32, 1, 60, 1e-2, 4, 2, 16, 24, (1, 2, 4, 8), (1, 2, 4, 8, 16)),
    # the full model with half the sequences per update: about 2.3 GB at its largest step
    "medium": TokenSizes(64, 256, 256, 256, 4, 150, 3e-3, 16, 4, 16, 24, (1, 2, 4),
                         (1, 2, 4, 8, 16)),
    # about 4.6 GB at its largest step (128 sequences of 256 tokens)
    "full": TokenSizes(128, 256, 256, 256, 4, 150, 3e-3, 16, 4, 16, 24, (1, 2, 4, 8),
                       (1, 2, 4, 8, 16)),
}


def lesson_sizes(scale: str) -> TokenSizes:
    """Lesson 05's sizes at `scale` (one of `helpers.device.SCALES`)."""
    return _SIZES[choice("scale", scale, SCALES)]


# -- figures and the widget ------------------------------------------------------------------
RUN_COLORS = ("#DD8452", "#55A868", "#8172B2")  # naive, fixed, a third series
PLAIN_TICKS = FuncFormatter(lambda v, _: f"{v:g}")  # 1e-05, 0.001, 1: no 10^{n} powers on a log axis


def _log_y(ax: Axes) -> None:
    """A log y axis whose tick labels are plain numbers (1e-05, 0.01), never powers."""
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(PLAIN_TICKS)


def draw_errors(ax: Axes, xs: Sequence[float], errors: dict[str, Sequence[float]], *,
                floor: float = ERROR_FLOOR) -> None:
    """Plot gradient errors on a log axis; exact zeros sit at `floor` with a hollow marker.

    The floor and the 1e-5 tolerance are drawn and named in the legend.

    Args:
        ax: the axes.
        xs: the x values.
        errors: {label: one error per x} (naive first, then fixed).
        floor: where an exact zero is drawn, in (0, 1e-5).

    Raises:
        ValueError: for more series than `RUN_COLORS`.
    """
    number_in_range("floor", floor, 0.0, TOLERANCE, low_open=True, high_open=True)
    if len(errors) > len(RUN_COLORS):
        raise ValueError(f"at most {len(RUN_COLORS)} series, got {len(errors)}")
    zero_label = f"exact 0 (drawn at {floor:.0e})"
    for (label, values), marker, color in zip(errors.items(), "os^", RUN_COLORS, strict=False):
        ax.plot(xs, [max(v, floor) for v in values], marker=marker, ls="-", color=color,
                label=label)
        zeros = [x for x, v in zip(xs, values, strict=True) if v == 0.0]
        if zeros:
            ax.plot(zeros, [floor] * len(zeros), marker="o", ls="none", ms=11, mfc="none",
                    mec="black", label=zero_label)
            zero_label = "_nolegend_"
    ax.axhline(TOLERANCE, color="crimson", ls="--", lw=1, label="1e-5 tolerance of the checks")
    _log_y(ax)
    ax.set_ylim(floor / 3, 3.0)


def _show_report_figure(r: TokenReport) -> Figure:
    fig, (a1, a2, a3) = plots.figure(3, width=10.5, height=3.2)
    k = r.k
    a1.bar(range(k), r.tokens_per_micro_batch, color="#4C72B0")
    a1.axhline(sum(r.tokens_per_micro_batch) / k, color="black", ls=":", lw=1)
    a1.set(xlabel="micro-batch (dotted: the equal share n / K)", ylabel="valid tokens",
           title=f"B x K = {r.micro_batch} x {k} = {r.effective_batch}")
    a1.set_xticks(range(k) if k <= 8 else range(0, k, max(1, k // 8)))
    errors = {"naive\n(mean / K)": r.naive.max_rel, "fixed\n(sum / count)": r.fixed.max_rel}
    heights = [max(v, ERROR_FLOOR) for v in errors.values()]
    a2.bar(list(errors), heights, color=["#DD8452", "#55A868"],
           hatch=["//" if v == 0.0 else "" for v in errors.values()])
    for i, v in enumerate(errors.values()):
        a2.annotate(f"exact 0\n(drawn at {ERROR_FLOOR:.0e})" if v == 0.0 else f"{v:.1e}",
                    (i, max(v, ERROR_FLOOR) * 1.6), ha="center", fontsize=8)
    a2.axhline(TOLERANCE, color="crimson", ls="--", lw=1)
    a2.annotate("1e-5 tolerance", (1.5, TOLERANCE * 1.5), ha="right", color="crimson", fontsize=8)
    _log_y(a2)
    a2.set(ylim=(ERROR_FLOOR / 3, 10.0), ylabel="max_rel vs full batch", title="Gradient error")
    names = ["full batch", "naive", "fixed"]
    values = [r.full_loss, r.naive_loss, r.fixed_loss]
    a3.axhline(r.full_loss, color="black", ls="--", lw=1)
    a3.plot(names, values, "o", ms=9, color="#4C72B0")
    for i, v in enumerate(values):
        a3.annotate(f"{v:.5f}", (i, v), xytext=(0, 8), textcoords="offset points", ha="center",
                    fontsize=9)
    span = max(abs(v - r.full_loss) for v in values) or 1e-3 * r.full_loss
    a3.set_ylim(r.full_loss - 2 * span, r.full_loss + 2.5 * span)
    a3.set_xlim(-0.6, 2.6)
    a3.set(ylabel="logged loss", title="What the log prints")
    return fig


def show_token_report(
    model: GPT, micro_batch: int, k: int, spread: float, *, seed: int = 4
) -> TokenReport:
    """The widget's work: measure one (B, K, spread), print the numbers and draw them.

    Pure (see `token_weighting_report`); the figure is shown and closed.

    Args:
        model: the lesson's tiny LM.
        micro_batch, k: B and K.
        spread: how much the sequence lengths vary, in [0, 1].
        seed: seeds the data.

    Returns:
        The `TokenReport`.
    """
    r = accumulation_report(model, micro_batch, k, spread, seed=seed)
    n = sum(r.tokens_per_micro_batch)
    print(f"effective batch B x K = {micro_batch} x {k} = {r.effective_batch} sequences "
          f"({n} valid tokens), length spread {spread:.2f}")
    print(f"gradient error (max_rel): naive {r.naive.max_rel:.2e}, fixed {r.fixed.max_rel:.2e}; "
          f"logged loss: full {r.full_loss:.5f}, naive {r.naive_loss:.5f} "
          f"({r.loss_gap:+.5f}), fixed {r.fixed_loss:.5f}")
    plots.show(_show_report_figure(r))
    return r


def plot_training_curves(logged: dict[str, Sequence[float]],
                         drift: dict[str, Sequence[float]]) -> Figure:
    """Logged loss per update (left) and weight distance from the first run (right, log axis).

    Args:
        logged: {run: its logged losses}, the reference run first.
        drift: {other run: its `weight_distance` after each update}.

    Returns:
        The figure (not shown).

    Raises:
        ValueError: if either is empty, or holds more runs than there are colours.
    """
    if not logged or not drift:
        raise ValueError("give at least one run in logged and one in drift")
    if len(logged) > 1 + len(RUN_COLORS) or len(drift) > len(RUN_COLORS):
        raise ValueError(f"at most {1 + len(RUN_COLORS)} runs, got {len(logged)} and {len(drift)}")
    fig, (a1, a2) = plots.figure(2, width=10.5, height=3.4)
    colors = ("black", *RUN_COLORS)
    styles = ("-", "o-", "s:", "^-")
    for (name, values), style, color in zip(logged.items(), styles, colors, strict=False):
        a1.plot(range(1, len(values) + 1), values, style, ms=3, lw=1.4 if style == "-" else 1,
                color=color, label=name)
    a1.set(xlabel="optimizer update", ylabel="logged loss", title="Training log, same data")
    a1.legend()
    for (name, values), style, color in zip(drift.items(), styles[1:], RUN_COLORS, strict=False):
        a2.plot(range(1, len(values) + 1), [max(v, ERROR_FLOOR) for v in values], style, ms=3,
                color=color, label=name)
    _log_y(a2)
    a2.set(xlabel="optimizer update", ylabel="||w - w_full|| / ||w_full||",
           title="Distance from the full-batch weights")
    a2.legend()
    return fig


# -- exercises -----------------------------------------------------------------------------
def check_exercise_1(answer: object) -> str:
    """Exercise 1: does sorting by length make the naive error 'larger', 'smaller' or 'same'?"""
    if answer is None:
        return not_answered("pass 'larger', 'smaller' or 'same'.")
    word = str(answer).strip().lower()
    if word == "larger":
        return ("Correct: sorting puts the long sequences in one micro-batch and the short ones in "
                "another, so the token counts drift further apart and mean / K weights tokens "
                "even more unequally (it does save padding). The fix stays at round-off.")
    if word in ("smaller", "same"):
        return ("Not quite. Sorted micro-batches hold similar lengths inside each micro-batch, "
                "but what the naive loop gets wrong is the spread of token counts BETWEEN "
                "micro-batches. Measure naive_step on the sorted cut and compare.")
    return f"Answer with 'larger', 'smaller' or 'same' (got {answer!r})."


def check_exercise_2(naive_logged_loss: object, count_raises: object) -> str:
    """Exercise 2: the naive loop's logged loss with an all-padding micro-batch, and
    whether `count_valid_tokens` raised for an all-padding group (True/False)."""
    if naive_logged_loss is None or count_raises is None:
        return not_answered("pass naive_step(...).loss and True/False.")
    parts = []
    if isinstance(naive_logged_loss, int | float) and math.isnan(naive_logged_loss):
        parts.append("Correct for the naive loop: the empty micro-batch's token mean is 0 / 0, so "
                     "the log prints nan. In PyTorch today its gradient is zero, not nan, so the "
                     "update still happens, with the other micro-batches divided by K: the nan in "
                     "the log may be the only sign. The fix adds a sum of 0 and logs a number.")
    else:
        parts.append("Look again at the naive loop's logged loss: what is a token MEAN over zero "
                     "tokens? Then look at its gradient with torch.isnan(...).any().")
    if count_raises is True:
        parts.append("Correct for the group: count_valid_tokens raises ValueError, since the "
                     "group's token mean is undefined; a training loop should skip that group.")
    else:
        parts.append("Look again at count_valid_tokens: call it on labels that are all -100, "
                     "inside try/except ValueError.")
    return " ".join(parts)


_EXERCISE_3 = frozenset({"own count per worker", "global count, x W"})


def check_exercise_3(answer: object) -> str:
    """Exercise 3: which of section 5's variants match when every shard has the same tokens?

    `answer` is an iterable of the variants' names as the notebook spells them.
    """
    if answer is None:
        return not_answered("pass the names of the matching variants, e.g. {'...', '...'}.")
    if isinstance(answer, str) or not isinstance(answer, Iterable):
        return "Pass a set or list of variant names, e.g. {'global count, x W'}."
    given = {str(a).strip() for a in answer}
    if given == _EXERCISE_3:
        return ("Correct: with equal counts each worker's own count is the global count / W, so "
                "own count and averaging give the same weights as global count x W. Without x W "
                "the gradient is still W times too small.")
    missing, extra = _EXERCISE_3 - given, given - _EXERCISE_3
    hint = "Not quite."
    if extra:
        hint += f" {sorted(extra)} does not match: what does the all-reduce's mean do to it?"
    if missing:
        hint += (" One more matches: with equal token counts, what is each worker's own count "
                 "compared with the global count?")
    return hint


def check_exercise_4(loss_fn: object) -> str:
    """Exercise 4: `loss_fn(logits, labels, num_sequences_in_group)` for one micro-batch.

    Accumulated over a group, its gradient must equal that of the full batch's
    per-sequence objective (each sequence's token mean, averaged over sequences).
    """
    if loss_fn is None:
        return not_answered("pass your function loss_fn(logits, labels, num_sequences_in_group).")
    if not callable(loss_fn):
        return f"Pass a function, got {type(loss_fn).__name__}."
    model = tiny_lm(vocab_size=16, max_len=12, d_model=16, n_layers=1, seed=0)
    samples = variable_length_sequences(8, 12, 16, spread=1.0, seed=11)
    full = pad_sequences(samples)
    try:
        with cleared_grads(model):
            tok = lm_loss(model(full.input_ids), full.labels, reduction="none").view(full.labels.shape)
            valid = (full.labels != IGNORE_INDEX).sum(1)
            (tok.sum(1) / valid).mean().backward()
            reference = flat_grad(model)
        with cleared_grads(model):
            for mb in split_micro_batches(samples, 2):
                loss = loss_fn(model(mb.input_ids), mb.labels, len(samples))
                if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                    return "Your function must return a scalar tensor (one number) for one micro-batch."
                loss.backward()
            diff = compare_grads(reference, flat_grad(model))
    except Exception as exc:  # noqa: BLE001 - a learner's bug becomes a hint, never an error
        return f"Your function raised {type(exc).__name__}: {exc}"
    if diff.max_rel <= TOLERANCE:
        return (f"Correct: max_rel {diff.max_rel:.1e}. Each sequence's token mean, summed over "
                "the micro-batch and divided by the group's number of sequences: the sequence "
                "count, not the token count, is what to divide by.")
    return (f"Not yet: max_rel {diff.max_rel:.2e} against the per-sequence full batch (norm ratio "
            f"{diff.norm_ratio:.3f}). Take each row's token mean first (sum over valid tokens / "
            "valid tokens of that row), then sum the rows and divide by the group's sequences.")


# -- per-lesson protocol -------------------------------------------------------------------


def predicted_peak_bytes(scale: str) -> int:
    """Predicted peak of lesson 05's largest experiment at `scale`, in bytes (float32).

    The largest experiment is one Adam full-batch step over `largest_batch`
    sequences of `max_len` tokens (the update, or the widget's largest B x K),
    taken while the training-curve section holds two more Adam copies of the
    model (16 bytes per parameter each) and the lesson's model itself (4 bytes per
    parameter). See `predicted_step_peak_bytes`.
    """
    sizes = lesson_sizes(scale)
    cfg = sizes.config()
    others = (2 * 16 + 4) * gpt_param_count(cfg)
    return predicted_step_peak_bytes(cfg, sizes.largest_batch) + others


def widget_latency_cases(scale: str, device: torch.device) -> dict[str, Callable[[], object]]:
    """One zero-argument callable per control of lesson 05's widget, each one slider move.

    Builds the lesson's model at `scale` (without its short warm-up, which changes
    the weights but not the work) and moves B, K and the spread to their ends
    from the notebook's defaults.
    """
    sizes = lesson_sizes(scale)
    model = tiny_lm(vocab_size=sizes.vocab_size, max_len=sizes.max_len, d_model=sizes.d_model,
                    n_layers=sizes.n_layers, seed=0).to(device)
    b0 = 4 if 4 in sizes.widget_b else sizes.widget_b[-1]
    k0 = 4 if 4 in sizes.widget_k else sizes.widget_k[-1]
    b_max, k_max = max(sizes.widget_b), max(sizes.widget_k)

    def move(micro_batch: int = b0, k: int = k0, spread: float = 0.75) -> Callable[[], object]:
        return lambda: show_token_report(model, micro_batch, k, spread)

    return {
        "B=1": move(micro_batch=1),
        f"B={b_max}": move(micro_batch=b_max),
        "K=1": move(k=1),
        f"K={k_max}": move(k=k_max),
        f"B={b_max}, K={k_max}": move(micro_batch=b_max, k=k_max),
        "spread 0": move(spread=0.0),
        "spread 1": move(spread=1.0),
    }
