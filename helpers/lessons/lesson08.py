"""Lesson 08 (notebooks/08_review.ipynb): follow-ups answered from the ledger, the quiz, the widget."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from helpers.core.device import pick_device
from helpers.core.training import lm_loss
from helpers.core.validate import choice, positive_int
from helpers.ledger.claim_lab import LAB_CONFIG, Lab
from helpers.ledger.review import Ledger
from helpers.measure.formulas import gpt_step_peak_bytes, predicted_update_peak_bytes
from helpers.models.gpt import GPT, GPTConfig, deep_gpt_setup, explainer_config
from helpers.plan.planner import RULE_COROLLARY, decision_rule
from helpers.techniques import accumulation as acc

__all__ = [
    "EXERCISES", "INTERVIEW_PATH", "INTERVIEW_WORDS", "QUIZ", "Feedback", "LessonSizes", "Question",
    "accumulation_check", "cheat_sheet_numbers", "check_answer", "check_exercise_1", "check_exercise_2",
    "explore_accumulation", "followup_answers", "interview_answer", "interview_path_markdown", "lesson_sizes",
    "predicted_peak_bytes", "quiz_markdown", "quiz_widget", "show_quiz", "widget_latency_cases", "word_count",
]


def _val(ledger: Ledger, claim_id: str) -> float:
    row = ledger.row(claim_id)
    if row.value is None:
        raise ValueError(f"{claim_id} has no measured value ({row.error})")
    return row.value


def followup_answers(ledger: Ledger) -> dict[str, str]:
    """The explainer's three follow-up questions, answered with numbers from `ledger`.

    Args:
        ledger: from `helpers.review.run_ledger`.

    Returns:
        {question: answer}.
    """
    return {
        "Is accumulation exactly a bigger batch?": (
            f"The gradient is the same: loss/K matched the full batch to {_val(ledger, 'C13'):.1e} (C13). "
            f"The training is not always: BatchNorm left a gradient error of {_val(ledger, 'C19'):.2f} "
            f"(C19), own dropout masks {_val(ledger, 'C20'):.2f} (C20), a scheduler stepped per micro-step "
            f"ended warmup {_val(ledger, 'C21'):.0f}x too early (C21), and naive token means were off by "
            f"{_val(ledger, 'C23'):.1e} (C23)."
        ),
        "Can the two be combined?": (
            f"Yes. They act on different parts of the peak: the 4x8 checkpointed row peaked at "
            f"{_val(ledger, 'C25'):.2f}x the 8x4 row with the same floor (C25); checkpointing alone cut "
            f"saved activations {_val(ledger, 'C09'):.1f}x (C09) for {_val(ledger, 'C11'):.2f} of one "
            "forward of the checkpointed blocks in extra FLOPs (C11)."
        ),
        "Which one first?": (
            "Profile first, then follow one rule (the planner's, `helpers.planner.DECISION_RULE`):\n\n"
            f"{decision_rule().removesuffix(RULE_COROLLARY).rstrip()}\n\n"
            f"The evidence here: activations grow with the micro-batch (R² {_val(ledger, 'C05'):.4f}, C05) "
            f"above a floor that does not move (spread {_val(ledger, 'C06'):.1e}, C06), and below the floor "
            "the planner refuses (C26); accumulation adds no FLOPs but launches "
            f"{_val(ledger, 'C24'):.1f}x the ops when 8 examples go as 8 micro-batches of 1 (C24); "
            "checkpointing costs "
            f"{_val(ledger, 'C11'):.2f} of a forward of the blocks (C11). {RULE_COROLLARY}"
        ),
    }


INTERVIEW_WORDS = 30  # the one-line answer's budget (issue 24)


def interview_answer(ledger: Ledger) -> str:
    """The one-line interview answer (at most `INTERVIEW_WORDS` words), with the ledger's typical numbers.

    The numbers are lesson 02's model (C09, C11) and the fast lab's accumulation check (C24): the
    lessons' own typical cases, not an extreme one.

    Args:
        ledger: from `helpers.review.run_ledger`.

    Returns:
        The answer.
    """
    share = ledger.row("C11").figure("extra_share_of_step")
    return (f"Checkpointing recomputes activations: {_val(ledger, 'C09'):.1f}x less saved memory for about "
            f"one extra forward (+{share:.0%} FLOPs). Accumulation sums micro-batch gradients: a "
            "K-times-bigger batch in one micro-batch's memory, no extra FLOPs.")


def word_count(text: str) -> int:
    """Words of `text`, split on whitespace (how the 30-word budget is counted).

    Args:
        text: the text.

    Returns:
        The count.
    """
    return len(text.split())


def cheat_sheet_numbers(ledger: Ledger) -> list[tuple[str, str, str]]:
    """The cheat sheet's measured numbers.

    Args:
        ledger: from `helpers.review.run_ledger`.

    Returns:
        (what, measured here, claim id) rows.
    """
    c24 = ledger.row("C24")
    return [
        ("checkpointing: activations saved for backward", f"{_val(ledger, 'C09'):.1f}x fewer bytes", "C09"),
        ("checkpointing: extra compute",
         f"{_val(ledger, 'C11'):.2f} of one forward of the blocks, "
         f"+{ledger.row('C11').figure('extra_share_of_step'):.0%} of the step's FLOPs", "C11"),
        ("peak = floor + B x activations per example",
         f"straight line in B (R² {_val(ledger, 'C05'):.4f}); the floor moves by {_val(ledger, 'C06'):.1e}",
         "C05, C06"),
        ("accumulation, loss / K: gradient vs the full batch",
         f"max relative difference {_val(ledger, 'C13'):.1e}", "C13"),
        ("accumulation: compute", f"same FLOPs (within {c24.figure('flops_difference'):.1%}), "
         f"{_val(ledger, 'C24'):.1f}x the ops as 8 micro-batches of 1", "C24"),
        ("half the micro-batch, twice K (same effective batch)",
         f"activations x {_val(ledger, 'C08'):.2f}", "C08"),
        ("both: 4 x 8 checkpointed against 8 x 4", f"peak x {_val(ledger, 'C25'):.2f}, same floor", "C25"),
        ("not exact: BatchNorm", f"gradient error {_val(ledger, 'C19'):.2f}", "C19"),
        ("not exact: dropout, own masks per micro-batch", f"gradient error {_val(ledger, 'C20'):.2f}", "C20"),
        ("not exact: scheduler stepped per micro-step",
         f"warmup ends {_val(ledger, 'C21'):.0f}x too early", "C21"),
        ("not exact: mean token loss / K on padded data", f"gradient error {_val(ledger, 'C23'):.1e}", "C23"),
    ]


# The two-hour interview path (issue 24): each lesson's core path (its sections before
# "Going deeper"), in order, with the minutes a careful read takes. README.md lists the same parts.
INTERVIEW_PATH: tuple[tuple[str, str, int], ...] = (
    ("01", "where memory goes: the floor, activations per example, the peak", 20),
    ("02", "activation checkpointing: what is kept, what is recomputed, what it costs", 25),
    ("03", "gradient accumulation: loss / K, the memory per micro-step, throughput", 20),
    ("04", "when accumulation is not a bigger batch: BatchNorm, dropout, the scheduler, loss scaling", 15),
    ("06", "combining them and choosing: the measured table, the planner, the decision rule", 20),
    ("08", "the cheat sheet, the one-line answer and the quiz", 20),
)


def interview_path_markdown() -> str:
    """`INTERVIEW_PATH` as a numbered Markdown list with the minutes and their total."""
    lines = [f"{i}. Lesson {n} (core path, {m} min): {what}."
             for i, (n, what, m) in enumerate(INTERVIEW_PATH, 1)]
    total = sum(m for _, _, m in INTERVIEW_PATH)
    return "\n".join(lines) + f"\n\nTotal: {total} minutes, about {total / 60:.0f} hours."


@dataclass(frozen=True)
class Question:
    """A multiple-choice question: options, the index of the right one, and why."""

    id: str
    prompt: str
    options: tuple[str, ...]
    answer: int
    explanation: str
    lesson: str


@dataclass(frozen=True)
class Feedback:
    """Whether an answer was right, and the explanation with the lesson to revisit."""

    correct: bool
    message: str


QUIZ: tuple[Question, ...] = (
    Question("Q1", "Your job runs out of memory and the profile shows activations are 70% of the peak. "
             "Which knob attacks the cause?",
             ("Gradient accumulation with the same micro-batch", "Activation checkpointing",
              "A bigger learning rate", "Switching Adam for SGD"), 1,
             "Checkpointing discards activations and recomputes them; accumulation with the same micro-batch "
             "keeps the same activations. (A smaller micro-batch with more accumulation steps shrinks them "
             "too, for no extra FLOPs: the rule takes it first, down to the micro-batch that keeps the "
             "device busy; lesson 06.)", "02"),
    Question("Q2", "You accumulate K = 8 micro-batches of mean loss and forget to divide by K. The "
             "accumulated gradient is...",
             ("the same as the full batch's", "8 times the full batch's", "1/8 of the full batch's",
              "random"), 1,
             "Eight mean losses are summed, so the gradient is eight times that of the mean over all the "
             "examples.", "03"),
    Question("Q3", "Which memory does gradient accumulation NOT reduce?",
             ("Saved activations of one micro-batch", "Parameters, gradients and optimizer state",
              "The logits of one micro-batch", "Temporary buffers of the forward pass"), 1,
             "Accumulation shrinks the micro-batch; the model state is a floor it cannot move.", "01"),
    Question("Q4", "With every block checkpointed, the recompute costs, per backward pass, about...",
             ("nothing", "one extra forward of the checkpointed region, at most",
              "one extra backward", "two extra forwards"), 1,
             "Only the region's forward runs again, once per backward pass: once per micro-step in the "
             "usual loop.", "02"),
    Question("Q5", "Where should the learning-rate scheduler step when you accumulate?",
             ("after every micro-step", "once per optimizer update", "once per epoch only",
              "before zero_grad of each micro-step"), 1,
             "The schedule counts updates; stepping per micro-step runs it K times too fast.", "04"),
    Question("Q6", "Micro-batches hold 2,000 and 1,000 valid tokens. To match the full batch's token-mean "
             "loss you should...",
             ("divide each micro-batch's mean by 2", "sum token losses and divide by 3,000",
              "average the two means", "drop the shorter micro-batch"), 1,
             "Every token must weigh the same: divide the summed token loss by the group's token count.",
             "05"),
    Question("Q7", "B = 4, K = 8, W = 4 data-parallel workers. The effective batch is...",
             ("16", "32", "128", "512"), 2, "B x K x W = 4 x 8 x 4 = 128 examples per update.", "07"),
    Question("Q8", "Memory grows after every micro-step of your accumulation loop. The likely cause is...",
             ("the optimizer state", "a kept reference to the graph (retain_graph or a list of losses)",
              "gradient buffers", "dropout masks"), 1,
             "A correct loop frees each micro-batch's activations in its own backward; "
             "something is holding the graph.",
             "03"),
)


def check_answer(question_id: str, answer: int) -> Feedback:
    """Check the option index `answer` for `question_id`; explain and point to the lesson."""
    ids = [q.id for q in QUIZ]
    q = QUIZ[ids.index(choice("question_id", question_id, ids))]
    if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < len(q.options):
        raise ValueError(f"answer must be an option index in [0, {len(q.options) - 1}], got {answer!r}")
    if answer == q.answer:
        return Feedback(True, f"Correct. {q.explanation} (lesson {q.lesson})")
    return Feedback(False, f"Not quite: the answer is \"{q.options[q.answer]}\". {q.explanation} "
                           f"Revisit lesson {q.lesson}.")


def quiz_markdown() -> str:
    """The quiz as static Markdown: each question with its options, the answer folded in `<details>`.

    Lesson 08 keeps this text as a markdown cell, so a saved notebook (GitHub, HTML) shows the quiz
    without a kernel; a test checks that the cell is exactly this text, so the two cannot drift.
    """
    parts = []
    for q in QUIZ:
        options = "\n".join(f"- {chr(ord('a') + i)}) {o}" for i, o in enumerate(q.options))
        parts.append(f"**{q.id}.** {q.prompt}\n\n{options}\n\n<details><summary>Answer</summary>\n\n"
                     f"{chr(ord('a') + q.answer)}) {q.options[q.answer]}. {q.explanation} "
                     f"(lesson {q.lesson})\n\n</details>")
    return "\n\n".join(parts)


def quiz_widget() -> object:
    """The quiz as ipywidgets: a dropdown per question and immediate feedback (ipywidgets 7 and 8)."""
    import ipywidgets as w

    boxes = []
    for q in QUIZ:
        pick = w.RadioButtons(options=[(o, i) for i, o in enumerate(q.options)], value=None,
                              layout={"width": "max-content"})
        out = w.HTML()

        def answer(change: dict, q: Question = q, out: w.HTML = out) -> None:
            if change["new"] is None:
                return
            fb = check_answer(q.id, change["new"])
            out.value = f"<b>{'✔' if fb.correct else '✘'}</b> {fb.message}"

        pick.observe(answer, names="value")
        boxes.append(w.VBox([w.HTML(f"<b>{q.id}.</b> {q.prompt}"), pick, out]))
    return w.VBox(boxes)


def show_quiz() -> object:
    """Display `quiz_widget()` with a plain-text fallback, so a saved notebook shows a sentence.

    The questions themselves are the static `quiz_markdown` cell above it.

    Returns:
        The widget.
    """
    from IPython.display import display

    from helpers.core.display import widget_bundle

    box = quiz_widget()
    display(widget_bundle(box, "[the quiz as clickable options: run the notebook to use them; "
                               "the questions and their folded answers are above]"), raw=True)
    return box


EXERCISES = {
    1: ("Which claim's row would fail if a lesson's loop forgot to divide the loss by K? Give its id.",
        "C14", "C14 measures the norm ratio of unscaled accumulation: it would read K, not 1."),
    2: ("B = 2, K = 16, W = 8: how many examples does one optimizer update see?", 256,
        "B x K x W = 2 x 16 x 8 = 256 (C27)."),
}


def check_exercise_1(answer: object) -> str:
    """Exercise 1: which claim's row fails if a loop forgot to divide the loss by K? (a claim id)"""
    return _check_exercise(1, answer)


def check_exercise_2(answer: object) -> str:
    """Exercise 2: B = 2, K = 16, W = 8: how many examples does one optimizer update see? (a number)"""
    return _check_exercise(2, answer)


def _check_exercise(number: int, answer: object) -> str:
    """Check an answer to exercise `number` of lesson 08; returns 'Correct: ...' or a hint."""
    number = choice("number", number, tuple(EXERCISES))
    _, expected, why = EXERCISES[number]
    given = answer.strip().upper() if isinstance(answer, str) else answer
    if given == expected:
        return f"Correct: {why}"
    return f"Not yet: {EXERCISES[number][0]} Hint: look at the ledger's rows and their evidence column."


def accumulation_check(micro_batch: int, steps: int, lab: Lab) -> tuple[acc.GradDiff, acc.GradDiff]:
    """C13 and C14 at micro-batch size B and K steps: (loss / K vs full batch, no / K vs full batch)."""
    micro_batch, steps = positive_int("micro_batch", micro_batch), positive_int("steps", steps)
    x, y = lab.tokens(micro_batch * steps, seed=1)
    full = acc.full_batch_grad(lab.model, lm_loss, x, y)
    scaled = acc.compare_grads(full, acc.accumulated_grad(lab.model, lm_loss, x, y, micro_batch))
    raw = acc.compare_grads(full, acc.accumulated_grad(lab.model, lm_loss, x, y, micro_batch, scale=False))
    return scaled, raw


def explore_accumulation(micro_batch: int, steps: int, lab: Lab | None = None) -> None:
    """Lesson 08's widget: re-check C13 and C14 at micro-batch size B and K steps, and draw them.

    Args:
        micro_batch, steps: B and K.
        lab: the ledger's models (default: a new `Lab` on this device).
    """
    from helpers.core import plots

    scaled, raw = accumulation_check(micro_batch, steps, lab or Lab(pick_device()))
    effective = f"effective batch B x K = {micro_batch} x {steps} = {micro_batch * steps}"
    print(effective)
    fig, (ax,) = plots.figure(width=6, height=2.8)
    ax.bar(["loss / K", "no / K"], [scaled.norm_ratio, raw.norm_ratio], color=["#55A868", "#C44E52"])
    ax.axhline(1.0, color="k", lw=1)
    ax.set(ylabel="norm / full-batch norm", title=effective)
    plots.show(fig)
    print(f"loss / K: max relative difference {scaled.max_rel:.1e} (C13); "
          f"no / K: norm ratio {raw.norm_ratio:.3f} = K (C14)")


@dataclass(frozen=True)
class LessonSizes:
    """The models the ledger checks at one scale (see `lesson_sizes`).

    `lab` is the fast lab's GPT (the same at every scale), `explainer` lesson 01's model, and
    `deep` with `deep_micro_batch` lesson 02's checkpointed GPT; `widget_moves` are the
    (B, K) pairs of the explore widget's latency cases.
    """

    lab: GPTConfig
    explainer: GPTConfig
    deep: GPTConfig
    deep_micro_batch: int
    widget_moves: tuple[tuple[int, int], ...]


_WIDGET_MOVES = ((4, 4), (8, 4), (4, 8))


def lesson_sizes(scale: str) -> LessonSizes:
    """Every size the ledger uses at `scale` ("tiny", "small", "medium" or "full")."""
    choice("scale", scale, ("tiny", "small", "medium", "full"))
    deep, b = deep_gpt_setup(scale)
    return LessonSizes(LAB_CONFIG, explainer_config(scale), deep, b, _WIDGET_MOVES)


def predicted_peak_bytes(scale: str) -> int:
    """The ledger's largest check at `scale`, from the formulas of the lessons whose models it uses.

    The fast lab (`LAB_CONFIG`) is the same at every scale and stays tiny. The headline claims
    grow with the scale: the 8 x 4 Adam row on lesson 01's model (C08, C25), as
    `helpers.measure.formulas.predicted_update_peak_bytes` predicts it, and a step of lesson 02's model at its
    micro-batch (C09, C11), as `helpers.measure.formulas.gpt_step_peak_bytes` predicts it.
    """
    choice("scale", scale, ("tiny", "small", "medium", "full"))
    n_params = sum(p.numel() for p in GPT(LAB_CONFIG).parameters())
    per_example = 4 * LAB_CONFIG.seq_len * LAB_CONFIG.d_model * LAB_CONFIG.n_layers * 40  # generous
    return max(16 * n_params + 8 * per_example, predicted_update_peak_bytes(explainer_config(scale), 8),
               int(gpt_step_peak_bytes(*deep_gpt_setup(scale))))


def widget_latency_cases(scale: str, device: torch.device) -> dict[str, Callable[[], object]]:
    """One slider move each of lesson 08's explore widget (B and K)."""
    lab = Lab(device)
    return {f"B={b}, K={k}": (lambda b=b, k=k: explore_accumulation(b, k, lab))
            for b, k in _WIDGET_MOVES}
