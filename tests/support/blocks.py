"""A block's saved activations per token, measured on the meta device (the tests' hand counts use it)."""

from __future__ import annotations

import dataclasses
import functools

from helpers.core.data import BatchSpec
from helpers.core.validate import positive_int
from helpers.meta.profiler import Profiler
from helpers.models.architecture_config import ArchConfig
from helpers.models.architectures import CausalLM
from helpers.models.gpt import GPT, GPTConfig


def block_activation_bytes(cfg: ArchConfig | GPTConfig, *, seq_len: int = 256, precision: str = "fp32",
                           target: str = "cuda") -> float:
    """Bytes one block keeps for backward, per token, measured on the meta device.

    Profiles copies of the model with one and two blocks at micro-batches of 1 and 2 sequences
    of `seq_len` tokens (`helpers.meta_profile.Profiler`, no checkpointing, one micro-step) and
    returns the activations at the end of the forward pass that grow with both: (2 blocks - 1
    block) at 2 sequences less the same at 1 sequence, divided by `seq_len`. What does not grow
    with the tokens (autocast's bf16 copies of the weights) drops out. `cfg` is an `ArchConfig`
    (`CausalLM`) or the project's `helpers.models.gpt.GPTConfig` (`GPT`, its position table sized to
    `seq_len`). Under "bf16" the precision is autocast's; `target` picks the attention kernel.
    """
    positive_int("seq_len", seq_len)
    if isinstance(cfg, ArchConfig):
        if seq_len > cfg.max_positions:
            raise ValueError(f"seq_len={seq_len} is beyond the config's {cfg.max_positions} positions")
        models = [functools.partial(CausalLM, dataclasses.replace(cfg, num_layers=n)) for n in (1, 2)]
    elif isinstance(cfg, GPTConfig):
        models = [functools.partial(GPT, dataclasses.replace(cfg, n_layers=n, seq_len=seq_len))
                  for n in (1, 2)]
    else:
        raise TypeError(f"cfg must be an ArchConfig or a GPTConfig, got {type(cfg).__name__}")
    ends = {}
    for n, build in enumerate(models, start=1):
        prof = Profiler(build, BatchSpec.lm(seq_len, cfg.vocab_size), precision=precision, target=target)
        for b in (1, 2):
            ends[n, b] = prof.step(b, accumulation_steps=1).forward_end_breakdown["activations"]
    return ((ends[2, 2] - ends[1, 2]) - (ends[2, 1] - ends[1, 1])) / seq_len
