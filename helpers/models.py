"""Small, deterministic models that the lessons reuse (core, lessons 01-08).

- `ResidualMLP`: a stack of pre-LayerNorm residual MLP blocks on vectors.
- `GPT`: a small pre-LayerNorm GPT-style transformer. Attention is written out
  (Q, K, V, scores, softmax, dropout) so that every tensor autograd saves is a
  visible line of code; `fused_attention=True` switches to
  `torch.nn.functional.scaled_dot_product_attention` instead.
- `ConvNet`: a small ConvNet with BatchNorm (or GroupNorm, LayerNorm, none).
- `DropoutMLP`: Linear -> ReLU -> dropout blocks whose dropout masks can be passed in
  (lesson 04 slices one batch's masks per micro-batch).

Every model runs its blocks through `run_blocks`, which calls
`self.block_wrapper(block, x)` (a `BlockWrapper`) when one is set. Lessons set it to a
`torch.utils.checkpoint.checkpoint` call in plain sight instead of hiding a flag
inside the model.

- `explainer_config(scale)` / `explainer_model(scale, device)`: the explainer-sized GPT
  that lessons 01 and 02 measure, at each of `helpers.device.SCALES`.
- `seeded_gpt(cfg, device, seed)`: a GPT whose weights come from `seed`, built without
  touching the global RNG.
- `param_bytes(model)`, `device_of(model)`: small facts about a model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from helpers.device import SCALES, by_scale
from helpers.validate import choice, instance_arg, non_negative_int, number_in_range, positive_int

__all__ = [
    "GPT", "NORMS", "BlockWrapper", "CausalSelfAttention", "ConvNet", "DropoutMLP", "GPTBlock", "GPTConfig",
    "MLPBlock", "ResidualMLP", "deep_gpt_setup", "device_of", "explainer_config", "explainer_model",
    "param_bytes", "seeded_gpt",
]

# What `model.block_wrapper` holds: called as wrapper(block, x) in place of block(x).
BlockWrapper = Callable[[nn.Module, torch.Tensor], torch.Tensor]


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        positive_int(name, value)


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
    """`depth` residual MLP blocks between an input and an output projection.

    Args:
        d_in, width, depth, d_out: input size, block width, blocks and output size (each >= 1).
        expansion: each block's hidden layer is `expansion * width` wide.
    """

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


NORMS = ("batch", "group", "layer", "none")


def _norm(kind: str, channels: int) -> nn.Module:
    choice("norm", kind, NORMS)
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    if kind == "group":
        return nn.GroupNorm(min(4, channels), channels)
    if kind == "layer":
        return nn.GroupNorm(1, channels)  # LayerNorm over (C, H, W)
    return nn.Identity()


class ConvNet(_Blocks):
    """Conv -> norm -> ReLU blocks, global average pooling and a linear classifier.

    Args:
        in_channels, width, depth, num_classes: input channels, channels per block,
            blocks and classes (each >= 1).
        norm: "batch" (BatchNorm2d, the default), "group", "layer" or "none".
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


class DropoutMLP(nn.Module):
    """`n_dropout` blocks of Linear -> ReLU -> dropout, then a Linear head.

    `forward(x, masks)` uses the given keep-masks (one bool tensor of shape
    (len(x), width) per dropout layer) instead of drawing new ones, so the
    full batch's masks can be sliced per micro-batch.

    Args:
        d_in, width, d_out: input, hidden and output sizes.
        p: the dropout probability, in (0, 1).
        n_dropout: the number of dropout blocks.
    """

    def __init__(self, d_in: int, width: int, d_out: int, *, p: float = 0.5,
                 n_dropout: int = 2) -> None:
        super().__init__()
        _check_positive(d_in=d_in, width=width, d_out=d_out, n_dropout=n_dropout)
        number_in_range("p", p, 0.0, 1.0, low_open=True, high_open=True)
        self.p, self.width = p, width
        self.hidden = nn.ModuleList(
            nn.Linear(d_in if i == 0 else width, width) for i in range(n_dropout)
        )
        self.head = nn.Linear(width, d_out)

    def draw_masks(self, n: int, *, device: torch.device | str = "cpu") -> list[torch.Tensor]:
        """Fresh keep-masks for `n` examples (from the global RNG), one per dropout layer."""
        positive_int("n", n)
        return [torch.rand(n, self.width, device=device) >= self.p for _ in self.hidden]

    def forward(self, x: torch.Tensor, masks: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
        if masks is not None and len(masks) != len(self.hidden):
            raise ValueError(f"need {len(self.hidden)} masks (one per dropout layer), "
                             f"got {len(masks)}")
        for i, layer in enumerate(self.hidden):
            x = F.relu(layer(x))
            x = (x * masks[i] / (1.0 - self.p) if masks is not None
                 else F.dropout(x, self.p, self.training))
        return self.head(x)


def param_bytes(model: nn.Module) -> int:
    """Bytes held by the model's parameters (each storage counted once).

    Args:
        model: the model.

    Returns:
        The bytes.
    """
    instance_arg("model", model, nn.Module, "torch.nn.Module")
    seen: dict[int, int] = {}
    for p in model.parameters():
        st = p.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def device_of(model: nn.Module) -> torch.device:
    """The device of `model`'s first parameter (the lessons' models live on one device).

    Args:
        model: a module with at least one parameter.

    Returns:
        That parameter's device.

    Raises:
        ValueError: if `model` is not a module or has no parameters.
    """
    instance_arg("model", model, nn.Module, "torch.nn.Module")
    first = next(model.parameters(), None)
    if first is None:
        raise ValueError(f"model has no parameters, so no device: {type(model).__name__}")
    return first.device


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

    No dropout, attention written out: the model `helpers.formulas` describes.
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
    instance_arg("cfg", cfg, GPTConfig, "helpers.models.GPTConfig")
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
