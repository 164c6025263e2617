"""Small, deterministic models that the lessons reuse.

- `ResidualMLP`: a stack of pre-LayerNorm residual MLP blocks on vectors.
- `GPT`: a small pre-LayerNorm GPT-style transformer. Attention is written out
  (Q, K, V, scores, softmax, dropout) so that every tensor autograd saves is a
  visible line of code; `fused_attention=True` switches to
  `torch.nn.functional.scaled_dot_product_attention` instead.
- `ConvNet`: a small ConvNet with BatchNorm (or GroupNorm, LayerNorm, none).

Every model runs its blocks through `run_blocks`, which calls
`self.block_wrapper(block, x)` when one is set. Lessons set it to a
`torch.utils.checkpoint.checkpoint` call in plain sight instead of hiding a flag
inside the model.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

BlockWrapper = Callable[[nn.Module, torch.Tensor], torch.Tensor]


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


class _Blocks(nn.Module):
    """Mixin: run `self.blocks` in order, through `block_wrapper` if one is set."""

    blocks: nn.ModuleList
    block_wrapper: BlockWrapper | None = None

    def run_blocks(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x) if self.block_wrapper is None else self.block_wrapper(block, x)
        return x


class MLPBlock(nn.Module):
    """x + Linear(GELU(Linear(LayerNorm(x)))): one residual block of width `width`."""

    def __init__(self, width: int, expansion: int = 4) -> None:
        super().__init__()
        _check_positive(width=width, expansion=expansion)
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, expansion * width)
        self.fc2 = nn.Linear(expansion * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class ResidualMLP(_Blocks):
    """`depth` residual MLP blocks between an input and an output projection."""

    def __init__(self, d_in: int, width: int, depth: int, d_out: int, expansion: int = 4) -> None:
        super().__init__()
        _check_positive(d_in=d_in, width=width, depth=depth, d_out=d_out)
        self.inp = nn.Linear(d_in, width)
        self.blocks = nn.ModuleList(MLPBlock(width, expansion) for _ in range(depth))
        self.out = nn.Linear(width, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.run_blocks(self.inp(x)))


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of the GPT-style model. `dropout` applies to attention and residuals."""

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
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


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
    """Pre-LayerNorm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

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
    """A small GPT-style language model: token + position embeddings, blocks, LM head."""

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


NORMS = ("batch", "group", "layer", "none")


def _norm(kind: str, channels: int) -> nn.Module:
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    if kind == "group":
        return nn.GroupNorm(min(4, channels), channels)
    if kind == "layer":
        return nn.GroupNorm(1, channels)  # LayerNorm over (C, H, W)
    if kind == "none":
        return nn.Identity()
    raise ValueError(f"norm={kind!r} is not supported; choose one of {NORMS}")


class ConvNet(_Blocks):
    """Conv -> norm -> ReLU blocks, global average pooling and a linear classifier.

    `norm` is 'batch' (BatchNorm2d, the default), 'group', 'layer' or 'none'.
    """

    def __init__(
        self, in_channels: int = 3, width: int = 16, depth: int = 3, num_classes: int = 10,
        norm: str = "batch",
    ) -> None:
        super().__init__()
        _check_positive(in_channels=in_channels, width=width, depth=depth, num_classes=num_classes)
        _norm(norm, width)  # validate early, before building anything
        layers = []
        channels = in_channels
        for _ in range(depth):
            layers.append(
                nn.Sequential(
                    nn.Conv2d(channels, width, 3, padding=1, bias=norm == "none"),
                    _norm(norm, width),
                    nn.ReLU(),
                )
            )
            channels = width
        self.blocks = nn.ModuleList(layers)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.run_blocks(x).mean(dim=(2, 3)))


def param_bytes(model: nn.Module) -> int:
    """Bytes held by the model's parameters (each storage counted once)."""
    seen: dict[int, int] = {}
    for p in model.parameters():
        st = p.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())
