"""The Transformers oracles: what the tests hold the project's own architectures against.

- `hf_dict(cfg)`: the Transformers `config.json` dict of an `ArchConfig`, for building the same model
  with Transformers (`helpers.plan.hf_configs.transformers_causal_lm`) or writing a config file.
- `copy_transformers_weights(ours, theirs)`: Transformers' weights into `CausalLM`, for equal logits.
- `dropout_settings(model)`: every dropout probability a Transformers model holds.

Used only by tests, so they live here and not in `helpers/`.
"""

from __future__ import annotations

import torch
from torch import nn

from helpers.models.architecture_config import ArchConfig
from helpers.models.architectures import CausalLM


def hf_dict(cfg: ArchConfig) -> dict[str, object]:
    """The Transformers config.json dict of `cfg` (to write a file, or for `transformers_causal_lm`)."""
    if cfg.family == "gpt2":
        out: dict[str, object] = dict(
            model_type="gpt2", vocab_size=cfg.vocab_size, n_positions=cfg.max_positions,
            n_embd=cfg.hidden_size, n_layer=cfg.num_layers, n_head=cfg.num_heads,
            n_inner=cfg.intermediate_size,
            activation_function="gelu_new", layer_norm_epsilon=cfg.norm_eps, embd_pdrop=cfg.embd_dropout,
            attn_pdrop=cfg.attn_dropout, resid_pdrop=cfg.resid_dropout,
            tie_word_embeddings=cfg.tie_embeddings,
            bos_token_id=cfg.vocab_size - 1, eos_token_id=cfg.vocab_size - 1)  # GPT-2's end of text
    else:
        rope: dict[str, object] = {"rope_theta": cfg.rope_theta, "rope_type": "default"}
        if cfg.rope_scaling is not None:
            rope.update(dict(cfg.rope_scaling))
        out = dict(
            model_type=cfg.family, vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.kv_heads,
            max_position_embeddings=cfg.max_positions, rms_norm_eps=cfg.norm_eps, hidden_act="silu",
            tie_word_embeddings=cfg.tie_embeddings, attention_dropout=cfg.attn_dropout, rope_parameters=rope)
        if cfg.head_dim is not None:
            out["head_dim"] = cfg.head_dim
        if cfg.family == "llama":
            out.update(attention_bias=cfg.qkv_bias, mlp_bias=cfg.mlp_bias)
        if cfg.family == "mistral":
            out["sliding_window"] = cfg.sliding_window
        if cfg.family == "qwen2":
            out.update(use_sliding_window=False, sliding_window=None)
    if cfg.pad_token_id is not None:
        out["pad_token_id"] = cfg.pad_token_id
    if cfg.stored_dtype is not None:
        out["torch_dtype"] = cfg.stored_dtype
    return out


def copy_transformers_weights(own: CausalLM, hf_model: nn.Module) -> None:
    """Copy a Transformers model's weights into `own` (same config), so both compute the same function.

    Raises ValueError if a tensor is missing or has another shape (a different architecture).
    """
    src = dict(hf_model.state_dict())
    if own.cfg.family == "gpt2":
        names = {"tok.weight": "transformer.wte.weight", "pos.weight": "transformer.wpe.weight",
                 "norm.weight": "transformer.ln_f.weight", "norm.bias": "transformer.ln_f.bias"}
        inner = {"ln_1": "ln_1", "ln_2": "ln_2", "attn.c_attn": "attn.c_attn", "attn.c_proj": "attn.c_proj",
                 "c_fc": "mlp.c_fc", "c_proj": "mlp.c_proj"}
        prefix = "transformer.h"
    else:
        names = {"tok.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}
        inner = {"input_layernorm": "input_layernorm", "post_attention_layernorm": "post_attention_layernorm",
                 **{f"self_attn.{p}": f"self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj", "o_proj")},
                 **{p: f"mlp.{p}" for p in ("gate_proj", "up_proj", "down_proj")}}
        prefix = "model.layers"
    names["head.weight"] = "lm_head.weight"
    for i in range(own.cfg.num_layers):
        for ours, theirs in inner.items():
            for leaf in ("weight", "bias"):
                names[f"blocks.{i}.{ours}.{leaf}"] = f"{prefix}.{i}.{theirs}.{leaf}"
    target = own.state_dict()
    with torch.no_grad():
        for key, tensor in target.items():
            theirs = names.get(key)
            if theirs not in src or src[theirs].shape != tensor.shape:
                raise ValueError(f"no Transformers tensor of shape {tuple(tensor.shape)} for {key!r} "
                                 f"(looked for {theirs!r})")
            tensor.copy_(src[theirs])


def dropout_settings(model: nn.Module) -> dict[str, float]:
    """The dropout probabilities in `model.config` (every field whose name holds "drop")."""
    cfg = model.config.to_dict()  # type: ignore[union-attr]
    return {k: v for k, v in cfg.items() if "drop" in k and isinstance(v, float)}
