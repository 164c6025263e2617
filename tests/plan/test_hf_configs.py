"""helpers.plan.hf_configs: a local config.json planned as a real CPU step of Transformers' model would run.

The published config.json files below are the releases' own (copied from the Hugging Face Hub, nothing
is downloaded). Small config files are written into tmp_path, with torch_dtype "bfloat16" and
use_cache true as real files have them. Under CI=true a missing Transformers fails, never skips.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch
from support.transformers_oracles import hf_dict

from helpers.meta.profiler import Profiler
from helpers.models.architecture_config import PUBLISHED_PARAMETERS, RELEASED, ArchConfig
from helpers.plan import hf_configs
from helpers.plan.hf_configs import arch_from_hf, from_hf_config, transformers_missing

CI = os.environ.get("CI", "").lower() == "true"
needs_transformers = pytest.mark.skipif(
    transformers_missing() and not CI, reason="needs Transformers (pip install 'ckpt-vs-accum[frameworks]')")

PUBLISHED = {  # config.json as published, old field names (rope_theta, rope_scaling) included
    "gpt2-small": {
        "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
        "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
        "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": None,
        "summary_first_dropout": 0.1, "summary_proj_to_labels": True, "summary_type": "cls_index",
        "summary_use_proj": True, "vocab_size": 50257},
    "llama-3.2-1b": {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
        "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
        "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
        "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256},
    "mistral-7b": {
        "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
        "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
        "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
        "sliding_window": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.34.0.dev0", "use_cache": True, "vocab_size": 32000},
    "qwen2.5-0.5b": {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
        "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
        "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": True, "use_mrope": False,
        "use_sliding_window": False, "vocab_size": 151936},
    "tinyllama-1.1b": {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 5632,
        "max_position_embeddings": 2048, "model_type": "llama", "num_attention_heads": 32,
        "num_hidden_layers": 22, "num_key_value_heads": 4, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": None, "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "float32",
        "transformers_version": "4.31.0.dev0", "use_cache": True, "vocab_size": 32000},
}

SMALL = {  # small configs as files would hold them: bf16 stored weights, the KV cache on
    "llama": {"model_type": "llama", "vocab_size": 96, "hidden_size": 64, "intermediate_size": 160,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "max_position_embeddings": 128, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
              "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                               "original_max_position_embeddings": 64, "rope_type": "llama3"},
              "tie_word_embeddings": True},
    "mistral": {"model_type": "mistral", "vocab_size": 96, "hidden_size": 64, "intermediate_size": 160,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1,
                "max_position_embeddings": 128, "sliding_window": 16, "rope_theta": 10000.0},
    "qwen2": {"model_type": "qwen2", "vocab_size": 96, "hidden_size": 64, "intermediate_size": 160,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 128, "rms_norm_eps": 1e-06, "tie_word_embeddings": True,
              "use_sliding_window": False, "sliding_window": 128},
    "gpt2": {"model_type": "gpt2", "vocab_size": 96, "n_positions": 64, "n_embd": 64, "n_layer": 2,
             "n_head": 4},
}
SEQ, MICRO = 32, 2


def _file(tmp_path: Path, raw: dict[str, object]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**raw, "torch_dtype": "bfloat16", "use_cache": True}), encoding="utf-8")
    return path


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_configs_are_the_presets(name: str) -> None:
    parsed = arch_from_hf(PUBLISHED[name])
    assert dataclasses.replace(parsed, name=RELEASED[name].name) == RELEASED[name]
    assert arch_from_hf(hf_dict(RELEASED[name])) == dataclasses.replace(RELEASED[name], name="")


@needs_transformers
@pytest.mark.parametrize("name", list(PUBLISHED))
def test_a_bf16_config_builds_the_published_count_in_fp32(name: str) -> None:
    transformers = hf_configs._transformers()
    for builder in ("own", "transformers"):
        hf = from_hf_config(PUBLISHED[name], builder=builder)
        with torch.device("meta"):
            model = hf.build()
        params = {id(p): p for p in model.parameters()}.values()
        assert sum(p.numel() for p in params) == PUBLISHED_PARAMETERS[name], builder
        assert {p.dtype for p in params} == {torch.float32}, builder
        stored = PUBLISHED[name].get("torch_dtype")
        assert hf.stored_dtype == stored and (stored != "bfloat16" or "stored as bf16" in hf.stored_line)
    if PUBLISHED[name].get("torch_dtype") == "bfloat16":  # what from_config does with such a file by itself
        config = transformers.AutoConfig.for_model(**PUBLISHED[name])
        with torch.device("meta"):
            assert transformers.AutoModelForCausalLM.from_config(config).dtype == torch.bfloat16


@needs_transformers
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("family", list(SMALL))
def test_meta_plan_of_a_config_file_equals_a_real_cpu_step(tmp_path: Path, family: str,
                                                            precision: str) -> None:
    path = _file(tmp_path, SMALL[family])
    ours = from_hf_config(path, SEQ)
    theirs = from_hf_config(path, SEQ, builder="transformers")
    assert (ours.source, theirs.source) == ("helpers.models.architectures", "transformers")
    assert ours.spec == theirs.spec and "weights stored as bf16" in ours.stored_line
    meta = Profiler(ours.build, ours.spec, precision=precision)
    real = Profiler(theirs.build, theirs.spec, precision=precision, device="cpu")
    for checkpoint in ("none", "blocks"):
        plan, step = (p.step(MICRO, checkpoint=checkpoint, accumulation_steps=2) for p in (meta, real))
        for category, want in step.breakdown.items():
            got = plan.breakdown[category]
            what = f"{family} {precision} {checkpoint} {category}"
            assert abs(got - want) <= 0.01 * want, f"{what}: {got} vs {want}"
        assert plan.peak_bytes >= step.peak_bytes, "the plan is below the real step's peak"


@needs_transformers
def test_configs_we_do_not_build_go_to_transformers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    neox = {"model_type": "gpt_neox", "vocab_size": 96, "hidden_size": 64, "intermediate_size": 256,
            "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 64}
    gelu_llama = {**SMALL["llama"], "hidden_act": "gelu"}
    for raw in (neox, gelu_llama):
        hf = from_hf_config(_file(tmp_path, raw), SEQ)
        assert hf.source == "transformers" and hf.arch is None
        meta = Profiler(hf.build, hf.spec).step(MICRO)
        real = Profiler(hf.build, hf.spec, device="cpu").step(MICRO)
        for category, want in real.breakdown.items():
            assert abs(meta.breakdown[category] - want) <= 0.01 * want, (raw["model_type"], category)
    assert any("hidden_act='gelu'" in note for note in hf.notes)
    with pytest.raises(ValueError, match="hidden_act='gelu'"):
        from_hf_config(gelu_llama, builder="own")
    monkeypatch.setattr(hf_configs, "transformers_missing", lambda: True)
    with pytest.raises(ValueError, match="model_type='gpt_neox' is not built.*Transformers is not installed"):
        from_hf_config(neox)
    assert from_hf_config(SMALL["gpt2"]).source == "helpers.models.architectures"  # no Transformers needed


@needs_transformers
def test_the_transformers_model_keeps_no_kv_cache() -> None:
    model = hf_configs.transformers_causal_lm({**SMALL["llama"], "use_cache": True})
    out = model(torch.randint(96, (1, 8)))
    assert getattr(out, "cache", None) is None and getattr(out, "past_key_values", None) is None


def test_bad_inputs_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="seq_len=65 is beyond the config's 64 positions"):
        from_hf_config(SMALL["gpt2"], 65)
    assert from_hf_config(PUBLISHED["llama-3.2-1b"]).spec.seq_len == hf_configs.DEFAULT_MAX_SEQ
    with pytest.raises(ValueError, match="builder='meta' is not allowed"):
        from_hf_config(SMALL["gpt2"], builder="meta")
    with pytest.raises(ValueError, match="cannot read a JSON config"):
        from_hf_config(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text(json.dumps({"hidden_size": 8}), encoding="utf-8")
    with pytest.raises(ValueError, match="has no 'model_type'"):
        from_hf_config(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="rope type 'yarn' is not built"):
        arch_from_hf({**SMALL["llama"], "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ValueError, match="use_sliding_window=true"):
        arch_from_hf({**SMALL["qwen2"], "use_sliding_window": True})
    assert isinstance(arch_from_hf(SMALL["mistral"]), ArchConfig)


def test_a_transformers_that_refuses_this_torch_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building a model Transformers alone knows, where Transformers refuses this torch: say why."""
    from helpers.frameworks import installed

    why = "transformers 9.0 is installed but does not run with torch 2.5.1 (ImportError: too old)"
    monkeypatch.setattr(hf_configs, "transformers_missing", lambda: False)
    monkeypatch.setattr(installed, "unusable", lambda name: why)
    with pytest.raises(ValueError, match=r"does not run with torch 2\.5\.1.*covers the model types"):
        hf_configs.transformers_causal_lm({**SMALL["llama"]})
