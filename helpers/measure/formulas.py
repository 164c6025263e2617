"""Memory formulas the lessons check against measurement: parameter counts, activation bytes, peaks.

Every formula here is validated against a measurement (tests/measure/test_formulas.py and the lessons' check
cells); the lessons' `predicted_peak_bytes(scale)` size their experiments with them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from helpers.core.training import OPTIMIZERS, STATE_PER_PARAM
from helpers.core.validate import choice, instance_arg, positive_int, positive_number
from helpers.models.gpt import GPT, GPTConfig

__all__ = [
    "FP32", "KORTHIKANTI", "QUADRATIC_TERMS", "LinearFit", "activation_bytes_per_example",
    "convnet_activation_bytes", "convnet_param_count", "gpt_activation_bytes", "gpt_param_count",
    "gpt_step_peak_bytes", "held_logits_bytes_per_example", "korthikanti_activation_bytes",
    "korthikanti_terms", "linear_fit", "mlp_activation_bytes", "param_counts",
    "predicted_step_peak_bytes", "predicted_update_peak_bytes",
]


FP32 = 4  # bytes per float32 element


def _check_formula_config(cfg: GPTConfig) -> None:
    instance_arg("cfg", cfg, GPTConfig, "helpers.models.gpt.GPTConfig")
    if cfg.dropout != 0.0 or cfg.fused_attention:
        raise ValueError(
            "the formula covers the lesson's model only: dropout=0.0 and fused_attention=False, "
            f"got dropout={cfg.dropout}, fused_attention={cfg.fused_attention}"
        )


def activation_bytes_per_example(cfg: GPTConfig) -> int:
    """Float32 bytes autograd saves per example for one forward of the lesson's GPT.

    With s = sequence, h = d_model, a = heads, L = layers, V = vocabulary, in
    elements: L(16sh + as^2) + 2sh + 2(2L + 1)s + sV. Per block: LayerNorm inputs
    (2sh) and outputs (2sh), copies of q, k, v and of the attention output (4sh),
    the softmax output (as^2), the MLP's first Linear output (4sh) and GELU output
    (4sh). Then the last LayerNorm's input and output (2sh), every LayerNorm's
    mean and 1/std (2s each) and the log-softmax of the loss (sV).

    Args:
        cfg: the GPT's config: `dropout=0` and the written-out attention (the lesson's model).

    Returns:
        The bytes per example.
    """
    _check_formula_config(cfg)
    s, h, a, n, v = cfg.seq_len, cfg.d_model, cfg.n_heads, cfg.n_layers, cfg.vocab_size
    elements = n * (16 * s * h + a * s * s) + 2 * s * h + 2 * (2 * n + 1) * s + s * v
    return FP32 * elements


def held_logits_bytes_per_example(cfg: GPTConfig) -> int:
    """Float32 bytes per example of the logits that the loop's `logits` variable holds: s V floats.

    Autograd does not keep the logits (the loss's log-softmax keeps its own output), but
    the loop's variable does, until the next micro-step reassigns it; at the peak of an
    update they sit beside the saved activations.

    Args:
        cfg: the GPT's config.

    Returns:
        The bytes per example.
    """
    _check_formula_config(cfg)
    return FP32 * cfg.seq_len * cfg.vocab_size


def param_counts(cfg: GPTConfig) -> tuple[int, int]:
    """(parameter elements, parameter tensors) of GPT(cfg), built on the meta device (no memory)."""
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        model = GPT(cfg)
    params = list(model.parameters())
    return sum(p.numel() for p in params), len(params)


def predicted_update_peak_bytes(cfg: GPTConfig, micro_batch: int, *, optimizer: str = "adam",
                                steps: int = 2) -> int:
    """Predicted peak of one accumulation update of `steps` micro-batches (float32, CPU tracker).

    The peak comes at the start of the last micro-step's backward: parameters,
    gradients (alive from the second micro-step on), optimizer state (`STATE_PER_PARAM`
    parameter-sized tensors; Adam also a 4-byte step counter per parameter tensor), the micro-batch's
    activations (`activation_bytes_per_example`), the logits the loop's variable holds
    (`held_logits_bytes_per_example`, counted with the activations), and, as "other", the
    gradient of the logits and of their log-softmax (2 sV floats per example) and the
    causal masks (L s^2 bytes). On a GPU the caching allocator adds rounding, and Adam's
    step counters live on the CPU.

    Args:
        cfg: the GPT's config.
        micro_batch: sequences per micro-step.
        optimizer: one of `OPTIMIZERS`.
        steps: micro-steps in the update.

    Returns:
        The predicted peak bytes.
    """
    positive_int("micro_batch", micro_batch)
    positive_int("steps", steps)
    choice("optimizer", optimizer, OPTIMIZERS)
    _check_formula_config(cfg)
    n_elements, n_tensors = param_counts(cfg)
    p = FP32 * n_elements
    counters = FP32 * n_tensors if optimizer in ("adam", "adamw") else 0  # one step counter per tensor
    state = STATE_PER_PARAM[optimizer] * p + counters
    grads = p if steps >= 2 else 0
    s, v = cfg.seq_len, cfg.vocab_size
    per_example = activation_bytes_per_example(cfg) + held_logits_bytes_per_example(cfg) + 2 * FP32 * s * v
    fixed = 8 * s + 2 * FP32 + cfg.n_layers * s * s  # positions (int64), loss scalars, causal masks
    return p + grads + state + micro_batch * per_example + fixed


@dataclass(frozen=True)
class LinearFit:
    """y = slope * x + intercept, with its coefficient of determination."""

    slope: float
    intercept: float
    r2: float


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> LinearFit:
    """Least-squares line through (xs, ys) and its R^2.

    Args:
        xs, ys: two equal-length sequences of at least 2 points, with two distinct x values.

    Returns:
        A `LinearFit` (slope, intercept, r2).

    Raises:
        ValueError: for fewer than 2 points, unequal lengths, or all xs equal.
    """
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError(f"need two equal-length sequences of >= 2 points, got {len(xs)}, {len(ys)}")
    x = torch.tensor(xs, dtype=torch.float64)
    y = torch.tensor(ys, dtype=torch.float64)
    xm, ym = x.mean(), y.mean()
    sxx = ((x - xm) ** 2).sum()
    if sxx == 0:
        raise ValueError("xs are all equal; a line needs at least two distinct x values")
    slope = ((x - xm) * (y - ym)).sum() / sxx
    intercept = ym - slope * xm
    ss_res = ((y - (slope * x + intercept)) ** 2).sum()
    ss_tot = ((y - ym) ** 2).sum()
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return LinearFit(float(slope), float(intercept), float(r2))


# Korthikanti et al. 2022, Table/Sec. 4.1: bytes per layer in 16-bit, as
# (term, coefficient, unit, kind). unit "sbh" or "as2b"; kind "act" (2 bytes
# per element in 16-bit) or "mask" (dropout mask, 1 byte per element).
KORTHIKANTI = (
    ("LayerNorm inputs", 4, "sbh", "act"),
    ("QKV input", 2, "sbh", "act"),
    ("Q, K", 4, "sbh", "act"),
    ("softmax output", 2, "as2b", "act"),
    ("attention dropout mask", 1, "as2b", "mask"),
    ("attention dropout output", 2, "as2b", "act"),
    ("V", 2, "sbh", "act"),
    ("projection input", 2, "sbh", "act"),
    ("projection dropout mask", 1, "sbh", "mask"),
    ("MLP input", 2, "sbh", "act"),
    ("GELU input", 8, "sbh", "act"),
    ("fc_out input (GELU output)", 8, "sbh", "act"),
    ("MLP dropout mask", 1, "sbh", "mask"),
)


# The terms that grow with s^2: the attention core's softmax output, its dropout mask and output.
QUADRATIC_TERMS = ("softmax output", "attention dropout mask", "attention dropout output")


_DROPOUT_ONLY = {"attention dropout mask", "attention dropout output", "projection dropout mask",
                 "MLP dropout mask"}


def korthikanti_terms(
    *, s: int, b: int, h: int, a: int, act_bytes: float = 2, mask_bytes: float = 1,
    dropout: bool = True,
) -> dict[str, float]:
    """Bytes per transformer layer, term by term: sbh(34 + 5as/h) for 16-bit.

    Args:
        s, b, h, a: sequence length, micro-batch, hidden size and heads.
        act_bytes: element size of activations (2 in the paper, 4 in fp32); every
            2-byte term is scaled by act_bytes / 2.
        mask_bytes: element size of a dropout mask (1 for a bool mask).
        dropout: False leaves out the masks and the separate dropout output (then the
            softmax output itself).

    Returns:
        {term: bytes}, in the order of `KORTHIKANTI`.
    """
    for name, value in {"s": s, "b": b, "h": h, "a": a}.items():
        positive_int(name, value)
    positive_number("act_bytes", act_bytes)
    positive_number("mask_bytes", mask_bytes)
    unit = {"sbh": s * b * h, "as2b": a * s * s * b}
    out = {}
    for term, coef, size, kind in KORTHIKANTI:
        if not dropout and term in _DROPOUT_ONLY:
            continue
        # coef counts 2-byte elements for "act" terms and 1-byte elements for masks
        elements = coef / 2 if kind == "act" else coef
        out[term] = elements * (act_bytes if kind == "act" else mask_bytes) * unit[size]
    return out


def gpt_activation_bytes(cfg: GPTConfig, micro_batch: int, *, dtype_bytes: int = 4) -> int:
    """Predicted bytes autograd keeps for one forward + LM loss of `GPT(cfg)` on `micro_batch` sequences.

    Korthikanti et al.'s per-layer sbh(34 + 5as/h) without the dropout terms
    (dropout 0) at `dtype_bytes` per element, times the layers; plus the final
    LayerNorm's input and output (2 sbh) and the log-softmax output over the
    vocabulary (s b V). Lesson 03 checks it against `saved_activation_bytes`.

    Args:
        cfg: the GPT's config.
        micro_batch: sequences in the forward.
        dtype_bytes: bytes per activation element.

    Returns:
        The predicted bytes.
    """
    instance_arg("cfg", cfg, GPTConfig, "GPTConfig")
    positive_int("micro_batch", micro_batch)
    positive_int("dtype_bytes", dtype_bytes)
    s, b, h = cfg.seq_len, micro_batch, cfg.d_model
    layer = sum(korthikanti_terms(s=s, b=b, h=h, a=cfg.n_heads, act_bytes=dtype_bytes,
                                  dropout=False).values())
    return int(cfg.n_layers * layer + dtype_bytes * (2 * s * b * h + s * b * cfg.vocab_size))


def gpt_param_count(cfg: GPTConfig) -> int:
    """Number of parameters of `GPT(cfg)` (embeddings, blocks, final LayerNorm, untied head)."""
    h = cfg.d_model
    block = 2 * 2 * h + (3 * h * h + 3 * h) + (h * h + h) + (4 * h * h + 4 * h) + (4 * h * h + h)
    return (cfg.vocab_size + cfg.seq_len) * h + cfg.n_layers * block + 2 * h + h * cfg.vocab_size


def gpt_step_peak_bytes(cfg: GPTConfig, b: int) -> float:
    """16 bytes per parameter (fp32 weights, gradients, Adam's two moments) + activations.

    Activations: Korthikanti's per-layer bytes in fp32 with 4-byte dropout masks
    (CPU's; CUDA keeps 1 byte, so this is an upper bound) for every block plus one
    more for backward's working set, and three logits-sized tensors for the loss.
    """
    s, h, a = cfg.seq_len, cfg.d_model, cfg.n_heads
    layer = sum(korthikanti_terms(s=s, b=b, h=h, a=a, act_bytes=4, mask_bytes=4,
                                  dropout=cfg.dropout > 0).values())
    logits = 3 * b * s * cfg.vocab_size * 4
    return 16 * gpt_param_count(cfg) + (cfg.n_layers + 1) * layer + logits


def predicted_step_peak_bytes(cfg: GPTConfig, n_seqs: int) -> int:
    """Predicted peak of one float32 Adam full-batch step over `n_seqs` sequences of `seq_len`.

    16 bytes per parameter (weights, gradients, two Adam moments) plus, per
    sequence, lesson 01's validated activation formula
    (`helpers.measure.formulas.activation_bytes_per_example`) and the logits' gradient and
    log-softmax gradient (2 sV floats). Padded batches are at most this long, so
    this bounds lesson 05's steps; tests/techniques/test_tokens.py checks it against the CPU
    tracker (`cpu-tracker`). Nothing is allocated.
    """
    positive_int("n_seqs", n_seqs)
    per_seq = activation_bytes_per_example(cfg) + 2 * 4 * cfg.seq_len * cfg.vocab_size
    return 16 * gpt_param_count(cfg) + n_seqs * per_seq


def korthikanti_activation_bytes(cfg: GPTConfig, micro_batch: int, *, recompute: bool,
                                 act_bytes: int = 4) -> float:
    """Korthikanti et al.'s activation bytes for `cfg.n_layers` layers at `micro_batch`.

    The formula covers the transformer layers only.

    Args:
        cfg: the GPT's config (its dropout decides whether the dropout terms count).
        micro_batch: sequences per micro-batch.
        recompute: True for full recomputation: the 2sbh (16-bit) layer input per layer.
            False: sbh(34 + 5as/h) per layer in 16-bit.
        act_bytes: bytes per activation element.

    Returns:
        The bytes.
    """
    s, h, a, n = cfg.seq_len, cfg.d_model, cfg.n_heads, cfg.n_layers
    b = positive_int("micro_batch", micro_batch)
    if recompute:
        return n * s * b * h * act_bytes
    terms = korthikanti_terms(s=s, b=b, h=h, a=a, act_bytes=act_bytes, dropout=cfg.dropout > 0)
    return n * sum(terms.values())


def convnet_activation_bytes(batch: int, *, width: int, depth: int, size: int,
                             in_channels: int = 3, dtype_bytes: int = 4) -> int:
    """Predicted bytes autograd keeps for one forward of `ConvNet` (BatchNorm) on `batch` images.

    The input images, then per block the norm's input and the ReLU's output
    (the next convolution's input is that same ReLU output), each size x size
    per channel; plus the classifier's input. Checked against
    `saved_activation_bytes` in the tests (within 10%).
    """
    for name, value in (("batch", batch), ("width", width), ("depth", depth), ("size", size),
                        ("in_channels", in_channels), ("dtype_bytes", dtype_bytes)):
        positive_int(name, value)
    per_image = size * size * (in_channels + 2 * width * depth) + width
    return batch * per_image * dtype_bytes


def mlp_activation_bytes(n: int, *, d_in: int, width: int, depth: int, expansion: int = 4,
                         dtype_bytes: int = 4) -> int:
    """Predicted bytes autograd keeps for one forward of `ResidualMLP` on `n` examples.

    Per block: the LayerNorm's input and output, fc1's output and GELU's output
    (`expansion` x width each); plus the input and the output layer's input.
    Checked against `saved_activation_bytes` in the tests (within 10%).
    """
    for name, value in (("n", n), ("d_in", d_in), ("width", width), ("depth", depth),
                        ("expansion", expansion), ("dtype_bytes", dtype_bytes)):
        positive_int(name, value)
    per_example = d_in + width + depth * (2 * width + 2 * expansion * width)
    return n * per_example * dtype_bytes


def convnet_param_count(width: int, depth: int, in_channels: int = 3, classes: int = 10) -> int:
    convs = 9 * width * (in_channels + width * (depth - 1))
    return convs + 2 * width * depth + width * classes + classes
