"""Tests of helpers.presets: budgets, factories and Hugging Face configs."""

from __future__ import annotations

import sys

import pytest

from helpers import plan
from helpers.presets import example_classifier, hf_factory, load_factory, parse_budget


@pytest.mark.parametrize(("text", "value"), [("24GB", 24e9), ("24 GiB", 24 * 2**30), ("24e9", 24e9),
                                             ("80gb", 80e9), ("512 MiB", 512 * 2**20), (1e9, 1e9)])
def test_parse_budget(text: object, value: float) -> None:
    assert parse_budget(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["24 parsecs", "GB", "", "-3GB", "0"])
def test_parse_budget_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="budget"):
        parse_budget(text)
    with pytest.raises(TypeError):
        parse_budget(True)


def test_load_factory_errors() -> None:
    assert load_factory("helpers.plan:example_classifier") is plan.example_classifier is example_classifier
    for bad, msg in [("helpers.plan", "package.module:factory"), ("no_such_pkg.mod:f", "cannot import"),
                     ("helpers.plan:nope", "no attribute"), ("helpers.presets:GB", "not callable")]:
        with pytest.raises(ValueError, match=msg):
            load_factory(bad)


def test_hf_config_without_transformers(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # noqa: ANN001
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ValueError, match="needs Hugging Face transformers"):
        hf_factory(str(tmp_path / "config.json"))
