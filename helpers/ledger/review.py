"""The claims ledger: every claim of the explainer, checked live on this device (lesson 08).

Each `Claim` is one sentence of the explainer, restated, with the lesson that teaches
it and a quick check that measures it again here, in well under a second or two, by
reusing the lessons' own helpers. `run_ledger()` runs the checks and returns one `Row`
per claim: the measured evidence (a number with its unit) and pass/fail. A check that
raises becomes a failed row carrying the error; it never stops the ledger.

Command line (the one-command health check for a GPU box, Colab or a torch upgrade)::

    python -m helpers.review                      # the table; exit 1 if any row fails
    python -m helpers.review --only C01,C14       # a subset
    python -m helpers.review --markdown ledger.md # also write it as Markdown

The claims and their checks are in `helpers.ledger.claims`. The quiz in the lesson (`QUIZ`,
`check_answer`) lives here, so its answers are tested.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from helpers.core import training
from helpers.core.device import lesson_scale, memory_method, pick_device
from helpers.core.display import markdown_table
from helpers.core.display import progress as progress_bar
from helpers.core.units import format_bytes
from helpers.core.validate import choice
from helpers.frameworks.installed import FRAMEWORKS, missing
from helpers.ledger.claim_lab import Lab
from helpers.ledger.claims import CLAIMS, Claim

__all__ = [
    "Ledger", "Row", "evidence_table", "format_table", "main", "readme_block", "run_check", "run_ledger",
    "to_markdown", "write_readme",
]


# -- running the ledger ----------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    """One checked claim: its evidence, pass/fail, the time the check took, and any error.

    `figures` are the other named numbers the check measured (`Evidence.figures`).
    """

    claim: Claim
    passed: bool
    value: float | None
    unit: str
    detail: str
    seconds: float
    error: str | None = None
    figures: Mapping[str, float] = field(default_factory=dict)

    def figure(self, name: str) -> float:
        """The named figure `name` this row's check measured (ValueError if it has none)."""
        if name not in self.figures:
            raise ValueError(f"{self.claim.id} measured no figure {name!r}; it has {sorted(self.figures)} "
                             f"({self.error or 'no error'})")
        return float(self.figures[name])


@dataclass(frozen=True)
class Ledger:
    """The rows, the claims that wait for a lesson, and where they were measured."""

    rows: list[Row]
    pending: list[Claim]
    device: str
    torch_version: str
    scale: str
    method: str

    @property
    def passed(self) -> bool:
        """True when every checked row passed."""
        return all(r.passed for r in self.rows)

    def row(self, claim_id: str) -> Row:
        """The row of `claim_id` (KeyError if it was not run)."""
        for r in self.rows:
            if r.claim.id == claim_id:
                return r
        raise KeyError(f"{claim_id} is not in this ledger; ids run: {[r.claim.id for r in self.rows]}")


def _available(claim: Claim) -> bool:
    """Whether what the claim's check needs is here: a framework must also run with this torch."""
    if not claim.needs:
        return True
    if claim.needs in FRAMEWORKS:
        return not missing(claim.needs)
    return importlib.util.find_spec(claim.needs) is not None


def _select(only: Sequence[str] | None, claims: Sequence[Claim]) -> list[Claim]:
    if only is None:
        return list(claims)
    known = [c.id for c in claims]
    wanted = [choice("claim id", i.strip().upper(), known) for i in only if i.strip()]
    return [c for c in claims if c.id in wanted]


def run_check(claim: Claim, lab: Lab) -> Row:
    """Run one claim's check; an exception becomes a failed row with its message."""
    start = time.perf_counter()
    try:
        ev = claim.run(lab)
    except Exception as exc:  # noqa: BLE001 - a failing check is a failed row, never a crash
        training.clear_grads(lab.model)
        return Row(claim, False, None, "", "", time.perf_counter() - start, f"{type(exc).__name__}: {exc}")
    return Row(claim, bool(ev.passed), float(ev.value), ev.unit, ev.detail, time.perf_counter() - start,
               figures=dict(ev.figures))


def run_ledger(
    only: Sequence[str] | None = None, *, progress: bool = True, device: torch.device | None = None,
    claims: Sequence[Claim] = CLAIMS,
) -> Ledger:
    """Run the quick check of every claim (or of the ids in `only`) on this device.

    Claims whose lesson module does not exist yet are listed as `pending`, not run.

    Args:
        only: the claim ids to check (default: all).
        progress: show `helpers.core.display.progress`: in a notebook it keeps its final state when
            saved; in a terminal it is a tqdm bar on stderr.
        device: where to run (default: `pick_device()`).
        claims: the claims to choose from.

    Returns:
        The `Ledger`: one row per claim checked, the pending ones, and where it ran.
    """
    device = device or pick_device()
    chosen = _select(only, claims)
    lab = Lab(device)
    available = {c.id: _available(c) for c in chosen}
    runnable = [c for c in chosen if available[c.id]]
    rows = []
    with torch.random.fork_rng(devices=[]):
        for claim in progress_bar(runnable, "checking claims") if progress else runnable:
            rows.append(run_check(claim, lab))
    return Ledger(rows, [c for c in chosen if not available[c.id]], str(device), torch.__version__,
                  lesson_scale(device), memory_method(device))


# A count noun after the number 1 reads in the singular: "1 forward of ...", never "1 forwards of ...".
_SINGULAR = {"forwards": "forward", "micro-batches": "micro-batch", "syncs": "sync", "clips": "clip",
             "examples": "example", "ops": "op"}


def _unit(number: str, unit: str) -> str:
    first, space, rest = unit.partition(" ")
    return _SINGULAR[first] + space + rest if number == "1" and first in _SINGULAR else unit


def _value(row: Row) -> str:
    if row.value is None:
        return "-"
    v = row.value
    if row.unit.split(" ")[0] == "bytes":  # human units: "645.3 KiB of model state", never raw counts
        return f"{format_bytes(v)}{row.unit[len('bytes'):]}"
    if v == 0 or abs(v) >= 1000:
        text = f"{v:,.0f}"
    elif abs(v) >= 1e-3:
        text = f"{v:.3g}"  # three digits: "18.8 x fewer saved bytes", "0.5 activations", never "18.8363"
    else:
        text = f"{v:.1e}"
    return f"{text} {_unit(text, row.unit)}"


def format_table(ledger: Ledger) -> str:
    """The ledger as a plain-text table, one line per row, then the pending claims."""
    lines = [f"{'id':<4} {'result':<6} {'lesson':<7} {'evidence':<46} claim"]
    for r in ledger.rows:
        result = "pass" if r.passed else "FAIL"
        lines.append(f"{r.claim.id:<4} {result:<6} {r.claim.lesson:<7} {_value(r)[:46]:<46} {r.claim.text}")
        if r.error:
            lines.append(f"{'':<12} error: {r.error}")
    for c in ledger.pending:
        lines.append(f"{c.id:<4} {'wait':<6} {c.lesson:<7} "
                     f"{'(needs ' + c.needs + ')':<46} {c.text}")
    n_pass = sum(r.passed for r in ledger.rows)
    lines.append(f"{n_pass} passed, {len(ledger.rows) - n_pass} failed, {len(ledger.pending)} waiting "
                 f"({ledger.device}, torch {ledger.torch_version}, scale {ledger.scale}, {ledger.method})")
    return "\n".join(lines)


def to_markdown(ledger: Ledger) -> str:
    """The ledger as Markdown, headed by the device, torch version, scale and memory method."""
    out = [
        "# Claims ledger",
        "",
        f"- device: {ledger.device} ({platform.machine()})",
        f"- torch: {ledger.torch_version}",
        f"- scale: {ledger.scale}",
        f"- memory method: {ledger.method}",
        "",
    ]
    rows = [(r.claim.id, r.claim.text, r.claim.lesson, r.claim.measures, r.claim.condition or "-", _value(r),
             r.error or r.detail, "pass" if r.passed else "**FAIL**") for r in ledger.rows]
    rows += [(c.id, c.text, c.lesson, c.measures, c.condition or "-", "-", f"waits for {c.needs}", "waiting")
             for c in ledger.pending]
    headers = ("id", "claim", "lesson", "check", "condition", "evidence", "detail", "result")
    return "\n".join(out) + "\n" + markdown_table(headers, rows) + "\n"


def evidence_table(ledger: Ledger) -> str:
    """The ledger as a short Markdown table that wraps in a notebook.

    Args:
        ledger: from `run_ledger`.

    Returns:
        The table (id, claim, lesson, what was measured, never cut, and the result), then one
        line on how many passed and where it ran.
    """
    rows = [(r.claim.id, r.claim.text, r.claim.lesson, f"{_value(r)}: {r.error or r.detail}",
             "pass" if r.passed else "**FAIL**") for r in ledger.rows]
    rows += [(c.id, c.text, c.lesson, f"waits for {c.needs}", "waiting") for c in ledger.pending]
    n_pass = sum(r.passed for r in ledger.rows)
    return (markdown_table(("id", "claim", "lesson", "measured here", "result"), rows)
            + f"\n\n{n_pass} passed, {len(ledger.rows) - n_pass} failed, {len(ledger.pending)} waiting "
              f"({ledger.device}, torch {ledger.torch_version}, scale {ledger.scale}, {ledger.method}).")


# -- the follow-up questions, answered from the evidence ---------------------------------


# -- the quiz ----------------------------------------------------------------------------


README_START, README_END = "<!-- ledger:start -->", "<!-- ledger:end -->"


def readme_block(ledger: Ledger) -> str:
    """The README's key-figures table, made from `ledger` (one row per claim, with its evidence)."""
    lines = [README_START,
             f"Measured by `python -m helpers.review --readme README.md` on {ledger.device}, torch "
             f"{ledger.torch_version}, scale `{ledger.scale}`, method `{ledger.method}`.",
             "", "| id | claim | lesson | measured | |", "|---|---|---|---|---|"]
    for r in ledger.rows:
        lines.append(f"| {r.claim.id} | {r.claim.text} | {r.claim.lesson} | {_value(r)}: "
                     f"{(r.error or r.detail).replace('|', '/')} | {'pass' if r.passed else 'FAIL'} |")
    lines.append(README_END)
    return "\n".join(lines)


def write_readme(ledger: Ledger, path: str) -> None:
    """Replace the block between the ledger markers in the README at `path` with `readme_block`."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if README_START not in text or README_END not in text:
        raise ValueError(f"{path} has no {README_START} ... {README_END} block to replace")
    head, rest = text.split(README_START, 1)
    tail = rest.split(README_END, 1)[1]
    with open(path, "w", encoding="utf-8") as f:
        f.write(head + readme_block(ledger) + tail)


# -- widget: the accumulation claims at your own B and K ---------------------------------


# -- command line ------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """`python -m helpers.review`: print the ledger; exit 1 if any row fails."""
    parser = argparse.ArgumentParser(prog="python -m helpers.review", description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="comma-separated claim ids, e.g. C01,C14")
    parser.add_argument("--markdown", metavar="PATH", help="also write the ledger as Markdown to PATH")
    parser.add_argument("--readme", metavar="PATH", help="rewrite the README's key-figures block at PATH")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    try:
        ledger = run_ledger(args.only.split(",") if args.only else None, progress=not args.no_progress,
                            claims=CLAIMS)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_table(ledger))
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(to_markdown(ledger))
        print(f"wrote {args.markdown}")
    if args.readme:
        write_readme(ledger, args.readme)
        print(f"rewrote the key figures in {args.readme}")
    return 0 if ledger.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
