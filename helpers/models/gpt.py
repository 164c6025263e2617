"""Small, deterministic models that the lessons reuse (core, lessons 01-10).

- `GPT` (`GPTConfig`, `GPTBlock`, `CausalSelfAttention`): a small pre-LayerNorm GPT-style
  transformer. Attention is written out (Q, K, V, scores, softmax, dropout) so that every
  tensor autograd saves is a visible line of code; `fused_attention=True` switches to
  `torch.nn.functional.scaled_dot_product_attention` instead.
- `explainer_config(scale)` / `explainer_model(scale, device)`: the explainer-sized GPT
  that lessons 01 and 02 measure, at each of `helpers.device.SCALES`; `deep_gpt_setup(scale)`:
  the deeper GPT lesson 02 checkpoints.
- `seeded_gpt(cfg, device, seed)`: a GPT whose weights come from `seed`, built without
  touching the global RNG.
- Re-exported from `helpers.models.nets`: `ResidualMLP`, `MLPBlock`, `ConvNet`, `NORMS`,
  `DropoutMLP`, `param_bytes`, `device_of`, and `BlockWrapper`: every model runs its blocks
  through `run_blocks`, which calls `self.block_wrapper(block, x)` when one is set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from helpers.core.device import SCALES, by_scale
from helpers.core.validate import choice, instance_arg, non_negative_int, number_in_range
from helpers.models.nets import _Blocks, _check_positive

__all__ = [
    "GPT", "CausalSelfAttention", "GPTBlock", "GPTConfig", "deep_gpt_setup", "explainer_config",
    "explainer_model", "seeded_gpt",
]


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of the GPT-style model.

    Attributes:
        vocab_size, seq_len, d_model, n_heads, n_layers: the sizes (each >= 1; d_model
            divisible by n_heads).
        dropout: applies to attention and residuals, in [0, 1).
        fused_attention: use `scaled_dot_product_attention` instead of the written-out attention.

    Raises:
        ValueError: for a size below 1, d_model not divisible by n_heads, or dropout out of range.
    """

    vocab_size: int = 128
    seq_len: int = 64
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 4
    dropout: float = 0.1
    fused_attention: bool = False

    def __post_init__(self) -> None:
        _check_positive(
            vocab_size=self.vocab_size,
            seq_len=self.seq_len,
            d_model=self.d_model,
            n_heads=self.n_heads,
            n_layers=self.n_layers,
        )
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}"
            )
        number_in_range("dropout", self.dropout, 0.0, 1.0, high_open=True)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention, written out op by op."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.dropout = cfg.dropout
        self.fused = cfg.fused_attention
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.attn_drop = nn.Dropout(cfg.dropout)
        self.resid_drop = nn.Dropout(cfg.dropout)
        mask = torch.ones(cfg.seq_len, cfg.seq_len, dtype=torch.bool).tril()
        self.register_buffer("future", ~mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).split(h, dim=2)
        # (b, s, h) -> (b, heads, s, head_dim)
        q, k, v = (t.view(b, s, self.n_heads, h // self.n_heads).transpose(1, 2) for t in (q, k, v))
        if self.fused:
            p = self.dropout if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
            scores = scores.masked_fill(self.future[:s, :s], float("-inf"))
            probs = self.attn_drop(scores.softmax(dim=-1))
            y = probs @ v
        y = y.transpose(1, 2).reshape(b, s, h)
        return self.resid_drop(self.proj(y))


class GPTBlock(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x)).

    Args:
        cfg: the sizes (d_model, heads, dropout, attention kernel) of the GPT it belongs to.
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.fc_out = nn.Linear(4 * cfg.d_model, cfg.d_model)
        self.mlp_drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp_drop(self.fc_out(F.gelu(self.fc(self.ln2(x)))))


class GPT(_Blocks):
    """A small GPT-style language model: token + position embeddings, blocks, LM head.

    Args:
        cfg: its sizes; `forward(idx)` maps token ids (batch, seq) to logits (batch, seq, vocab).
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(GPTBlock(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Map token ids (batch, seq) to logits (batch, seq, vocab)."""
        if idx.dim() != 2 or idx.size(1) > self.cfg.seq_len:
            raise ValueError(
                f"idx must be (batch, seq) with seq <= {self.cfg.seq_len}, got {tuple(idx.shape)}"
            )
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.drop(self.tok(idx) + self.pos(pos))
        return self.head(self.ln_f(self.run_blocks(x)))


# -- the explainer-sized GPT (lessons 01 and 02) ---------------------------------------------
_EXPLAINER_SIZES = {
    "tiny": dict(vocab_size=64, seq_len=32, d_model=32, n_heads=2, n_layers=2),
    "small": dict(vocab_size=256, seq_len=64, d_model=64, n_heads=4, n_layers=4),
    # 63 M parameters; micro-batch 16 peaks at about 6.7 GB (a 12-40 GB GPU, e.g. a T4).
    "medium": dict(vocab_size=8192, seq_len=512, d_model=768, n_heads=12, n_layers=8),
    # 161 M parameters; micro-batch 12 peaks at about 23 GB (a GPU with 40 GB or more).
    "full": dict(vocab_size=8192, seq_len=1024, d_model=1024, n_heads=16, n_layers=12),
}


def explainer_config(scale: str) -> GPTConfig:
    """GPT sizes of the model lessons 01 and 02 measure at `scale` (one of `helpers.device.SCALES`).

    No dropout, attention written out: the model `helpers.measure.formulas` describes.
    """
    choice("scale", scale, SCALES)
    return GPTConfig(dropout=0.0, **_EXPLAINER_SIZES[scale])


def seeded_gpt(cfg: GPTConfig, device: torch.device | str, seed: int = 0) -> GPT:
    """A freshly initialised `GPT(cfg)` on `device`, in train mode, its weights drawn from `seed`.

    The weights come from torch's CPU generator seeded with `seed` (the same numbers
    as `torch.manual_seed(seed)` followed by `GPT(cfg)`), inside `fork_rng`, so the
    caller's random stream (CPU and CUDA) is left as it was.

    Args:
        cfg: the model's sizes.
        device: where the model goes.
        seed: a non-negative int.

    Returns:
        The `GPT`.
    """
    instance_arg("cfg", cfg, GPTConfig, "helpers.models.gpt.GPTConfig")
    non_negative_int("seed", seed)
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        model = GPT(cfg)
    return model.to(device).train()


def explainer_model(scale: str, device: torch.device | str, seed: int = 0) -> GPT:
    """A freshly initialised `explainer_config(scale)` GPT on `device`, in train mode (`seeded_gpt`).

    Args:
        scale: "tiny", "small", "medium" or "full".
        device: where the model goes.
        seed: the seed its weights are drawn from.

    Returns:
        The `GPT`.
    """
    return seeded_gpt(explainer_config(scale), device, seed)


def deep_gpt_setup(scale: str) -> tuple[GPTConfig, int]:
    """The GPT that lesson 02's sections 2-9 checkpoint.

    Args:
        scale: "tiny", "small", "medium" or "full".

    Returns:
        (config, micro-batch).
    """
    cfg = by_scale(
        scale,
        tiny=GPTConfig(vocab_size=64, seq_len=32, d_model=32, n_heads=2, n_layers=8, dropout=0.1),
        small=GPTConfig(vocab_size=128, seq_len=64, d_model=64, n_heads=4, n_layers=8, dropout=0.1),
        medium=GPTConfig(vocab_size=8192, seq_len=1024, d_model=512, n_heads=8, n_layers=8, dropout=0.1),
        full=GPTConfig(vocab_size=8192, seq_len=1024, d_model=1024, n_heads=16, n_layers=12, dropout=0.1),
    )
    return cfg, by_scale(scale, tiny=4, small=8, medium=4, full=4)
