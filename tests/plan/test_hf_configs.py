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
from support.tiers import check_cases
from support.transformers_oracles import hf_dict

from helpers.meta.profiler import Profiler
from helpers.models.architecture_config import PUBLISHED_PARAMETERS, RELEASED, ArchConfig, param_count
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
@pytest.mark.parametrize(("family", "precision"), check_cases(
    [(f, p) for f in SMALL for p in ("fp32", "bf16")], keep={("gpt2", "bf16"), ("qwen2", "fp32")}))
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
    assert from_hf_config(PUBLISHED["llama-3.2-1b"]).spec.seq_len == hf_configs.DEFAULT_MAX_SEQ == 4096
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


# Mutation tests (docs/mutants.md, make mutate): each field, default and refusal of hf_configs.py.

def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def test_transformers_missing_looks_it_up_then_asks_whether_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from helpers.frameworks import installed

    asked: list[str] = []

    def found(name: str) -> object | None:
        asked.append(name)
        return object() if name == "transformers" else None

    def refused(error: type[Exception]) -> object:
        def find(name: str) -> None:
            raise error(name)
        return find

    monkeypatch.setattr(installed, "unusable", lambda name: None)
    monkeypatch.setattr(importlib.util, "find_spec", found)
    assert transformers_missing() is False and asked == ["transformers"]
    monkeypatch.setattr(installed, "unusable", lambda name: f"{name} does not run with this torch")
    assert transformers_missing() is True
    monkeypatch.setattr(installed, "unusable", lambda name: None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert transformers_missing() is True
    for error in (ValueError, ImportError):
        monkeypatch.setattr(importlib.util, "find_spec", refused(error))
        assert transformers_missing() is True, error


def test_transformers_is_imported_offline_and_its_absence_is_explained(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(hf_configs, "transformers_missing", lambda: True)
    message = ("Hugging Face Transformers is not installed (pip install 'ckpt-vs-accum[frameworks]'); "
               "it builds any causal LM Transformers knows. Without it, --hf-config covers the model "
               "types gpt2, llama, mistral, qwen2, and every preset works")
    with pytest.raises(ValueError) as err:
        hf_configs._transformers()
    assert str(err.value) == message
    assert (os.environ["HF_HUB_OFFLINE"], os.environ["TRANSFORMERS_OFFLINE"]) == ("1", "1")
    with pytest.raises(ValueError) as err:  # a config we would build, but not with builder="transformers"
        from_hf_config(SMALL["gpt2"], builder="transformers")
    assert str(err.value) == message


def test_read_config_wants_a_dict_with_a_model_type(tmp_path: Path) -> None:
    for name, text in (("no_type.json", {"hidden_size": 8}), ("list.json", [1])):
        (tmp_path / name).write_text(json.dumps(text), encoding="utf-8")
        with pytest.raises(ValueError, match=rf"{name}' has no 'model_type'"):
            hf_configs.read_config(tmp_path / name)
    assert hf_configs.read_config(_file(tmp_path, SMALL["gpt2"]))["n_embd"] == 64


def test_the_stored_dtype_is_recorded_and_never_used() -> None:
    bf16 = from_hf_config({**SMALL["gpt2"], "dtype": "bfloat16"})  # the newer files' name
    assert bf16.stored_dtype == bf16.arch.stored_dtype == "bfloat16"
    assert bf16.notes == ("the config's torch_dtype 'bfloat16' is recorded, not used: built in fp32",)
    assert bf16.stored_line == ("weights stored as bf16 (the config's torch_dtype; training precision is set "
                                "by the plan, never by it)")
    for value, short in (("torch.float16", "fp16"), ("float32", "fp32")):
        hf = from_hf_config({**SMALL["gpt2"], "torch_dtype": value})
        assert hf.stored_dtype == value.removeprefix("torch.")
        assert hf.stored_line.startswith(f"weights stored as {short} (")
    for raw in (SMALL["gpt2"], {**SMALL["gpt2"], "torch_dtype": "auto"}):
        hf = from_hf_config(raw)
        assert hf.stored_dtype is None and hf.notes == ()
        assert hf.stored_line == "weights' stored dtype not given by the config"
    with pytest.raises(dataclasses.FrozenInstanceError):
        hf.stored_dtype = "bfloat16"  # type: ignore[misc]


def test_missing_fields_take_the_transformers_defaults() -> None:
    # GPT2Config's defaults are GPT-2 small; LlamaConfig's are Llama-2-7B's shape (6,738,415,616 parameters
    # with its 32000 tokens), 2048 positions, rms_norm_eps 1e-6 and rope_theta 10000
    assert arch_from_hf({"model_type": "gpt2", "vocab_size": 50257}) == dataclasses.replace(
        RELEASED["gpt2-small"], name="")
    llama = arch_from_hf({"model_type": "llama", "vocab_size": 32000})
    assert param_count(llama) == 6_738_415_616
    shape = (llama.hidden_size, llama.intermediate_size, llama.num_layers, llama.num_heads, llama.kv_heads)
    assert shape == (4096, 11008, 32, 32, 32)
    assert (llama.max_positions, llama.norm_eps, llama.rope_theta) == (2048, 1e-6, 10000.0)
    assert llama.rope_scaling is None
    assert (llama.tie_embeddings, llama.qkv_bias, llama.o_bias, llama.mlp_bias, llama.attn_dropout) == (
        False, False, False, False, 0.0)
    for kind in ("gpt2", "llama"):
        with pytest.raises(ValueError, match="vocab_size must be a positive int, got 0"):
            arch_from_hf({"model_type": kind})


@needs_transformers
@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2"])
def test_a_family_fills_what_a_config_leaves_out_as_transformers_does(kind: str) -> None:
    """A config with only its type and vocabulary gets the shape Transformers' own config class gives
    (Mistral: 14336 wide, 8 K/V heads, a 4096 window; Qwen2: 22016 wide, 32768 positions)."""
    from transformers import AutoConfig

    theirs = AutoConfig.for_model(kind, vocab_size=1000)
    ours = arch_from_hf({"model_type": kind, "vocab_size": 1000})
    assert (ours.hidden_size, ours.intermediate_size, ours.num_layers, ours.num_heads, ours.kv_heads,
            ours.max_positions, ours.norm_eps) == (
        theirs.hidden_size, theirs.intermediate_size, theirs.num_hidden_layers, theirs.num_attention_heads,
        theirs.num_key_value_heads, theirs.max_position_embeddings, theirs.rms_norm_eps)
    assert ours.sliding_window == (theirs.sliding_window if kind == "mistral" else None)
    given = arch_from_hf({"model_type": kind, "vocab_size": 1000, "intermediate_size": 64})
    assert given.intermediate_size == 64  # what a config gives wins


def test_every_field_a_config_gives_is_read() -> None:
    gpt2 = {**SMALL["gpt2"], "n_inner": 100, "tie_word_embeddings": False, "layer_norm_epsilon": 1e-6,
            "embd_pdrop": 0.0, "attn_pdrop": 0.2, "resid_pdrop": 0.3, "pad_token_id": 0,
            "_name_or_path": "someone/gpt2-tiny", "activation_function": "gelu_new",
            "scale_attn_weights": True}
    got = arch_from_hf(gpt2)
    assert (got.intermediate_size, got.tie_embeddings, got.norm_eps) == (100, False, 1e-6)
    assert (got.embd_dropout, got.attn_dropout, got.resid_dropout) == (0.0, 0.2, 0.3)
    assert (got.pad_token_id, got.name) == (0, "someone/gpt2-tiny")
    llama = arch_from_hf({**SMALL["llama"], "attention_dropout": 0.25, "pad_token_id": 3,
                          "layer_types": ["full_attention", "full_attention"]})
    assert (llama.attn_dropout, llama.pad_token_id) == (0.25, 3)
    assert llama == dataclasses.replace(arch_from_hf(SMALL["llama"]), attn_dropout=0.25, pad_token_id=3)
    scaling = SMALL["llama"]["rope_scaling"]
    old_format = {"type": "llama3", **{k: v for k, v in scaling.items() if k != "rope_type"}}
    assert arch_from_hf({**SMALL["llama"], "rope_scaling": old_format}) == arch_from_hf(SMALL["llama"])
    with pytest.raises(ValueError, match="rope type 'linear' is not built"):
        arch_from_hf({**SMALL["llama"], "rope_scaling": {"type": "linear", "factor": 2.0}})


def test_what_we_do_not_build_is_refused_by_name() -> None:
    def refused(raw: dict[str, object], what: str) -> None:
        with pytest.raises(ValueError) as err:
            arch_from_hf(raw)
        want = f"{raw['model_type']} config with {what} is not built by helpers.models.architectures"
        assert str(err.value) == want

    refused({**SMALL["gpt2"], "activation_function": "relu"}, "activation_function='relu' (only 'gelu_new')")
    for field, value in (("scale_attn_weights", False), ("scale_attn_by_inverse_layer_idx", True),
                         ("add_cross_attention", True)):
        refused({**SMALL["gpt2"], field: value}, "unscaled, layer-scaled or cross attention")
    refused({**SMALL["qwen2"], "use_sliding_window": True}, "use_sliding_window=true")
    refused({**SMALL["mistral"], "layer_types": ["full_attention", "sliding_attention"]},
            "layer_types other than 'full_attention'")
    with pytest.raises(ValueError, match="seq_len must be a positive int"):
        from_hf_config(SMALL["gpt2"], 0)


@needs_transformers
@pytest.mark.parametrize("family", ["gpt2", "llama", "mistral", "qwen2"])
def test_biases_and_ties_count_as_transformers_builds_them(family: str) -> None:
    """attention_bias and mlp_bias are Llama's; Mistral and Qwen2 ignore them (Qwen2's q, k, v have one)."""
    variants = ([{"n_inner": 100, "tie_word_embeddings": False}] if family == "gpt2" else
                [{"attention_bias": True, "mlp_bias": True},
                 {"attention_bias": True, "tie_word_embeddings": False}])
    for extra in variants:
        raw = {**SMALL[family], **extra}
        with torch.device("meta"):
            ours, theirs = (from_hf_config(raw, builder=b).build() for b in ("own", "transformers"))
        assert _count(ours) == _count(theirs), extra


def test_a_plans_batch_needs_no_transformers_when_the_config_gives_positions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def no_transformers() -> None:
        pytest.fail("the positions and vocabulary are read from the config, without Transformers")

    monkeypatch.setattr(hf_configs, "transformers_missing", lambda: False)
    monkeypatch.setattr(hf_configs, "_transformers", no_transformers)
    neox = {"model_type": "gpt_neox", "vocab_size": 96}
    for positions in ({"max_position_embeddings": 48}, {"n_positions": 48}):
        hf = from_hf_config({**neox, **positions}, builder="transformers")
        assert (hf.source, hf.spec.seq_len, hf.spec.vocab_size, hf.arch, hf.notes) == ("transformers", 48, 96,
                                                                                      None, ())
    with pytest.raises(ValueError, match="vocab_size must be a positive int, got 0"):
        from_hf_config({"model_type": "gpt_neox", "max_position_embeddings": 48}, builder="transformers")
    with pytest.raises(ValueError, match="max_position_embeddings must be a positive int, got 0"):
        from_hf_config({**neox, "max_position_embeddings": 0}, builder="transformers")


@needs_transformers
def test_positions_a_config_leaves_out_are_transformers_defaults() -> None:
    transformers = hf_configs._transformers()
    neox = {"model_type": "gpt_neox", "vocab_size": 96, "hidden_size": 64, "num_attention_heads": 4,
            "torch_dtype": "bfloat16"}
    default = transformers.GPTNeoXConfig().max_position_embeddings
    assert default == 2048
    assert from_hf_config(neox, builder="transformers").spec.seq_len == default
    assert not hasattr(transformers.MambaConfig(), "max_position_embeddings")  # a model with no positions
    mamba = {"model_type": "mamba", "vocab_size": 96, "hidden_size": 64, "num_hidden_layers": 2}
    assert from_hf_config(mamba, builder="transformers").spec.seq_len == 1024


class _OpLog(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, list[tuple[tuple[int, ...], torch.dtype]]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, tuple | list) else [out]
        self.ops.append((str(func.overloadpacket), [(tuple(t.shape), t.dtype) for t in outs
                                                    if isinstance(t, torch.Tensor)]))
        return out


@needs_transformers
def test_the_packing_check_on_meta_makes_transformers_temporaries_and_is_undone() -> None:
    import importlib

    masking = importlib.import_module("transformers.masking_utils")
    original = masking.find_packed_sequence_indices
    ids = torch.arange(7).repeat(3, 1)
    meta_ids = ids.to("meta")
    with hf_configs._packing_check_on_meta(masking):
        patched = masking.find_packed_sequence_indices
    assert masking.find_packed_sequence_indices is original and patched is not original
    with _OpLog() as theirs:
        assert original(ids) is None
    with _OpLog() as ours:
        assert patched(meta_ids) is None
    assert ours.ops and ours.ops[-1][0] == "aten.cumsum" and ours.ops == theirs.ops[:len(ours.ops)]
    packed = torch.tensor([[0, 1, 2, 0, 1, 2, 3]])
    assert torch.equal(patched(packed), original(packed))

    model = hf_configs.transformers_causal_lm(SMALL["llama"])
    with torch.device("meta"), pytest.raises(RuntimeError, match="indices"):
        model(torch.zeros(1, 4))  # a forward that fails still puts Transformers' check back
    assert masking.find_packed_sequence_indices is original
