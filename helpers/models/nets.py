"""The lessons' small networks other than the GPT, and the block hook every model runs through (core).

- `BlockWrapper` and `run_blocks`: every model here and `helpers.models.gpt.GPT` runs its blocks
  through `self.block_wrapper(block, x)` when one is set; lessons set it to a
  `torch.utils.checkpoint.checkpoint` call in plain sight instead of hiding a flag inside the model.
- `ResidualMLP` (of `MLPBlock`s): a stack of pre-LayerNorm residual MLP blocks on vectors.
- `ConvNet`: a small ConvNet with BatchNorm (or GroupNorm, LayerNorm, none: `NORMS`).
- `DropoutMLP`: Linear -> ReLU -> dropout blocks whose dropout masks can be passed in
  (lesson 04 slices one batch's masks per micro-batch).
- `param_bytes(model)`: the bytes a model's parameters hold.

"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from helpers.core.validate import choice, instance_arg, number_in_range, positive_int

__all__ = ["NORMS", "BlockWrapper", "ConvNet", "DropoutMLP", "MLPBlock", "ResidualMLP", "param_bytes"]

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


