"""What `python -m helpers.plan` plans: the released models as presets, your own factory, a budget.

- `PRESETS`: the released models of `helpers.models.architecture_config.RELEASED` (GPT-2 small to XL with tied
  embeddings, Llama-3.2-1B/3B, Llama-3.1-8B, Mistral-7B, Qwen2.5-0.5B, TinyLlama-1.1B), their exact
  parameter counts whatever the sequence length; `preset_spec(name, seq_len)`.
- `load_factory("package.module:factory")`, `hf_factory(config.json)` (`helpers.plan.hf_configs`: our own
  architecture for GPT-2 and Llama-family configs, Transformers for the others): any other model.
- `example_classifier`: a small ConvNet to try `--model helpers.plan.presets:example_classifier` with.
- `parse_budget`: "24GB" (decimal: 24e9 bytes), "24 GiB" (binary: 24 x 2^30 bytes), "24e9" -> bytes.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable

from torch import nn

from helpers.core.data import BatchSpec
from helpers.core.validate import ArgTypeError, positive_number
from helpers.models.architecture_config import RELEASED, ArchConfig
from helpers.models.architectures import released
from helpers.models.nets import ConvNet
from helpers.plan.hf_configs import HFModel, from_hf_config

__all__ = [
    "CARDS_GB", "DEFAULT_CUDA_MARGIN", "GB", "PRESETS", "example_classifier", "hf_factory", "load_factory",
    "parse_budget", "preset_spec",
]


GB = 1e9


CARDS_GB = (24, 40, 80)


DEFAULT_CUDA_MARGIN = 0.10


PRESETS: dict[str, ArchConfig] = RELEASED


def preset_spec(
    name: str, seq_len: int | None = None
) -> tuple[Callable[[], nn.Module], BatchSpec, ArchConfig]:
    """A preset's model: `helpers.models.architectures.released(name, seq_len)`.

    The parameter count never changes with `seq_len`.

    Args:
        name: one of `PRESETS`.
        seq_len: tokens per sequence (default: as `released` picks).

    Returns:
        (factory, batch spec, config).

    Raises:
        ValueError: for an unknown preset, or a GPT-2 preset's `seq_len` > 1024 (its learned
            position table).
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {tuple(PRESETS)}")
    return released(name, seq_len)


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


def hf_factory(config_path: str, seq_len: int | None = None, *, builder: str = "auto") -> HFModel:
    """A causal LM from a local Hugging Face config.json (no download, no weights), always in fp32.

    `helpers.plan.hf_configs.from_hf_config`: our own architecture for GPT-2 and Llama-family configs
    (no Transformers needed), else Transformers' model; the config's torch_dtype is recorded
    (`HFModel.stored_line`: "weights stored as bf16 ..."), never used as the training precision.
    """
    return from_hf_config(config_path, seq_len, builder=builder)


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
    Cards are sold in GB and report less than as many GiB in
    `torch.cuda.get_device_properties(0).total_memory`: a "24 GB" L4 reports 21.96 GiB, an
    RTX 4090 23.99 GiB. `python -m helpers.plan --gpu L4` plans for one card's own figure
    (`helpers.plan.cards`).
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
    """A small ConvNet with BatchNorm, for trying `--model helpers.plan.presets:example_classifier`."""
    return ConvNet(3, 32, 4, 10)
