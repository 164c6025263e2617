"""A local Hugging Face `config.json` of a causal LM, built for a memory plan (lesson 09, `helpers.plan`).

`from_hf_config(path)` reads the file (nothing is downloaded) and builds, on whatever device the
caller's `torch.device` context names (the meta device for a plan):

- our own `helpers.models.architectures.CausalLM` when the model_type is one we implement ("gpt2",
  "llama", "mistral", "qwen2") and the config uses only what we build; it needs no Transformers;
- otherwise the Transformers model (`AutoModelForCausalLM.from_config`, random weights, SDPA
  attention, the KV cache off as in training), when Transformers is installed.

The config's `torch_dtype` (`dtype` in newer files) NEVER sets the training precision: models are
built in fp32 (Transformers' `from_config` would otherwise build a "bfloat16" config in bf16,
which is pure-bf16 training with no fp32 master weights). It is only recorded:
`HFModel.stored_line` says "weights stored as bf16".

- `arch_from_hf(raw)`: an `ArchConfig` from a config dict, or a ValueError naming what we do not build.
- `hf_dict(cfg)`: the config.json dict Transformers reads for an `ArchConfig` (the reverse).
- `transformers_causal_lm(raw)`: the Transformers model of a config dict, fp32, ready for a meta profile.
- `copy_transformers_weights(own, hf_model)`: load a Transformers model's weights into `CausalLM`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from helpers.core.data import BatchSpec
from helpers.core.validate import choice, positive_int
from helpers.models.architecture_config import ArchConfig
from helpers.models.architectures import CausalLM

__all__ = [
    "BUILDERS", "HF_TYPES", "HFModel", "arch_from_hf", "from_hf_config", "read_config",
    "transformers_causal_lm", "transformers_missing",
]

HF_TYPES = ("gpt2", "llama", "mistral", "qwen2")  # the model types `CausalLM` builds
BUILDERS = ("auto", "own", "transformers")
DEFAULT_MAX_SEQ = 4096  # the default planned length for long-context releases
NO_TRANSFORMERS = ("Hugging Face Transformers is not installed (pip install 'ckpt-vs-accum[frameworks]'); "
                   "it builds any causal LM Transformers knows. Without it, --hf-config covers the model "
                   f"types {', '.join(HF_TYPES)}, and every preset works")


def transformers_missing() -> bool:
    """True when `transformers` is not installed here, or installed but unable to run with this torch.

    Looked up first; an installed one is imported to ask (`helpers.frameworks.installed.unusable`).
    """
    try:
        if importlib.util.find_spec("transformers") is None:
            return True
    except (ImportError, ValueError):  # a finder that refuses it, or a module set to None
        return True
    from helpers.frameworks.installed import unusable

    return unusable("transformers") is not None


def _transformers():  # noqa: ANN202  (the module, imported only when needed)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # configs come from disk; nothing is downloaded
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if transformers_missing():
        raise ValueError(NO_TRANSFORMERS)
    from helpers.frameworks.installed import unusable

    why = unusable("transformers")
    if why is not None:
        raise ValueError(f"{why}. Without it, --hf-config covers the model types {', '.join(HF_TYPES)}, "
                         "and every preset works")
    return importlib.import_module("transformers")


def read_config(path: str | os.PathLike) -> dict[str, object]:
    """The dict in a local config.json; ValueError if it cannot be read or names no model_type."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read a JSON config from {str(path)!r}: {err}") from err
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise ValueError(f"{str(path)!r} has no 'model_type', so the architecture is unknown")
    return raw


def _stored_dtype(raw: Mapping[str, object]) -> str | None:
    value = raw.get("torch_dtype", raw.get("dtype"))
    return None if value in (None, "auto") else str(value).removeprefix("torch.")


def _rope(raw: Mapping[str, object]) -> tuple[float, tuple[tuple[str, float | str], ...] | None]:
    """(rope_theta, llama3 scaling) from a config in the old (rope_theta / rope_scaling) or new format."""
    params = dict(raw.get("rope_parameters") or {})
    scaling = dict(raw.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    merged = {**scaling, **params}
    kind = merged.get("rope_type", merged.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise ValueError(f"rope type {kind!r} is not built by helpers.models.architectures (it builds "
                         "'default' and 'llama3')")
    keys = ("factor", "high_freq_factor", "low_freq_factor", "original_max_position_embeddings")
    return theta, (*((k, float(merged[k])) for k in keys), ("rope_type", "llama3"))


def _refuse(model_type: str, what: str) -> None:
    raise ValueError(f"{model_type} config with {what} is not built by helpers.models.architectures")


# The defaults of Transformers' own config classes (LlamaConfig, MistralConfig, Qwen2Config; 5.x)
# where they differ by family: a hand-written config that leaves a field out gets what Transformers
# would build (tests/plan/test_hf_configs.py holds them against `AutoConfig.for_model`).
_LLAMA_FAMILY_DEFAULTS: dict[str, dict[str, object]] = {
    "llama": {"intermediate_size": 11008, "max_position_embeddings": 2048},
    "mistral": {"intermediate_size": 14336, "num_key_value_heads": 8, "max_position_embeddings": 131072,
                "sliding_window": 4096},
    "qwen2": {"intermediate_size": 22016, "max_position_embeddings": 32768},
}


def arch_from_hf(raw: Mapping[str, object]) -> ArchConfig:
    """The `ArchConfig` of a Transformers causal-LM config dict (the fields that shape memory).

    Raises:
        ValueError: for a model_type outside `HF_TYPES`, or a field `CausalLM` does not build
            (another activation, rope type or a Qwen2 sliding window), naming it.
    """
    kind = raw.get("model_type")
    if kind not in HF_TYPES:
        raise ValueError(f"model_type={kind!r} is not built by helpers.models.architectures; "
                         f"allowed: {HF_TYPES}")
    common = dict(vocab_size=int(raw.get("vocab_size", 0)), pad_token_id=raw.get("pad_token_id"),
                  name=str(raw.get("_name_or_path", "")), stored_dtype=_stored_dtype(raw))
    if kind == "gpt2":
        act = raw.get("activation_function", "gelu_new")
        if act != "gelu_new":
            _refuse(kind, f"activation_function={act!r} (only 'gelu_new')")
        if not raw.get("scale_attn_weights", True) or raw.get("scale_attn_by_inverse_layer_idx") \
                or raw.get("add_cross_attention"):
            _refuse(kind, "unscaled, layer-scaled or cross attention")
        h = int(raw.get("n_embd", 768))
        return ArchConfig("gpt2", hidden_size=h, intermediate_size=int(raw.get("n_inner") or 4 * h),
                          num_layers=int(raw.get("n_layer", 12)), num_heads=int(raw.get("n_head", 12)),
                          max_positions=int(raw.get("n_positions", 1024)),
                          tie_embeddings=bool(raw.get("tie_word_embeddings", True)),
                          norm_eps=float(raw.get("layer_norm_epsilon", 1e-5)), qkv_bias=True, o_bias=True,
                          mlp_bias=True, embd_dropout=float(raw.get("embd_pdrop", 0.1)),
                          attn_dropout=float(raw.get("attn_pdrop", 0.1)),
                          resid_dropout=float(raw.get("resid_pdrop", 0.1)), **common)
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        _refuse(kind, f"hidden_act={act!r} (only 'silu')")
    if kind == "qwen2" and raw.get("use_sliding_window"):
        _refuse(kind, "use_sliding_window=true")
    if any(t != "full_attention" for t in raw.get("layer_types") or ()):
        _refuse(kind, "layer_types other than 'full_attention'")
    theta, scaling = _rope(raw)
    raw = {**_LLAMA_FAMILY_DEFAULTS[str(kind)], **raw}  # what Transformers' config class fills in
    heads = int(raw.get("num_attention_heads", 32))
    bias = bool(raw.get("attention_bias", False))
    return ArchConfig(
        str(kind), hidden_size=int(raw.get("hidden_size", 4096)),
        intermediate_size=int(raw["intermediate_size"]),
        num_layers=int(raw.get("num_hidden_layers", 32)), num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=None if raw.get("head_dim") is None else int(raw["head_dim"]),
        max_positions=int(raw["max_position_embeddings"]),
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
        norm_eps=float(raw.get("rms_norm_eps", 1e-6)), rope_theta=theta, rope_scaling=scaling,
        qkv_bias=kind == "qwen2" or (bias and kind == "llama"), o_bias=bias and kind == "llama",
        mlp_bias=bool(raw.get("mlp_bias", False)) and kind == "llama",
        sliding_window=raw.get("sliding_window") if kind == "mistral" else None,
        attn_dropout=float(raw.get("attention_dropout", 0.0)), **common,
    )


@contextlib.contextmanager
def _packing_check_on_meta(masking: object) -> Iterator[None]:
    """Let Transformers' packed-sequence check run on meta position ids.

    With no attention mask and no cache (training), Transformers looks for packed sequences in the
    position ids and reads the answer with `.all()`, which a meta tensor cannot give. For meta ids
    this runs the same ops (the same temporaries) and answers "not packed", which is right for the
    ids the model makes itself (0 .. seq-1 in every row); real tensors go to Transformers' own check.
    """
    original = masking.find_packed_sequence_indices

    def find(position_ids: torch.Tensor) -> torch.Tensor | None:
        if position_ids.device.type != "meta":
            return original(position_ids)
        first = position_ids[:, :1] - 1
        (torch.diff(position_ids, prepend=first, dim=-1) != 1).cumsum(-1)
        return None

    masking.find_packed_sequence_indices = find
    try:
        yield
    finally:
        masking.find_packed_sequence_indices = original


def transformers_causal_lm(raw: Mapping[str, object], *, use_cache: bool = False) -> nn.Module:
    """The Transformers causal LM of a config dict: random weights, fp32, SDPA attention, in train mode.

    Built on the current default device (under `torch.device("meta")` for a plan). `use_cache=False`
    is what training wants: with the config's usual `use_cache=true`, Transformers keeps every
    layer's K and V in the output, alive as long as the loop holds the output. The config's dtype
    is ignored (fp32). On meta, Transformers' packed-sequence check is run without reading values.
    """
    transformers = _transformers()
    body = {k: v for k, v in raw.items() if k not in ("torch_dtype", "dtype", "architectures")}
    logs = transformers.utils.logging
    level = logs.get_verbosity()
    logs.set_verbosity_error()  # its notes about a config (token ids, defaults) stay off stderr
    try:
        config = transformers.AutoConfig.for_model(**{**body, "use_cache": use_cache})
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                                              attn_implementation="sdpa")
    finally:
        logs.set_verbosity(level)
    masking = importlib.import_module("transformers.masking_utils")
    stack: list[contextlib.ExitStack] = []

    def enter(module: nn.Module, args: object) -> None:
        stack.append(contextlib.ExitStack())
        stack[-1].enter_context(_packing_check_on_meta(masking))

    def leave(module: nn.Module, args: object, output: object) -> None:
        if stack:
            stack.pop().close()

    model.register_forward_pre_hook(enter)
    model.register_forward_hook(leave, always_call=True)
    return model.train()


@dataclass(frozen=True)
class HFModel:
    """What `from_hf_config` built: a factory, the batch, which builder, and what the config stores.

    `build()` makes the model on the current default device. `source` is "helpers.models.architectures"
    or "transformers"; `stored_dtype` the config's torch_dtype (never the training precision).
    """

    build: Callable[[], nn.Module]
    spec: BatchSpec
    model_type: str
    source: str
    stored_dtype: str | None
    arch: ArchConfig | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def stored_line(self) -> str:
        """E.g. 'weights stored as bf16 (the config's torch_dtype; training precision is set by the plan)'."""
        short = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
        if self.stored_dtype is None:
            return "weights' stored dtype not given by the config"
        stored = short.get(self.stored_dtype, self.stored_dtype)
        return (f"weights stored as {stored} (the config's torch_dtype; training precision is set by the "
                "plan, never by it)")


def from_hf_config(config: str | os.PathLike | Mapping[str, object], seq_len: int | None = None, *,
                   builder: str = "auto") -> HFModel:
    """Build a causal LM for planning from a local Hugging Face config.json (or its dict).

    Args:
        config: the path of a config.json, or the dict it holds.
        seq_len: tokens per sequence; default the config's positions, at most `DEFAULT_MAX_SEQ`.
        builder: "auto" (our `CausalLM` when it builds the config, else Transformers), "own"
            or "transformers".

    Returns:
        An `HFModel` whose `build()` makes the model in fp32 whatever the config's torch_dtype.

    Raises:
        ValueError: an unreadable config, a `seq_len` beyond its positions, a config `CausalLM`
            does not build with `builder="own"`, or Transformers missing where it is needed.
    """
    choice("builder", builder, BUILDERS)
    raw = dict(config) if isinstance(config, Mapping) else read_config(config)
    if "model_type" not in raw:
        raise ValueError("the config has no 'model_type', so the architecture is unknown")
    arch, why = None, ""
    if builder != "transformers":
        try:
            arch = arch_from_hf(raw)
        except ValueError as err:
            if builder == "own":
                raise
            why = str(err)
    if arch is None and transformers_missing():
        raise ValueError(f"{why}; {NO_TRANSFORMERS}" if why else NO_TRANSFORMERS)
    positions = arch.max_positions if arch is not None else _positions(raw)
    length = min(positions, DEFAULT_MAX_SEQ) if seq_len is None else positive_int("seq_len", seq_len)
    if length > positions:
        raise ValueError(f"seq_len={length} is beyond the config's {positions} positions; allowed: 1 to "
                         f"{positions}")
    stored = _stored_dtype(raw)
    notes = [] if stored is None else [f"the config's torch_dtype {stored!r} is recorded, not used: "
                                       "built in fp32"]
    if arch is not None:
        build: Callable[[], nn.Module] = functools.partial(CausalLM, arch)
        return HFModel(build, BatchSpec.lm(length, arch.vocab_size), str(raw["model_type"]),
                       "helpers.models.architectures", stored, arch, tuple(notes))
    if why:
        notes.append(f"built by Transformers: {why}")
    vocab = positive_int("vocab_size", raw.get("vocab_size", 0))
    return HFModel(functools.partial(transformers_causal_lm, raw), BatchSpec.lm(length, vocab),
                   str(raw["model_type"]), "transformers", stored, None, tuple(notes))


def _positions(raw: Mapping[str, object]) -> int:
    value = raw.get("max_position_embeddings", raw.get("n_positions"))
    if value is None:
        config = _transformers().AutoConfig.for_model(**{k: v for k, v in raw.items()
                                                        if k not in ("torch_dtype", "dtype")})
        value = getattr(config, "max_position_embeddings", 1024)
    return positive_int("max_position_embeddings", value)


