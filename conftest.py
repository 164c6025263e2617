"""nbval guard for notebooks/: a cell that writes to stderr (a warning, a stray log) fails."""

from __future__ import annotations

from collections.abc import Generator

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    result = yield
    outputs = getattr(item, "test_outputs", None) or []
    errs = [o.get("text", "") for o in outputs
            if o.get("output_type") == "stream" and o.get("name") == "stderr"]
    if errs:
        pytest.fail("cell wrote to stderr (lessons must run without warnings):\n" + "".join(errs)[:2000])
    return result
