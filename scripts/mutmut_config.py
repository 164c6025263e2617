"""mutmut 2 configuration for `make mutate` (copied to the root of the throw-away copy it runs in).

`pre_mutation` runs before each mutant. It
- skips mutants that cannot change a measured number: error messages and `raise` lines,
  string-only lines, `__all__`, and whole functions that only draw, print or check a
  learner's answer (plots, widgets' drawing, exercise checkers);
- runs only the tests of the mutated module (TESTS below), stopping at the first failure,
  through the fork server (scripts/mutmut_server.py), so torch is imported once.
"""

from __future__ import annotations

import ast
import functools
import os
import re

TESTS = {
    "helpers/memory.py": "tests/test_memory.py tests/test_tracker.py",
    "helpers/tracker.py": "tests/test_tracker.py tests/test_memory.py",
    "helpers/accumulation.py": "tests/test_accumulation.py",
    "helpers/tokens.py": "tests/test_tokens.py",
    "helpers/checkpointing.py": "tests/test_checkpointing.py",
    "helpers/planner.py": "tests/test_planner.py",
    "helpers/distributed.py": "tests/test_distributed.py",
}
PYTEST = "-x -q -p no:cacheprovider"
# Functions whose mutants change no measured number: drawing, printing, answer checkers.
UNMEASURED = re.compile(r"^(_?plot|_?draw|_?show|print_|check_exercise|_?describe|_?format|_?render)")
MESSAGE_LINE = re.compile(r"""^(raise\b|f?["']|__all__|print\(|logger\.|warnings\.warn)""")


@functools.cache
def _unmeasured_lines(filename: str) -> frozenset[int]:
    with open(filename) as f:
        tree = ast.parse(f.read())
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and UNMEASURED.match(node.name):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        if isinstance(node, ast.Raise):  # a whole (multi-line) raise statement
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return frozenset(lines)


def pre_mutation(context) -> None:  # noqa: ANN001  (mutmut's Context)
    line = context.current_source_line.strip()
    number = context.mutation_id.line_number + 1  # mutmut counts lines from 0
    if MESSAGE_LINE.match(line) or number in _unmeasured_lines(context.filename):
        context.skip = True
        return
    tests = TESTS.get(context.filename.replace(os.sep, "/"))
    if tests:
        server = f"{os.environ['MUTATE_PY']} scripts/mutmut_server.py run {os.environ['MUTATE_SOCK']}"
        context.config.test_command = f"{server} -- {PYTEST} {tests}"
