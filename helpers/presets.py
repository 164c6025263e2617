"""What `python -m helpers.plan` plans: the released models as presets, your own factory, a budget.

- `PRESETS`: GPT-2 small/medium/large/XL and Llama-like 1B and 7B shapes, in the project's own `GPT`
  class (untied head, GELU MLP, fused attention, no dropout); `preset_spec(name)`.
- `load_factory("package.module:factory")`, `hf_factory(config.json)` (only if `transformers` is
  installed): any other model, built on the meta device.
- `example_classifier`: a small ConvNet to try `--model helpers.plan:example_classifier` with.
- `parse_budget`: "24GB" (decimal: 24e9 bytes), "24 GiB" (binary: 24 x 2^30 bytes), "24e9" -> bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import re
from collections.abc import Callable

from torch import nn

from helpers.meta_profile import BatchSpec
from helpers.models import GPT, ConvNet, GPTConfig
from helpers.validate import ArgTypeError, positive_int, positive_number

__all__ = [
    "CARDS_GB", "DEFAULT_CUDA_MARGIN", "GB", "PRESETS", "example_classifier", "hf_factory", "load_factory",
    "parse_budget", "preset_spec",
]


GB = 1e9


CARDS_GB = (24, 40, 80)


DEFAULT_CUDA_MARGIN = 0.10


PRESETS: dict[str, GPTConfig] = {
    "gpt2-small": GPTConfig(50257, 1024, 768, 12, 12, dropout=0.0, fused_attention=True),
    "gpt2-medium": GPTConfig(50257, 1024, 1024, 16, 24, dropout=0.0, fused_attention=True),
    "gpt2-large": GPTConfig(50257, 1024, 1280, 20, 36, dropout=0.0, fused_attention=True),
    "gpt2-xl": GPTConfig(50257, 1024, 1600, 25, 48, dropout=0.0, fused_attention=True),
    "llama-1b": GPTConfig(32000, 2048, 2048, 32, 22, dropout=0.0, fused_attention=True),
    "llama-7b": GPTConfig(32000, 4096, 4096, 32, 32, dropout=0.0, fused_attention=True),
}


def preset_spec(
    name: str, seq_len: int | None = None
) -> tuple[Callable[[], nn.Module], BatchSpec, GPTConfig]:
    """(factory, batch spec, config) for a preset; `seq_len` overrides the preset's context length."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {tuple(PRESETS)}")
    cfg = PRESETS[name]
    if seq_len is not None:
        cfg = dataclasses.replace(cfg, seq_len=positive_int("seq_len", seq_len))
    return functools.partial(GPT, cfg), BatchSpec.lm(cfg.seq_len, cfg.vocab_size), cfg


def load_factory(path: str) -> Callable[[], nn.Module]:
    """Import "package.module:factory" and return the callable (it must build an nn.Module)."""
    if not isinstance(path, str) or path.count(":") != 1 or not all(path.split(":")):
        raise ValueError(f"--model must look like 'package.module:factory', got {path!r}")
    module_name, attr = path.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"cannot import module {module_name!r} for --model {path!r}: {err}") from err
    factory = module
    for part in attr.split("."):
        if not hasattr(factory, part):
            raise ValueError(f"module {module_name!r} has no attribute {attr!r} (from --model {path!r})")
        factory = getattr(factory, part)
    if not callable(factory):
        raise ValueError(f"{path!r} is not callable; it must be a function or class returning an nn.Module")
    return factory


def hf_factory(config_path: str, seq_len: int | None = None) -> tuple[Callable[[], nn.Module], BatchSpec]:
    """A Hugging Face causal LM built from a local config.json (no download, no weights).

    Needs `transformers` (an optional extra, not a dependency of this project).
    """
    try:
        import transformers
    except ImportError as err:
        raise ValueError(
            "--hf-config needs Hugging Face transformers, which is not installed "
            "(pip install transformers); the rest of this tool works without it"
        ) from err
    try:
        with open(config_path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read a JSON config from {config_path!r}: {err}") from err
    if "model_type" not in raw:
        raise ValueError(f"{config_path!r} has no 'model_type', so the architecture is unknown")
    config = transformers.AutoConfig.for_model(**raw)
    length = seq_len or getattr(config, "max_position_embeddings", None) or 1024

    def build() -> nn.Module:
        return transformers.AutoModelForCausalLM.from_config(config)

    return build, BatchSpec.lm(positive_int("seq_len", length), config.vocab_size)


_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1e3,
    "mb": 1e6,
    "gb": 1e9,
    "tb": 1e12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_budget(text: str | float) -> float:
    """Bytes from "24GB" (decimal), "24 GiB" (binary), "24e9" or a number; ValueError otherwise.

    GB, MB, kB and TB are decimal (10^9, ...); GiB, MiB, KiB and TiB are binary (2^30, ...).
    Cards are sold in GB but report binary units: a "24 GB" card reports about 24 GiB
    (25.8e9 bytes) in `torch.cuda.get_device_properties(0).total_memory`. So "24GB" plans
    within 24e9 bytes, 7% less than such a card has; write "24GiB" to plan for all of it.
    """
    if isinstance(text, bool):
        raise ArgTypeError(f"budget must be a string like '24GB' or a number of bytes, got {text!r}")
    if isinstance(text, int | float):
        return positive_number("budget", text)
    if not isinstance(text, str):
        raise ArgTypeError(
            f"budget must be a string like '24GB' or a number of bytes, got {type(text).__name__}"
        )
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(
            f"cannot parse budget {text!r}; write e.g. '24GB', '24 GiB', '80GB' or '24e9' (bytes)"
        )
    value = float(m.group(1)) * _UNITS[unit]
    if value <= 0:
        raise ValueError(f"budget must be positive, got {text!r}")
    return value


def example_classifier() -> nn.Module:
    """A small ConvNet with BatchNorm, for trying `--model helpers.plan:example_classifier`."""
    return ConvNet(3, 32, 4, 10)
