"""Which cases of a parametrized test `make check` runs; the others are marked `slow`, for `make test`.

A comparison against a real step costs seconds per case. `make check` (about 90 s on 2 cores) keeps one
or two cases that between them reach every code path the others do (each architecture family in one
precision, both precisions somewhere); `make test` runs every case.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

__all__ = ["check_cases"]


def check_cases(cases: Iterable[tuple[object, ...]], keep: set[tuple[object, ...]]) -> list[object]:
    """`cases` as pytest params, ids joined with "-"; those not in `keep` are marked `slow`.

    Raises:
        ValueError: when `keep` names a case that is not in `cases` (a renamed case would leave check
            with nothing of it).
    """
    cases = [tuple(c) for c in cases]
    missing = keep - set(cases)
    if missing:
        raise ValueError(f"keep names cases that do not exist: {sorted(missing)}; cases are {cases}")
    return [pytest.param(*c, id="-".join(map(str, c)), marks=() if c in keep else pytest.mark.slow)
            for c in cases]
