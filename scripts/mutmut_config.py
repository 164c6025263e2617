"""mutmut 2 configuration for `make mutate` (copied to the root of each throw-away copy it runs in).

`pre_mutation` runs before each mutant. It
- skips mutants that cannot change a measured number: error messages and `raise` lines,
  string-only lines, `__all__`, and whole functions that only draw, print or check a
  learner's answer (plots, widgets' drawing, exercise checkers);
- picks the tests: those that executed the mutated statement in a coverage run of the module's
  test files (scripts/mutmut_cov.py wrote `mutmut_map.json`). A statement that no test executes
  in-process (run only at import, or only in a worker process) gets the module's whole test files.
  The tests run through the fork server (scripts/mutmut_server.py), so torch is imported once.

`python mutmut_config.py count helpers/a.py ...` prints each file's number of mutants that are not
skipped; scripts/mutate.sh orders the modules by `cost` (the estimated seconds) instead.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import shlex
import sys
from types import SimpleNamespace

TESTS = {
    "helpers/measure/memory.py": (
        "tests/measure/test_memory.py tests/measure/test_tracker.py tests/measure/test_allocator.py"),
    "helpers/measure/tracker.py": ("tests/measure/test_tracker.py tests/measure/test_memory.py "
                                   "tests/measure/test_dispatch.py"),
    "helpers/measure/dispatch.py": ("tests/measure/test_dispatch.py tests/measure/test_tracker.py "
                                    "tests/measure/test_memory.py"),
    "helpers/measure/timeline.py": ("tests/measure/test_timeline.py tests/measure/test_tracker.py "
                                    "tests/measure/test_memory.py"),
    "helpers/techniques/accumulation.py": "tests/techniques/test_accumulation.py",
    "helpers/techniques/tokens.py": "tests/techniques/test_tokens.py",
    "helpers/techniques/token_loss.py": "tests/techniques/test_token_loss.py tests/techniques/test_tokens.py",
    "helpers/techniques/checkpointing.py": ("tests/techniques/test_checkpointing.py "
                                            "tests/techniques/test_saved_tensors.py"),
    "helpers/techniques/segments.py": "tests/techniques/test_segments.py",
    "helpers/plan/planner.py": "tests/plan/test_planner.py",
    "helpers/measure/memory_profile.py": ("tests/measure/test_memory_profile.py tests/plan/test_planner.py "
                                          "tests/test_profiler_independent.py"),
    "helpers/plan/estimates.py": "tests/plan/test_estimates.py",
    "helpers/distributed/ddp.py": "tests/distributed/test_ddp.py",
    "helpers/distributed/fsdp.py": "tests/distributed/test_fsdp.py",
    "helpers/measure/formulas.py": ("tests/measure/test_formulas.py tests/techniques/test_phases.py "
                            "tests/techniques/test_pitfalls.py "
                            "tests/plan/test_estimates.py tests/techniques/test_saved_tensors.py "
                            "tests/lessons/test_lesson01.py tests/lessons/test_lesson03.py "
                            "tests/lessons/test_lesson05.py"),
    "helpers/techniques/saved_tensors.py": "tests/techniques/test_saved_tensors.py",
    "helpers/techniques/phases.py": "tests/techniques/test_phases.py",
    # the presets' exact peaks, against full profiles of the same configs (tests/plan/test_preset_profiles.py)
    "helpers/plan/peak_envelope.py": "tests/plan/test_peak_envelope.py tests/plan/test_preset_profiles.py",
    "helpers/techniques/update_memory.py": ("tests/techniques/test_update_memory.py "
                                            "tests/measure/test_formulas.py"),
    # the instruments that landed since the first mutation run (issue 37 E)
    "helpers/meta/memo.py": "tests/meta/test_memo.py",
    "helpers/meta/pointwise.py": "tests/meta/test_pointwise.py",
    "helpers/meta/kernel_buffers.py": "tests/meta/test_kernel_buffers.py",
    # the autocast rule and the attention routing, against real CPU steps (tests/meta/test_profiler.py)
    "helpers/meta/target_kernels.py": "tests/meta/test_target_kernels.py tests/meta/test_profiler.py",
    "helpers/techniques/costs.py": "tests/techniques/test_costs.py",
    "helpers/plan/hf_configs.py": "tests/plan/test_hf_configs.py",
    "helpers/models/trainable.py": "tests/models/test_trainable.py",
    "helpers/plan/calibration.py": "tests/plan/test_calibration.py",
    "helpers/plan/cards.py": "tests/plan/test_cards.py",
}
PYTEST = "-x -q -p no:cacheprovider --assert=plain"  # a verdict needs no rewritten asserts
DISABLED_TYPES = ("fstring", "decorator")  # scripts/mutate.sh passes these to --disable-mutation-types
MAP_FILE = "mutmut_map.json"
# Functions whose mutants change no measured number: drawing, printing, answer checkers.
UNMEASURED = re.compile(r"^(_?plot|_?draw|_?show|print_|check_exercise|_?describe|_?format|_?render)")
MESSAGE_LINE = re.compile(r"""^(raise\b|f?["']|__all__|print\(|logger\.|warnings\.warn)""")
# Argument checks (helpers/core/validate.py): their first argument is the name an error message shows.
CHECK_CALL = re.compile(r"^(\w+\s*=\s*)?(int_at_least|positive_int|non_negative_int|int_in_range|"
                        r"number_in_range|positive_number|non_negative_number|bool_arg|instance_arg|"
                        r"choice|callable_arg|tensor_arg|_check_\w+)\(")


@functools.cache
def _tree(filename: str) -> ast.Module:
    with open(filename) as f:
        return ast.parse(f.read())


@functools.cache
def _unmeasured_lines(filename: str) -> frozenset[int]:
    lines: set[int] = set()
    for node in ast.walk(_tree(filename)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and UNMEASURED.match(node.name):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        if isinstance(node, ast.Raise):  # a whole (multi-line) raise statement
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return frozenset(lines)


def _first_line(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno, *(d.lineno for d in decorators)])


def _statement_lines(filename: str, line: int) -> range:
    """Lines from the start of the innermost statement holding `line` down to `line` (its header)."""
    best: ast.stmt | None = None
    for node in ast.walk(_tree(filename)):
        holds = isinstance(node, ast.stmt) and _first_line(node) <= line <= (node.end_lineno or node.lineno)
        if holds and (best is None or _first_line(node) >= _first_line(best)):
            best = node
    return range(_first_line(best) if best else line, line + 1)


@functools.cache
def _coverage_map() -> dict:
    if not os.path.exists(MAP_FILE):
        return {}
    with open(MAP_FILE) as f:
        return json.load(f)


def selected_tests(filename: str, line: int) -> list[str] | None:
    """Node ids of the tests that executed the statement on `line` (1-based), fastest first.

    None when no test did (in this process: the statement may run only at import, or only in a
    worker process).
    """
    runs = _coverage_map().get(filename, {}).get("runs", {})
    seconds = _coverage_map().get("durations", {})
    ids = {t for n in _statement_lines(filename, line) for t in runs.get(str(n), [])}
    return sorted(ids, key=lambda t: (seconds.get(t, 0.0), t)) or None


def pre_mutation(context) -> None:  # noqa: ANN001  (mutmut's Context)
    line = context.current_source_line.strip()
    number = context.mutation_id.line_number + 1  # mutmut counts lines from 0
    if MESSAGE_LINE.match(line) or number in _unmeasured_lines(context.filename):
        context.skip = True
        return
    if CHECK_CALL.match(line) and _only_a_string_changes(context):
        context.skip = True  # the name or wording in an argument check's message
        return
    filename = context.filename.replace(os.sep, "/")
    ids = selected_tests(filename, number)
    tests = " ".join(shlex.quote(t) for t in ids) if ids else TESTS.get(filename)
    if tests:
        server = f"{os.environ['MUTATE_PY']} scripts/mutmut_server.py run {os.environ['MUTATE_SOCK']}"
        context.config.test_command = f"{server} -- {PYTEST} {tests}"


def _only_a_string_changes(context) -> bool:  # noqa: ANN001
    """True when the mutant only wraps a string literal in XX...XX (mutmut's string mutation)."""
    from mutmut import Context, mutate

    mutated, _ = mutate(Context(source=context.source, mutation_id=context.mutation_id,
                                filename=context.filename, config=context.config))
    before = context.current_source_line
    after = mutated.split("\n")[context.mutation_id.line_number]
    return after != before and after.replace("XX", "") == before.replace("XX", "")


def types_config() -> SimpleNamespace:
    """A stand-in for mutmut's Config that enumerates the same mutants as `make mutate`."""
    from mutmut import mutations_by_type

    return SimpleNamespace(mutation_types_to_apply=set(mutations_by_type) - set(DISABLED_TYPES),
                           covered_lines_by_filename=None)


def _kept(filename: str) -> list[int]:
    """The 1-based line of each mutant of `filename` that pre_mutation does not skip by its line."""
    from mutmut import ALL, Context, list_mutations

    with open(filename) as f:
        source = f.read().split("\n")
    ids = list_mutations(Context(filename=filename, mutation_id=ALL, config=types_config()))
    return [i.line_number + 1 for i in ids
            if not (MESSAGE_LINE.match(source[i.line_number].strip())
                    or i.line_number + 1 in _unmeasured_lines(filename))]


def count(filename: str) -> int:
    """The number of mutants of `filename` that pre_mutation does not skip (by their line)."""
    return len(_kept(filename))


def cost(filename: str) -> float:
    """Estimated seconds to test every mutant of `filename`, from the coverage run's durations.

    Each mutant costs a fork and pytest's start (about half a second) plus its fastest selected
    test (most mutants die there) and a little of the rest; scripts/mutate.sh starts the
    costliest modules first.
    """
    seconds = _coverage_map().get("durations", {})
    whole = sum(t for name, t in seconds.items() if name.split("::")[0] in TESTS.get(filename, ""))
    total = 0.0
    for n in _kept(filename):
        times = sorted(seconds.get(t, 0.0) for t in selected_tests(filename, n) or []) or [whole]
        total += 0.5 + times[0] + 0.1 * sum(times[1:])
    return total


if __name__ == "__main__":
    if sys.argv[1:2] != ["count"]:
        sys.exit("usage: mutmut_config.py count FILE...")
    for name in sys.argv[2:]:
        print(name, count(name))
