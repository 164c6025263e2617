"""Tests of helpers.plan.presets: budgets, factories and Hugging Face configs."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest
import torch
from support.transformers_oracles import hf_dict

from helpers.models.architecture_config import RELEASED
from helpers.plan import presets
from helpers.plan.presets import example_classifier, hf_factory, load_factory, parse_budget


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
    found = load_factory("helpers.plan.presets:example_classifier")
    assert found is presets.example_classifier is example_classifier
    for bad, msg in [("helpers.plan", "package.module:factory"), ("no_such_pkg.mod:f", "cannot import"),
                     ("helpers.plan:nope", "no attribute"), ("helpers.plan.presets:GB", "not callable")]:
        with pytest.raises(ValueError, match=msg):
            load_factory(bad)


def test_hf_config_without_transformers(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # noqa: ANN001
    """Without Transformers a Llama config is still built (our own architecture, fp32); a model type we
    do not build says what Transformers adds."""
    monkeypatch.setitem(sys.modules, "transformers", None)
    llama = tmp_path / "llama.json"
    llama.write_text(json.dumps(hf_dict(dataclasses.replace(RELEASED["llama-3.2-1b"], num_layers=1))))
    hf = hf_factory(str(llama), 128)
    assert hf.source == "helpers.models.architectures" and hf.stored_line.startswith("weights stored as bf16")
    with torch.device("meta"):
        assert all(p.dtype == torch.float32 for p in hf.build().parameters())
    other = tmp_path / "phi.json"
    other.write_text(json.dumps({"model_type": "phi", "vocab_size": 100, "hidden_size": 8}))
    with pytest.raises(ValueError, match="Transformers is not installed"):
        hf_factory(str(other))
