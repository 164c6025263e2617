"""What the ledger's checks share (lesson 08): the `Lab` of models and data, and `Evidence`.

Most checks run on a small, fast GPT (`LAB_CONFIG`). The headline numbers
(`LESSON_MODEL_CLAIMS`) run on the model of the lesson that shows them, at this device's
scale: lesson 02's GPT (`helpers.models.gpt.deep_gpt_setup`) and lesson 01's
(`helpers.models.gpt.explainer_model`). `helpers.ledger.claims` holds the claims themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from helpers.core.data import token_batch
from helpers.core.device import lesson_scale
from helpers.core.validate import choice
from helpers.models.gpt import GPT, GPTConfig, deep_gpt_setup, explainer_model, seeded_gpt

__all__ = ["LAB_CONFIG", "LESSON_MODELS", "LESSON_MODEL_CLAIMS", "SWEEP", "Evidence", "Lab", "gib"]


# -- the lab every check shares --------------------------------------------------------
# Micro-batches for the sweep: from 4 up the forward pass sets the peak (below, the optimizer step can).
SWEEP = (4, 6, 8)
LAB_CONFIG = GPTConfig(vocab_size=64, seq_len=32, d_model=32, n_heads=2, n_layers=2, dropout=0.0)
# The claims whose numbers the lessons headline, and the lesson whose model (and micro-batch) they use.
LESSON_MODEL_CLAIMS = {"C08": "01", "C09": "02", "C11": "02", "C25": "01"}
LESSON_MODELS = ("01", "02")


@dataclass
class Lab:
    """The models and data the quick checks share (built once per ledger run).

    `model` is the fast lab GPT (`LAB_CONFIG`); `lesson_model("01")` and `lesson_model("02")`
    are those lessons' GPTs, built on first use.

    Args:
        device: where the models live.
        scale: the lessons' scale (default: this device's lesson scale).
    """

    device: torch.device
    scale: str = ""
    model: GPT = field(init=False)
    cache: dict[str, object] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.scale = self.scale or lesson_scale(self.device)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self.model = GPT(LAB_CONFIG).to(self.device).train()

    def lesson_model(self, lesson: str) -> GPT:
        """The GPT lesson `lesson` ("01" or "02") measures at `self.scale`, seeded as the lesson seeds it.

        "01": `explainer_model(scale)`; "02": `GPT(deep_gpt_setup(scale)[0])`, the
        model of lesson 02's sections 2-9 (8 blocks, dropout 0.1).
        """
        choice("lesson", lesson, LESSON_MODELS)

        def build() -> GPT:
            if lesson == "01":
                return explainer_model(self.scale, self.device)
            return seeded_gpt(deep_gpt_setup(self.scale)[0], self.device)

        return self.once(f"lesson_model {lesson}", build)

    def lesson_tokens(self, lesson: str, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """`n` random sequences for `lesson_model(lesson)`."""
        cfg = self.lesson_model(lesson).cfg
        return token_batch(n, cfg.seq_len, cfg.vocab_size, seed=seed, device=self.device)

    def once(self, key: str, make: Callable[[], object]) -> object:
        """`make()` the first time `key` is asked for, the cached result afterwards."""
        if key not in self.cache:
            self.cache[key] = make()
        return self.cache[key]

    def tokens(self, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """`n` random sequences (inputs, next-token targets) on the lab's device."""
        return token_batch(n, LAB_CONFIG.seq_len, LAB_CONFIG.vocab_size, seed=seed, device=self.device)


@dataclass(frozen=True)
class Evidence:
    """What a check measured: pass/fail, the headline number with its unit, and a sentence.

    `figures` holds other numbers the same measurement gave (named), for text that quotes them
    (lesson 08's cheat sheet), so nothing is measured twice.
    """

    passed: bool
    value: float
    unit: str
    detail: str
    figures: Mapping[str, float] = field(default_factory=dict)




def gib(n: float) -> str:
    """`n` bytes for a ledger sentence (`helpers.core.units.format_bytes`)."""
    from helpers.core.units import format_bytes

    return format_bytes(n)
