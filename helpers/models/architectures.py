"""The released models people fine-tune, as torch modules: GPT-2 and the Llama family (lesson 09).

Each preset in `RELEASED` is a published `config.json` written in code (nothing is downloaded),
and `CausalLM(cfg)` builds that architecture with the released model's exact parameter count:

- **GPT-2** (small, medium, large, XL): token and learned position embeddings (a table fixed
  at 1,024 positions), pre-LayerNorm blocks whose attention and MLP are Transformers' `Conv1D`
  layers (`addmm` on a transposed weight), GELU "gelu_new" written out as Transformers writes it,
  dropout 0.1 where the config has it, and a head tied to the token embedding.
- **Llama family** (Llama-3.2-1B/3B, Llama-3.1-8B, Mistral-7B, Qwen2.5-0.5B, TinyLlama-1.1B):
  RMSNorm with Transformers' fp32 upcast, a SwiGLU MLP, rotary positions (no parameters; cos and
  sin computed once per forward and shared by every block), grouped-query attention, q/k/v biases
  for Qwen2, a sliding-window mask for Mistral when the sequence reaches the window, and a tied
  head where the release ties it (Llama-3.2-1B/3B, Qwen2.5-0.5B).

The ops are Transformers' own, in its order (checked against Transformers 5.24), so autograd
saves the same tensors: attention runs through `torch.nn.functional.scaled_dot_product_attention`
called as Transformers' `sdpa_attention_forward` calls it. With no mask it passes `is_causal=True`
(for more than one token) and, for grouped-query attention with head_dim <= 256, `enable_gqa=True`;
with a mask (Mistral's window) it expands K and V first (`repeat_kv`), and the expanded copies are
what attention saves. The logits come out in the head's dtype; the loss upcasts them (`lm_loss`'s
cross-entropy under autocast, as Transformers' `ForCausalLMLoss` does with `.float()`).

Blocks sit in an `nn.ModuleList` named `blocks` and run through `block_wrapper(block, x)` when one
is set (the convention of `helpers.models.gpt`), so `checkpoint` and `helpers.meta_profile.Profiler`
work unchanged. A Llama-family block also needs the shared rotary cos/sin (and the mask): the
wrapper gets `functools.partial(block, rope=..., mask=...)` in place of the block.

- `ArchConfig`, `RELEASED`, `PUBLISHED_PARAMETERS`, `param_count(cfg)` (closed form), in
  `helpers.models.architecture_config`; the layers in `helpers.models.architecture_layers`.
- `CausalLM(cfg)`; `released(name, seq_len)` -> (factory, `BatchSpec`, cfg), a `ValueError`
  beyond the release's positions.
- `block_activation_bytes(cfg, ...)`: the bytes one block saves for backward, per token.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn

from helpers.core.data import BatchSpec
from helpers.core.validate import choice, positive_int
from helpers.models.architecture_config import RELEASED, ArchConfig
from helpers.models.architecture_layers import GPT2Block, LlamaBlock, RMSNorm, Rotary
from helpers.models.nets import BlockWrapper

__all__ = ["CausalLM", "released"]

# ---------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------


class CausalLM(nn.Module):
    """A released causal LM's architecture (`ArchConfig`): token ids (batch, seq) in, logits out.

    `blocks` run through `self.block_wrapper(block, x)` when it is set (see the module docstring).
    """

    block_wrapper: BlockWrapper | None = None

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        if not isinstance(cfg, ArchConfig):
            raise TypeError(f"cfg must be an ArchConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.hidden_size, cfg.pad_token_id)
        if cfg.llama_like:
            self.blocks = nn.ModuleList(LlamaBlock(cfg) for _ in range(cfg.num_layers))
            self.norm: nn.Module = RMSNorm(cfg.hidden_size, cfg.norm_eps)
            self.rotary = Rotary(cfg)
        else:
            self.pos = nn.Embedding(cfg.max_positions, cfg.hidden_size)
            self.drop = nn.Dropout(cfg.embd_dropout)
            self.blocks = nn.ModuleList(GPT2Block(cfg) for _ in range(cfg.num_layers))
            self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        if cfg.tie_embeddings:
            self.head.weight = self.tok.weight

    def run_blocks(self, x: torch.Tensor, **extra: object) -> torch.Tensor:
        """Each block in turn, through `block_wrapper` if set; `extra` goes to every block."""
        for block in self.blocks:
            step: Callable[..., torch.Tensor] = functools.partial(block, **extra) if extra else block
            x = step(x) if self.block_wrapper is None else self.block_wrapper(step, x)
        return x

    def _mask(self, b: int, s: int, device: torch.device) -> torch.Tensor | None:
        """Mistral's sliding-window mask, made when the sequence reaches the window (else None)."""
        w = self.cfg.sliding_window
        if w is None or s < w or self.cfg.family == "qwen2":
            return None
        q = torch.arange(s, device=device)[None, None, :, None]
        kv = torch.arange(s, device=device)[None, None, None, :]
        keep = q.new_ones((), dtype=torch.bool)
        keep = keep & (kv > q - w).to(keep.device)
        keep = keep & (kv <= q).to(keep.device)
        return keep.expand(b, -1, s, s)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Map token ids (batch, seq) to logits (batch, seq, vocab)."""
        if idx.dim() != 2 or idx.size(1) > self.cfg.max_positions:
            raise ValueError(f"idx must be (batch, seq) with seq <= {self.cfg.max_positions}, got "
                             f"{tuple(idx.shape)}")
        b, s = idx.shape
        if self.cfg.llama_like:
            x = self.tok(idx)
            position_ids = (torch.arange(s, device=x.device) + 0).unsqueeze(0)
            mask = self._mask(b, s, x.device)
            x = self.run_blocks(x, rope=self.rotary(x, position_ids), mask=mask, position_ids=position_ids)
        else:
            idx = idx.view(-1, s)
            x = self.tok(idx)
            position_ids = (torch.arange(s, device=x.device) + 0).unsqueeze(0)
            x = self.drop(x + self.pos(position_ids).to(x.device))
            x = self.run_blocks(x)
        x = self.norm(x) if self.cfg.llama_like else self.norm(x).view(b, s, -1)
        return self.head(x[:, slice(0, None), :])


def released(name: str, seq_len: int | None = None) -> tuple[Callable[[], nn.Module], BatchSpec, ArchConfig]:
    """(factory, batch spec, config) of a released model in `RELEASED`, for sequences of `seq_len` tokens.

    Args:
        name: a key of `RELEASED` (e.g. "gpt2-small", "llama-3.2-1b").
        seq_len: tokens per sequence; defaults to the release's positions (GPT-2: 1,024; capped at
            4,096 for the long-context releases, a common fine-tuning length).

    Returns:
        A zero-argument factory building `CausalLM(cfg)`, the `BatchSpec` and the config. The
        parameter count never depends on `seq_len`.

    Raises:
        ValueError: for an unknown name, or a `seq_len` beyond what the release was built for
            (GPT-2's learned position table has 1,024 rows).
    """
    choice("name", name, tuple(RELEASED))
    cfg = RELEASED[name]
    length = min(cfg.max_positions, 4096) if seq_len is None else positive_int("seq_len", seq_len)
    if length > cfg.max_positions:
        what = ("its learned position table has" if cfg.family == "gpt2" else "it was released for")
        raise ValueError(f"seq_len={length} is too long for {name}: {what} {cfg.max_positions} positions; "
                         f"allowed: 1 to {cfg.max_positions}")
    return functools.partial(CausalLM, cfg), BatchSpec.lm(length, cfg.vocab_size), cfg


