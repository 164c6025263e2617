"""helpers.frameworks.hf_models: Transformers models from configs, with dropout off, and their batches.

Each batch is checked against its rows padded by hand; nothing is downloaded (HF_HUB_OFFLINE).
"""

from __future__ import annotations

import os

import pytest
import torch
from support import transformers_oracles
from support.fixtures import HF_SIZES

from helpers.core.training import IGNORE_INDEX
from helpers.frameworks import hf_models, installed

CI = os.environ.get("CI", "").lower() == "true"
pytestmark = pytest.mark.skipif(bool(installed.missing("transformers", "accelerate")) and not CI,
                                reason="needs the frameworks extra (transformers, accelerate)")


def test_collate_pads_each_micro_batch_and_labels_padding(hf) -> None:
    rows = [{"input_ids": torch.tensor([5, 6, 7])}, {"input_ids": torch.tensor([8])}]
    batch = hf_models.collate(rows)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[5, 6, 7], [8, IGNORE_INDEX, IGNORE_INDEX]]
    masked = hf_models.collate(rows, mask_first=True)["labels"]
    assert masked[:, 0].tolist() == [IGNORE_INDEX, IGNORE_INDEX] and masked[0, 1:].tolist() == [6, 7]
    assert hf_models.predicted_tokens([batch]) == 2 == int((masked != IGNORE_INDEX).sum())
    with pytest.raises(ValueError, match="rows is empty"):
        hf_models.collate([])
    with pytest.raises(ValueError, match="micro_batch"):
        hf_models.micro_batches(rows, 3)


def test_models_come_from_configs_with_dropout_off(hf) -> None:
    state = torch.random.get_rng_state()
    a, b = hf_models.causal_lm("gpt2", seed=1, **HF_SIZES), hf_models.causal_lm("gpt2", seed=1, **HF_SIZES)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's random stream is untouched
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert a.training and set(transformers_oracles.dropout_settings(a).values()) == {0.0}
    assert not a.config.use_cache
    with pytest.raises(ValueError, match="kind='bert' is not allowed"):
        hf_models.causal_lm_config("bert")
    with pytest.raises(ValueError, match="divisible"):
        hf_models.causal_lm_config("llama", hidden=10, heads=4)
