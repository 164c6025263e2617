"""Instruments for lesson 02: activation checkpointing, measured.

- `saved_tensor_table`, `korthikanti_terms`, `bytes_by_term`, `dropout_mask_bytes`
  (defined in `helpers.saved_tensors`): what autograd keeps for one block,
  op by op, beside Korthikanti et al.'s per-layer formula.
- `count_flops`: FLOPs of a callable, from `torch.utils.flop_counter`.
- `make_block_wrapper`: a `model.block_wrapper` for the policies "none", "full"
  and "selective" (save matmul outputs, recompute everything else).
- `make_chain`, `chain_layer_costs`, `segment_sweep`: the sqrt(n) experiment
  with `checkpoint_sequential`.
- `freeze_batchnorm_stats`: the fix for BatchNorm's double update.
- `explore` / `plot_explore`: the pure function behind the lesson's widget.

The checkpoint calls the lesson teaches are written out in the notebook; the
wrappers here exist so that sweeps and the widget can switch policy.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    checkpoint_sequential,
    create_selective_checkpoint_contexts,
)
from torch.utils.flop_counter import FlopCounterMode

from helpers.device import by_scale, median_seconds, seed_everything
from helpers.memory import MemoryTracker, StepMemory, measure_step, saved_activation_bytes
from helpers.models import GPT, GPTConfig, MLPBlock
from helpers.saved_tensors import (
    SavedTensor,
    bytes_by_term,
    dropout_mask_bytes,
    korthikanti_terms,
    saved_tensor_table,
)

__all__ = [
    "CHAIN_KINDS", "POLICIES", "Explored", "SavedTensor", "SegmentPoint", "bytes_by_term",
    "chain_layer_costs", "count_flops", "divisors", "dropout_mask_bytes", "explore",
    "freeze_batchnorm_stats", "korthikanti_terms", "make_block_wrapper", "make_chain",
    "plot_explore", "save_matmuls", "saved_tensor_table", "segment_cost", "segment_sweep",
    "widget_config",
]

POLICIES = ("none", "full", "selective")
CHAIN_KINDS = ("linear", "mlp")

# ---------------------------------------------------------------------------
# Cost: FLOPs
# ---------------------------------------------------------------------------


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs that `torch.utils.flop_counter.FlopCounterMode` counts while `fn()` runs.

    It counts matmuls, convolutions and attention; pointwise ops count zero.
    """
    if not callable(fn):
        raise ValueError(f"fn must be a zero-argument callable, got {type(fn).__name__}")
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


# ---------------------------------------------------------------------------
# Policies as block wrappers
# ---------------------------------------------------------------------------

MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)


def save_matmuls(ctx: object, op: object, *args: object, **kwargs: object) -> CheckpointPolicy:
    """Selective policy: keep the outputs of the Linear matmuls, recompute the rest.

    The rest is the cheap pointwise work and the attention core (q @ k^T,
    softmax, dropout, @ v), whose (s x s) tensors are the big ones.
    """
    return CheckpointPolicy.MUST_SAVE if op in MATMULS else CheckpointPolicy.PREFER_RECOMPUTE


def make_block_wrapper(
    policy: str, every: int = 1
) -> Callable[[nn.Module, torch.Tensor], torch.Tensor] | None:
    """A `model.block_wrapper` for `policy` in POLICIES, applied to every `every`-th block.

    "none" returns None (no checkpointing). "full" and "selective" call
    `checkpoint(block, x, use_reentrant=False)`, the latter with
    `context_fn` from `create_selective_checkpoint_contexts(save_matmuls)`.
    Blocks are counted in call order within one forward; every `every`-th one
    (the first, then every `every` after it) is checkpointed.
    """
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r} is not a policy; choose one of {POLICIES}")
    if not isinstance(every, int) or every < 1:
        raise ValueError(f"every must be an int >= 1, got {every!r}")
    if policy == "none":
        return None
    kwargs = {}
    if policy == "selective":
        kwargs["context_fn"] = functools.partial(create_selective_checkpoint_contexts, save_matmuls)
    seen: dict[int, int] = {}

    def wrapper(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
        index = seen.setdefault(id(block), len(seen))
        if index % every:
            return block(x)
        return checkpoint(block, x, use_reentrant=False, **kwargs)

    return wrapper


# ---------------------------------------------------------------------------
# Segments and sqrt(n)
# ---------------------------------------------------------------------------


def make_chain(n: int, width: int, kind: str = "linear") -> nn.Sequential:
    """A chain of `n` equal layers of `width` features.

    "linear": `nn.Linear` layers, each keeping one boundary-sized tensor (its
    input), so a ~= b. "mlp": `MLPBlock(width, expansion=2)`, each keeping about
    six boundary-sized tensors (LayerNorm input and output, fc1 output, GELU output).
    """
    if kind not in CHAIN_KINDS:
        raise ValueError(f"kind={kind!r} is not a chain kind; choose one of {CHAIN_KINDS}")
    if not isinstance(n, int) or n < 1 or not isinstance(width, int) or width < 1:
        raise ValueError(f"n and width must be positive ints, got n={n!r}, width={width!r}")
    if kind == "linear":
        return nn.Sequential(*(nn.Linear(width, width) for _ in range(n)))
    return nn.Sequential(*(MLPBlock(width, expansion=2) for _ in range(n)))


def chain_layer_costs(chain: nn.Sequential, x: torch.Tensor) -> tuple[int, int]:
    """(a, b): bytes one layer keeps for backward (its input included), bytes of one boundary.

    Measured on the first layer with the live tracker; b is the size of `x`.
    """
    a = saved_activation_bytes(lambda: chain[0](x.detach().clone().requires_grad_(True)))
    return a, x.numel() * x.element_size()


def segment_cost(a: float, b: float, n: int, k: int) -> float:
    """Chen et al.'s cost model of activation memory with k segments: a*n/k + b*k."""
    _check_segments(n, k)
    return a * n / k + b * k


def _check_segments(n: int, k: int) -> None:
    if not isinstance(k, int) or not 1 <= k <= n:
        raise ValueError(f"segments must be an int in [1, {n}] (the number of layers), got {k!r}")


@dataclass(frozen=True)
class SegmentPoint:
    """Measured activation memory of `checkpoint_sequential` with `segments` segments."""

    segments: int
    saved_bytes: int  # alive after forward, kept for backward
    peak_bytes: int  # largest activation + temporary memory through backward


def segment_sweep(chain: nn.Sequential, x: torch.Tensor, ks: Sequence[int]) -> list[SegmentPoint]:
    """Run forward + backward through `chain` cut into k segments, for each k in `ks`.

    Each run calls `checkpoint_sequential(chain, k, x, use_reentrant=False)`.

    Memory is measured with the live tracker: `saved_bytes` after forward (the
    output excluded), `peak_bytes` the most activation and temporary bytes
    (not parameters or gradients) alive at any point of forward and backward.
    """
    for k in ks:
        _check_segments(len(chain), k)
    return [_segment_point(chain, x, k) for k in ks]


def _segment_point(chain: nn.Sequential, x: torch.Tensor, k: int) -> SegmentPoint:
    with MemoryTracker(model=chain) as tracker:
        y = checkpoint_sequential(chain, k, x.detach().clone().requires_grad_(True),
                                  use_reentrant=False)
        saved = tracker.new_live_bytes(exclude=[y])
        y.sum().backward()
        del y
    tl = tracker.timeline()
    peak = max(a + o for a, o in zip(tl.series["activations"], tl.series["other"], strict=True))
    chain.zero_grad(set_to_none=True)
    return SegmentPoint(k, saved, peak)


def divisors(n: int) -> list[int]:
    """The k in 1..n that divide n: segment counts for which every segment is equal."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    return [k for k in range(1, n + 1) if n % k == 0]


# ---------------------------------------------------------------------------
# Pitfalls
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def freeze_batchnorm_stats(model: nn.Module) -> Iterator[None]:
    """Inside: BatchNorm layers run exactly as usual but their statistics do not move.

    Momentum is set to 0, so `running_mean` and `running_var` are rewritten
    with their own values, and `num_batches_tracked` is put back on exit. The
    ops and saved tensors are the same as in the original forward, which
    checkpoint's recompute check requires. Use it as the recompute context:
    `context_fn=lambda: (nullcontext(), freeze_batchnorm_stats(model))`.
    """
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    momenta = [m.momentum for m in norms]
    counts = [None if m.num_batches_tracked is None else m.num_batches_tracked.clone()
              for m in norms]
    for m in norms:
        m.momentum = 0.0
    try:
        yield
    finally:
        for m, momentum, count in zip(norms, momenta, counts, strict=True):
            m.momentum = momentum
            if count is not None:
                with torch.no_grad():
                    m.num_batches_tracked.copy_(count)


# ---------------------------------------------------------------------------
# Widget
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Explored:
    """One widget answer: memory and cost of a checkpointed step vs no checkpointing."""

    policy: str
    memory: StepMemory
    baseline: StepMemory
    flops: int
    baseline_flops: int
    seconds: float
    baseline_seconds: float

    @property
    def extra_flops(self) -> float:
        """Extra FLOPs as a fraction of the step without checkpointing."""
        return self.flops / self.baseline_flops - 1.0


def widget_config(scale: str, n_layers: int) -> GPTConfig:
    """The GPT the widget builds at `scale` with `n_layers` blocks."""
    d, s = by_scale(scale, tiny=(16, 16), small=(32, 32), full=(1024, 1024))
    return GPTConfig(vocab_size=128, seq_len=s, d_model=d, n_heads=4, n_layers=n_layers,
                     dropout=0.1)


def explore(
    n_layers: int = 8, every: int = 1, micro_batch: int = 8, policy: str = "full", *,
    scale: str = "small", device: torch.device | str = "cpu", seed: int = 0, repeats: int = 2,
) -> Explored:
    """Measure one training step of a GPT with `policy` on every `every`-th block.

    Returns the memory breakdown (`measure_step`), counted FLOPs and the median
    step time, each beside the same step without checkpointing.
    """
    if not isinstance(n_layers, int) or n_layers < 1:
        raise ValueError(f"n_layers must be an int >= 1, got {n_layers!r}")
    if not isinstance(every, int) or not 1 <= every <= n_layers:
        raise ValueError(f"every must be an int in [1, n_layers={n_layers}], got {every!r}")
    if not isinstance(micro_batch, int) or micro_batch < 1:
        raise ValueError(f"micro_batch must be an int >= 1, got {micro_batch!r}")
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r} is not a policy; choose one of {POLICIES}")
    seed_everything(seed)
    cfg = widget_config(scale, n_layers)
    model = GPT(cfg).to(device)
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, cfg.vocab_size, (micro_batch, cfg.seq_len), generator=gen).to(device)

    def step() -> None:
        logits = model(idx)
        F.cross_entropy(logits.flatten(0, 1), idx.flatten()).backward()
        model.zero_grad(set_to_none=True)

    def measure(name: str) -> tuple[StepMemory, int, float]:
        model.block_wrapper = make_block_wrapper(name, every)
        memory = measure_step(step, model=model)
        flops = count_flops(step)
        seconds = median_seconds(step, device=torch.device(device), repeats=repeats, warmup=1)
        return memory, flops, seconds

    key = (n_layers, micro_batch, scale, str(device), seed, repeats)
    if key not in _BASELINES:  # the no-checkpointing step does not depend on policy/every
        _BASELINES.clear()
        _BASELINES[key] = measure("none")
    base, base_flops, base_s = _BASELINES[key]
    mem, flops, secs = (base, base_flops, base_s) if policy == "none" else measure(policy)
    return Explored(policy, mem, base, flops, base_flops, secs, base_s)


_BASELINES: dict[tuple, tuple[StepMemory, int, float]] = {}


def plot_explore(result: Explored) -> object:
    """Bars of the two breakdowns, and a title with the FLOPs and time readout."""
    from helpers.plots import figure, stacked_bars

    fig, (ax,) = figure(1, width=6.5, height=3.4)
    stacked_bars(ax, {"no checkpointing": result.baseline.breakdown,
                      f"{result.policy}": result.memory.breakdown},
                 title=f"peak memory ({result.memory.method})")
    ax.set_xlabel(
        f"extra FLOPs {100 * result.extra_flops:+.0f}% | step time "
        f"{1e3 * result.baseline_seconds:.0f} -> {1e3 * result.seconds:.0f} ms "
        f"({result.seconds / result.baseline_seconds:.2f}x)"
    )
    return fig
