"""Which parameters train: all, a name pattern, or LoRA factors on named linear layers (lesson 09).

`--trainable` of `python -m helpers.plan` and `helpers.meta_profile.Profiler(trainable=...)`:

- `"all"`: every parameter (full fine-tuning);
- a regular expression: only parameters whose name matches it (`re.search`) require grad;
- `"lora:<rank>[:<module-name regex>]"`: the base is frozen, and each linear layer whose module
  name matches the pattern (default `LORA_DEFAULT_TARGETS`: the query and value projections, as
  peft's defaults for Llama and GPT-2) gets two trainable factors A (rank x in) and B (out x rank),
  created on the same device as the layer (the meta device for a plan; no peft needed):
  y = base(x) + B(A(x)) * alpha / rank, with B zero at the start as in LoRA.

Gradients and optimizer state exist only for parameters that require grad, so the floor of a
LoRA plan is the frozen weights plus 16 bytes per LoRA parameter (fp32 Adam); the activations
of the frozen base are still saved whenever something upstream needs a gradient.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import nn

from helpers.core.validate import positive_int

__all__ = ["LORA_DEFAULT_TARGETS", "LoRALinear", "TrainableSpec", "apply_trainable", "parse_trainable",
           "trainable_count"]

LORA_DEFAULT_TARGETS = r"(q_proj|v_proj|c_attn)$"


@dataclass(frozen=True)
class TrainableSpec:
    """What trains: `kind` "all", "pattern" (parameter names matching `pattern`) or "lora"."""

    kind: str = "all"
    pattern: str = ""
    rank: int = 0
    alpha: float = 16.0

    def describe(self) -> str:
        """E.g. 'all parameters', 'parameters matching 'norm'', 'LoRA rank 16 on (q_proj|v_proj)$'."""
        if self.kind == "all":
            return "all parameters"
        if self.kind == "pattern":
            return f"parameters whose name matches {self.pattern!r}"
        return f"LoRA rank {self.rank} on linear layers matching {self.pattern!r} (base frozen)"


def parse_trainable(text: str | TrainableSpec) -> TrainableSpec:
    """A `TrainableSpec` from "all", a name regex, or "lora:<rank>[:<module-name regex>]".

    Raises:
        ValueError: an invalid regex, or a LoRA rank that is not a positive integer.
    """
    if isinstance(text, TrainableSpec):
        return text
    if not isinstance(text, str) or not text:
        raise ValueError(f"trainable must be 'all', a name regex or 'lora:<rank>[:<regex>]', got {text!r}")
    if text == "all":
        return TrainableSpec()
    if text.startswith("lora:"):
        rank_text, _, pattern = text[5:].partition(":")
        try:
            rank = positive_int("LoRA rank", int(rank_text))
        except ValueError as err:
            raise ValueError(f"trainable {text!r}: the LoRA rank must be a positive integer, as in "
                             f"'lora:16' or 'lora:16:q_proj|v_proj'") from err
        pattern = pattern or LORA_DEFAULT_TARGETS
        _compiled(pattern, text)
        return TrainableSpec("lora", pattern, rank)
    _compiled(text, text)
    return TrainableSpec("pattern", text)


def _compiled(pattern: str, text: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as err:
        raise ValueError(f"trainable {text!r}: {pattern!r} is not a regular expression ({err})") from err


class LoRALinear(nn.Module):
    """A frozen linear layer (nn.Linear, or GPT-2's Conv1D) plus trainable LoRA factors."""

    def __init__(self, base: nn.Module, rank: int, alpha: float = 16.0) -> None:
        super().__init__()
        weight = base.weight
        out_f, in_f = (weight.shape[1], weight.shape[0]) if type(base).__name__ == "Conv1D" else weight.shape
        self.base = base
        self.rank, self.scaling = rank, alpha / rank
        kw = {"device": weight.device, "dtype": weight.dtype}
        self.lora_A = nn.Linear(in_f, rank, bias=False, **kw)
        self.lora_B = nn.Linear(rank, out_f, bias=False, **kw)
        if weight.device.type != "meta":
            nn.init.kaiming_uniform_(self.lora_A.weight, a=5**0.5)
            nn.init.zeros_(self.lora_B.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_B(self.lora_A(x)) * self.scaling


def apply_trainable(model: nn.Module, spec: str | TrainableSpec) -> TrainableSpec:
    """Set which of `model`'s parameters require grad (and add LoRA factors), in place.

    Returns:
        The parsed spec.

    Raises:
        ValueError: when the pattern matches no parameter (or, for LoRA, no linear layer).
    """
    spec = parse_trainable(spec)
    if spec.kind == "all":
        return spec
    if spec.kind == "pattern":
        rx = _compiled(spec.pattern, spec.pattern)
        hits = 0
        for name, p in model.named_parameters():
            p.requires_grad_(bool(rx.search(name)))
            hits += p.requires_grad
        if not hits:
            raise ValueError(f"trainable pattern {spec.pattern!r} matches no parameter name")
        return spec
    model.requires_grad_(False)
    rx = _compiled(spec.pattern, spec.pattern)
    targets = [(name, m) for name, m in model.named_modules()
               if name and rx.search(name) and (isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D")]
    if not targets:
        raise ValueError(f"LoRA pattern {spec.pattern!r} matches no linear layer's module name")
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, LoRALinear(module, spec.rank, spec.alpha))
    return spec


def trainable_count(model: nn.Module) -> int:
    """Parameters that require grad (shared ones once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters() if p.requires_grad}.values())
