"""helpers.models.architecture_config: the released configs' parameter counts, and the checks on a config.

The counts are the releases' own (`PUBLISHED_PARAMETERS`), held against `param_count`, against the
model built on meta, and against Transformers built from the same config. Under CI=true a missing
Transformers fails that test instead of skipping it.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from support.architectures import SMALL
from support.transformers_oracles import hf_dict

from helpers.models.architecture_config import PUBLISHED_PARAMETERS, RELEASED, ArchConfig, param_count
from helpers.models.architectures import CausalLM, released
from helpers.plan.hf_configs import transformers_causal_lm, transformers_missing

CI = os.environ.get("CI", "").lower() == "true"
needs_transformers = pytest.mark.skipif(
    transformers_missing() and not CI, reason="needs Transformers (pip install 'ckpt-vs-accum[frameworks]')")


# -- parameter counts -----------------------------------------------------------------------------
def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once


@pytest.mark.parametrize("name", list(RELEASED))
def test_presets_have_the_released_parameter_count_at_any_length(name: str) -> None:
    counts = set()
    for seq_len in (None, 128):
        build, spec, cfg = released(name, seq_len)
        with torch.device("meta"):
            counts.add(_count(build()))
        assert spec.vocab_size == cfg.vocab_size
    assert counts == {PUBLISHED_PARAMETERS[name]} == {param_count(RELEASED[name])}


@needs_transformers
def test_transformers_builds_the_same_counts_from_the_same_configs() -> None:
    for name, cfg in RELEASED.items():
        with torch.device("meta"):
            model = transformers_causal_lm(hf_dict(cfg))
        assert model.num_parameters() == PUBLISHED_PARAMETERS[name], name
        tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
        assert tied == cfg.tie_embeddings, name


def test_configs_are_validated() -> None:
    with pytest.raises(ValueError, match="num_heads=4 must be a multiple of num_kv_heads=3"):
        dataclasses.replace(SMALL["llama"], num_kv_heads=3)
    with pytest.raises(ValueError, match="family='bert' is not allowed"):
        dataclasses.replace(SMALL["llama"], family="bert")
    with pytest.raises(ValueError, match="rope_scaling of type 'yarn'"):
        dataclasses.replace(SMALL["llama"], rope_scaling=(("rope_type", "yarn"),))
    with pytest.raises(ValueError, match="gpt2 config has multi-head attention"):
        dataclasses.replace(SMALL["gpt2"], num_kv_heads=2)


@pytest.mark.parametrize(("cfg", "hand"), [
    # Llama, h 64, i 160, 2 layers, 4 heads of 16, 2 K/V heads: embedding 96 h; per layer q and o
    # h^2 each, k and v 32 h each, gate, up and down 160 h each, two norms h each; final norm h;
    # an untied head 96 h
    (ArchConfig("llama", 96, 64, 160, 2, 4, 128, num_kv_heads=2),
     96 * 64 + 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 160 + 2 * 64) + 64 + 96 * 64),
    (ArchConfig("llama", 96, 64, 160, 2, 4, 128, num_kv_heads=2, tie_embeddings=True),
     96 * 64 + 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 160 + 2 * 64) + 64),
    # Qwen2's q, k and v biases: 64 + 32 + 32 more per layer
    (ArchConfig("qwen2", 96, 64, 160, 2, 4, 128, num_kv_heads=2, qkv_bias=True),
     96 * 64 + 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 160 + 2 * 64 + 128) + 64 + 96 * 64),
    # GPT-2, h 32, i 128, 1 layer, 16 positions, tied: tokens 96 h, positions 16 h; ln_1 and ln_2
    # 2 h each; c_attn h x 3h + 3h, c_proj h x h + h, c_fc h x i + i, c_proj i x h + h; ln_f 2 h
    (ArchConfig("gpt2", 96, 32, 128, 1, 4, 16, tie_embeddings=True, qkv_bias=True, o_bias=True,
                mlp_bias=True),
     96 * 32 + 16 * 32 + (4 * 32 + 32 * 96 + 96 + 32 * 32 + 32 + 32 * 128 + 128 + 128 * 32 + 32) + 2 * 32),
    # GPT-2's layers carry biases whatever the (Llama-family) bias flags say: the same count
    (ArchConfig("gpt2", 96, 32, 128, 1, 4, 16, tie_embeddings=True),
     96 * 32 + 16 * 32 + (4 * 32 + 32 * 96 + 96 + 32 * 32 + 32 + 32 * 128 + 128 + 128 * 32 + 32) + 2 * 32),
], ids=["llama", "llama-tied", "qwen2-biases", "gpt2", "gpt2-flags-off"])
def test_param_count_against_hand_counts(cfg: ArchConfig, hand: int) -> None:
    assert param_count(cfg) == hand
    with torch.device("meta"):
        assert _count(CausalLM(cfg)) == hand
