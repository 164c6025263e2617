"""Which test runs which line, for `make mutate` (scripts/mutate.sh): test selection per mutant.

Two uses:
- a pytest plugin (`-p mutmut_cov` under `coverage run`): each test's lines are recorded under the
  test's node id (a coverage "context"), setup and teardown included;
- `python scripts/mutmut_cov.py map DATAFILE OUT.json`: writes, for each measured helpers file,
  `{"runs": {line: [node ids]}, "missing": [lines no test executes]}`, and each test's seconds
  under `"durations"`. Lines are the first line of a statement, as coverage reports them.

`scripts/mutmut_config.py` then runs, for a mutant on line L, only the tests that executed L's
statement, fastest first (pytest stops at the first failure). A statement executed only at
import (a `def` line, a default value, a module constant) has no test of its own; its mutants
run the module's whole test files.
"""

from __future__ import annotations

import collections
import json
import sys

import coverage
import pytest

DURATIONS = "mutmut_durations.json"
_seconds: collections.Counter = collections.Counter()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _seconds[report.nodeid] += report.duration  # setup + call + teardown


def pytest_sessionfinish(session: pytest.Session) -> None:  # noqa: ARG001
    with open(DURATIONS, "w") as f:
        json.dump(dict(_seconds), f)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # noqa: ARG001
    cov = coverage.Coverage.current()
    if cov is not None:
        cov.switch_context(item.nodeid)
    yield
    if cov is not None:
        cov.switch_context("")


def write_map(data_file: str, out: str) -> None:
    """Write the line -> tests map (see the module docstring) from a coverage data file."""
    cov = coverage.Coverage(data_file=data_file)
    cov.load()
    data = cov.get_data()
    result: dict[str, dict] = {}
    with open(DURATIONS) as f:
        result["durations"] = json.load(f)
    for path in data.measured_files():
        rel = path[path.rindex("helpers/"):] if "helpers/" in path else path
        runs = {
            str(line): sorted(c for c in ctxs if c)
            for line, ctxs in data.contexts_by_lineno(path).items()
        }
        missing = cov.analysis2(path)[3]
        result[rel] = {"runs": runs, "missing": sorted(missing)}
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    if sys.argv[1:2] != ["map"] or len(sys.argv) != 4:
        sys.exit("usage: mutmut_cov.py map DATAFILE OUT.json")
    write_map(sys.argv[2], sys.argv[3])
