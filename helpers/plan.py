"""Plan your own model (lesson 09): its training memory on a laptop, and a plan for a GPU you don't have.

`helpers.meta_profile` profiles any model's update on the meta device; this module
turns that into a plan with lesson 06's planner (`helpers.planner.recommend`):

- `PRESETS`: GPT-2 small/medium/large/XL and Llama-like 1B and 7B shapes, in the
  project's own `GPT` class (untied head, GELU MLP, fused attention, no dropout);
  `preset_spec`, `load_factory` ("package.module:factory"), `hf_factory` (a local
  Hugging Face config.json, only if `transformers` is installed).
- `parse_budget`: "24GB" (decimal GB: 24e9 bytes), "24 GiB" (binary: 24 x 2^30 bytes, the unit
  torch reports a card's memory in), "24e9" -> bytes; `reported_card_bytes` and `margin_line`:
  the card a budget stands for (a card sold as "24 GB" reports about 24 GiB), and the CUDA margin
  as a share of what that card reports.
- `plan_model` -> `PlanReport`: the profile of each phase, bytes per example, the
  planner's choice for a budget, the estimates people use beside ours, and what each
  remedy saves. `PlanReport.table()` prints it, `PlanReport.to_dict()` is the `--json`.
- `preset_profile`: a preset's `MemoryProfile` from a 1-block and a 2-block copy of
  the model, extrapolated to all blocks (every block is the same, so each figure is a
  straight line in the number of blocks; checked against the full profile).
- `show_plan`: the pure function behind the lesson's widget.
- `main`: `python -m helpers.plan`.
- `predicted_peak_bytes`, `widget_latency_cases`: the per-lesson protocol;
  `check_exercise_1` ... `check_exercise_3`: the exercise checkers.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from helpers.device import SCALES, by_scale
from helpers.meta_profile import (
    CHECKPOINTS,
    PRECISIONS,
    TARGETS,
    BatchSpec,
    Profiler,
    StepProfile,
)
from helpers.models import GPT, ConvNet, GPTConfig
from helpers.planner import CAVEATS, MemoryProfile, Plan, recommend, remedy_floors
from helpers.training import OPTIMIZERS
from helpers.validate import (
    ArgTypeError,
    answer_number,
    choice,
    number_in_range,
    positive_int,
    positive_number,
)

__all__ = [
    "CARDS_GB",
    "CHECK_MICRO_BATCH",
    "PRESETS",
    "PlanReport",
    "check_config",
    "check_exercise_1",
    "check_exercise_2",
    "check_exercise_3",
    "example_classifier",
    "gpt_param_count",
    "hf_factory",
    "load_factory",
    "main",
    "margin_line",
    "parse_budget",
    "plan_model",
    "predicted_peak_bytes",
    "preset_profile",
    "preset_spec",
    "reported_card_bytes",
    "show_plan",
    "widget_latency_cases",
]

GB = 1e9
CARDS_GB = (24, 40, 80)
DEFAULT_CUDA_MARGIN = 0.10

PRESETS: dict[str, GPTConfig] = {
    "gpt2-small": GPTConfig(50257, 1024, 768, 12, 12, dropout=0.0, fused_attention=True),
    "gpt2-medium": GPTConfig(50257, 1024, 1024, 16, 24, dropout=0.0, fused_attention=True),
    "gpt2-large": GPTConfig(50257, 1024, 1280, 20, 36, dropout=0.0, fused_attention=True),
    "gpt2-xl": GPTConfig(50257, 1024, 1600, 25, 48, dropout=0.0, fused_attention=True),
    "llama-1b": GPTConfig(32000, 2048, 2048, 32, 22, dropout=0.0, fused_attention=True),
    "llama-7b": GPTConfig(32000, 4096, 4096, 32, 32, dropout=0.0, fused_attention=True),
}


# ---------------------------------------------------------------------------
# Inputs: presets, factories, budgets
# ---------------------------------------------------------------------------


def preset_spec(
    name: str, seq_len: int | None = None
) -> tuple[Callable[[], nn.Module], BatchSpec, GPTConfig]:
    """(factory, batch spec, config) for a preset; `seq_len` overrides the preset's context length."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {tuple(PRESETS)}")
    cfg = PRESETS[name]
    if seq_len is not None:
        cfg = dataclasses.replace(cfg, seq_len=positive_int("seq_len", seq_len))
    return functools.partial(GPT, cfg), BatchSpec.lm(cfg.seq_len, cfg.vocab_size), cfg


def example_classifier() -> nn.Module:
    """A small ConvNet with BatchNorm, for trying `--model helpers.plan:example_classifier`."""
    return ConvNet(3, 32, 4, 10)


def load_factory(path: str) -> Callable[[], nn.Module]:
    """Import "package.module:factory" and return the callable (it must build an nn.Module)."""
    if not isinstance(path, str) or path.count(":") != 1 or not all(path.split(":")):
        raise ValueError(f"--model must look like 'package.module:factory', got {path!r}")
    module_name, attr = path.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"cannot import module {module_name!r} for --model {path!r}: {err}") from err
    factory = module
    for part in attr.split("."):
        if not hasattr(factory, part):
            raise ValueError(f"module {module_name!r} has no attribute {attr!r} (from --model {path!r})")
        factory = getattr(factory, part)
    if not callable(factory):
        raise ValueError(f"{path!r} is not callable; it must be a function or class returning an nn.Module")
    return factory


def hf_factory(config_path: str, seq_len: int | None = None) -> tuple[Callable[[], nn.Module], BatchSpec]:
    """A Hugging Face causal LM built from a local config.json (no download, no weights).

    Needs `transformers` (an optional extra, not a dependency of this project).
    """
    try:
        import transformers
    except ImportError as err:
        raise ValueError(
            "--hf-config needs Hugging Face transformers, which is not installed "
            "(pip install transformers); the rest of this tool works without it"
        ) from err
    try:
        with open(config_path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read a JSON config from {config_path!r}: {err}") from err
    if "model_type" not in raw:
        raise ValueError(f"{config_path!r} has no 'model_type', so the architecture is unknown")
    config = transformers.AutoConfig.for_model(**raw)
    length = seq_len or getattr(config, "max_position_embeddings", None) or 1024

    def build() -> nn.Module:
        return transformers.AutoModelForCausalLM.from_config(config)

    return build, BatchSpec.lm(positive_int("seq_len", length), config.vocab_size)


_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1e3,
    "mb": 1e6,
    "gb": 1e9,
    "tb": 1e12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_budget(text: str | float) -> float:
    """Bytes from "24GB" (decimal), "24 GiB" (binary), "24e9" or a number; ValueError otherwise.

    GB, MB, kB and TB are decimal (10^9, ...); GiB, MiB, KiB and TiB are binary (2^30, ...).
    Cards are sold in GB but report binary units: a "24 GB" card reports about 24 GiB
    (25.8e9 bytes) in `torch.cuda.get_device_properties(0).total_memory`. So "24GB" plans
    within 24e9 bytes, 7% less than such a card has; write "24GiB" to plan for all of it.
    """
    if isinstance(text, bool):
        raise ArgTypeError(f"budget must be a string like '24GB' or a number of bytes, got {text!r}")
    if isinstance(text, int | float):
        return positive_number("budget", text)
    if not isinstance(text, str):
        raise ArgTypeError(
            f"budget must be a string like '24GB' or a number of bytes, got {type(text).__name__}"
        )
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(
            f"cannot parse budget {text!r}; write e.g. '24GB', '24 GiB', '80GB' or '24e9' (bytes)"
        )
    value = float(m.group(1)) * _UNITS[unit]
    if value <= 0:
        raise ValueError(f"budget must be positive, got {text!r}")
    return value


def reported_card_bytes(budget_bytes: float) -> float:
    """What the card a budget stands for reports, in bytes.

    A budget of a whole number N of decimal GB is read as a card sold as "N GB", which
    reports about N GiB (a "24 GB" card: 24 x 2^30 = 25.8e9 bytes). Any other budget (in
    GiB, or in bytes) is taken as what the card reports.
    """
    gb = positive_number("budget_bytes", budget_bytes) / GB
    return round(gb) * 2**30 if round(gb) >= 1 and abs(gb - round(gb)) < 1e-9 else float(budget_bytes)


def _both_units(n: float) -> str:
    return f"{n / GB:.2f} GB ({n / 2**30:.2f} GiB)" if n >= 0.5 * GB else _fmt(n)


def margin_line(budget_bytes: float, usable_bytes: float) -> str:
    """The budget in both units, and the margin as a share of the budget and of the card it stands for."""
    card = reported_card_bytes(budget_bytes)
    kept = budget_bytes - usable_bytes
    text = f"budget {_both_units(budget_bytes)}, planning within {_both_units(usable_bytes)}"
    if kept <= 0:
        return text + " (no margin)"
    text += f": the margin keeps {kept / budget_bytes:.0%} of the budget free"
    if card != budget_bytes:
        n = round(budget_bytes / GB)
        text += (f", {1 - usable_bytes / card:.0%} of a card sold as {n} GB, which reports about {n} GiB = "
                 f"{card / GB:.1f} GB (--budget {n}GiB plans for all of it)")
    return text


# ---------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------


def _fmt(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.1f} MiB"


@dataclass
class PlanReport:
    """Everything `python -m helpers.plan` prints: profiles, the plan and the estimates beside it."""

    model: str
    n_params: int
    spec: str
    optimizer: str
    target: str
    precision: str
    kernels: tuple[str, ...]
    steps: dict[str, StepProfile]
    profiles: dict[str, MemoryProfile]
    budget_bytes: float
    usable_bytes: float
    effective_batch: int
    plan: Plan | None
    refusal: str
    checked_peak_bytes: int | None
    estimates: dict[str, float]
    remedies: dict[str, float]
    seconds: float
    notes: list[str] = field(default_factory=list)
    released_peak_bytes: int | None = None

    @property
    def predicted_peak_bytes(self) -> int | None:
        """The plan's peak: the larger of the fitted prediction and the full profile of that configuration."""
        if self.plan is None:
            return None
        return max(self.plan.predicted_peak_bytes, self.checked_peak_bytes or 0)

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready dict (bytes as ints)."""
        steps = {
            mode: {
                "micro_batch": s.micro_batch,
                "peak_bytes": s.peak_bytes,
                "floor_bytes": s.floor_bytes,
                "phases": {name: {"total": sum(b.values()), **b} for name, b in s.phases.items()},
                "binding_phase": s.binding_phase,
            }
            for mode, s in self.steps.items()
        }
        prof = {
            mode: {
                "floor_bytes": p.floor_bytes,
                "activation_bytes_per_example": round(p.activation_bytes_per_example),
                "other_bytes_per_example": round(p.other_bytes_per_example),
                "optimizer_peak_bytes": round(p.optimizer_peak_bytes),
                "held_output_bytes_per_example": round(p.held_output_bytes_per_example),
            }
            for mode, p in self.profiles.items()
        }
        plan = (
            None
            if self.plan is None
            else {
                "micro_batch": self.plan.micro_batch,
                "accumulation_steps": self.plan.accumulation_steps,
                "checkpoint": self.plan.checkpoint,
                "predicted_peak_bytes": self.predicted_peak_bytes,
                "fitted_peak_bytes": self.plan.predicted_peak_bytes,
                "checked_peak_bytes": self.checked_peak_bytes,
                "del_predictions_peak_bytes": self.released_peak_bytes,
                "del_predictions_saves_bytes": None if self.released_peak_bytes is None
                else self.predicted_peak_bytes - self.released_peak_bytes,
                "reason": self.plan.reason,
            }
        )
        return {
            "model": self.model,
            "parameters": self.n_params,
            "batch": self.spec,
            "optimizer": self.optimizer,
            "target": self.target,
            "precision": self.precision,
            "attention_kernels": list(self.kernels),
            "method": "meta-tracker",
            "loop": "the explainer's loop as written (predictions alive until the next micro-step)",
            "step_at_micro_batch_1": steps,
            "profiles": prof,
            "budget_bytes": round(self.budget_bytes),
            "usable_bytes": round(self.usable_bytes),
            "effective_batch": self.effective_batch,
            "plan": plan,
            "refusal": self.refusal or None,
            "estimates_bytes": {k: round(v) for k, v in self.estimates.items()},
            "remedy_savings_bytes": {k: round(v) for k, v in self.remedies.items()},
            "seconds": round(self.seconds, 2),
            "notes": self.notes,
        }

    def table(self) -> str:
        """The report as plain-text tables."""
        lines = [
            f"{self.model}: {self.n_params / 1e9:.3f} B parameters, {self.spec}",
            f"optimizer {self.optimizer}, precision {self.precision}, target {self.target} "
            f"(attention kernel: {', '.join(self.kernels) or 'none'}); profiled on the meta device "
            f"in {self.seconds:.1f} s",
            "",
        ]
        cats = ("parameters", "gradients", "optimizer_state", "activations", "other")
        head = f"{'micro-batch 1, K>=2':34s}" + "".join(f"{c[:11]:>12s}" for c in cats) + f"{'total':>12s}"
        lines.append(head)
        for mode, s in self.steps.items():
            for name, b in s.phases.items():
                row = f"{mode + ': ' + name:34s}" + "".join(f"{_fmt(b[c]):>12s}" for c in cats)
                lines.append(row + f"{_fmt(sum(b.values())):>12s}")
        lines.append("")
        for mode, p in self.profiles.items():
            lines.append(
                f"{mode:>6s}: floor {_fmt(p.floor_bytes)}, "
                f"activations {_fmt(p.activation_bytes_per_example)} "
                f"per example ({_fmt(p.held_output_bytes_per_example)} of it held by `predictions`), "
                f"optimizer-step peak {_fmt(p.optimizer_peak_bytes)}"
            )
        buffers = {k: v for s in self.steps.values() for k, v in s.kernel_buffer_bytes.items()}
        for kernel, n in sorted(buffers.items()):
            lines.append(f"{kernel} attention backward: {_fmt(n)} of its own buffers per call (other)")
        lines.append("")
        margin = margin_line(self.budget_bytes, self.usable_bytes)
        lines.append(f"{margin}; effective batch {self.effective_batch}")
        if self.plan is not None:
            checked = (
                ""
                if self.checked_peak_bytes is None
                else f"; profiled again: {_fmt(self.checked_peak_bytes)}"
            )
            lines.append(f"PLAN: {self.plan.describe().split(' (predicted')[0]} (predicted peak "
                         f"{_fmt(self.predicted_peak_bytes)}, the larger of the fit's "
                         f"{_fmt(self.plan.predicted_peak_bytes)}{checked})")
            lines.append(f"  {self.plan.reason}")
            if self.released_peak_bytes is not None:
                lines.append(
                    f"  with `del predictions` after the loss: peak {_fmt(self.released_peak_bytes)}, saves "
                    f"{_fmt(self.predicted_peak_bytes - self.released_peak_bytes)} (the plan is for the loop "
                    "as written, whose `predictions` variable holds the outputs until the next micro-step)"
                )
        else:
            lines.append(f"NO PLAN: {self.refusal}")
        lines.append("")
        lines.append("estimates beside ours:")
        for name, v in self.estimates.items():
            lines.append(f"  {name:48s}{_fmt(v):>12s}")
        lines.append("what each remedy would save:")
        for name, v in self.remedies.items():
            lines.append(f"  {name:48s}{_fmt(v):>12s}")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


def _estimates(n_params: int, optimizer: str, profile: MemoryProfile, b: int) -> dict[str, float]:
    state = {"sgd": 0, "sgd-momentum": 4, "adam": 8, "adamw": 8}[optimizer]
    return {
        "weights only (fp32, what loading tools count)": 4.0 * n_params,
        f"model states only (weights + grads + {optimizer} state)": (8.0 + state) * n_params,
        f"ours: profiled peak at micro-batch {b}": float(profile.predict_peak(b)),
    }


def _remedies(
    steps: dict[str, StepProfile], profiles: dict[str, MemoryProfile], b: int, optimizer: str
) -> dict[str, float]:
    plain = profiles["plain"]
    out = {}
    if b > 1:
        out[f"micro-batch {b} -> {b // 2} (accumulate twice as many steps)"] = plain.predict_peak(
            b
        ) - plain.predict_peak(b // 2)
    if "checkpointed" in profiles:
        out[f"checkpoint every block (at micro-batch {b})"] = plain.predict_peak(b) - profiles[
            "checkpointed"
        ].predict_peak(b)
    bd = steps["plain"].optimizer_breakdown
    p, g, s = bd["parameters"], bd["gradients"], bd["optimizer_state"]
    if optimizer in ("adam", "adamw") and min(p, g, s) > 0:
        for row in remedy_floors(p, g, s, workers=(8,)):
            if row.saving_bytes > 0:
                out[row.remedy] = row.saving_bytes
    return out


def _plan(profiles: dict[str, MemoryProfile], usable: float, effective_batch: int,
          min_micro_batch: int) -> tuple[Plan | None, str]:
    """The planner's choice for these profiles, or None and the refusal."""
    try:
        plan = recommend(usable, effective_batch, profiles["plain"], profiles.get("checkpointed"),
                         min_micro_batch=min_micro_batch)
    except ValueError as err:
        return None, str(err)
    return plan, ""


def plan_model(
    profiler: Profiler,
    *,
    name: str,
    budget_bytes: float,
    effective_batch: int,
    checkpoint: str = "blocks",
    cuda_margin: float = DEFAULT_CUDA_MARGIN,
    min_micro_batch: int = 1,
    check: bool = True,
) -> PlanReport:
    """Profile `profiler`'s model on meta and plan it for a budget (lesson 06's rule).

    `checkpoint="blocks"` lets the planner checkpoint every block when nothing fits
    without it; "none" keeps it off. For a CUDA target the planner keeps
    `cuda_margin` (a fraction) of the budget free for what tensors do not show: the
    CUDA context, cuBLAS/cuDNN workspaces and the caching allocator's fragmentation.
    With `check`, the chosen configuration is profiled again in full, and the report's
    predicted peak is the larger of the two (if the full profile is higher and over the
    budget, the profile is raised by the difference and the plan made again). The plan is
    for the explainer's loop as written; `released_peak_bytes` is the same configuration
    with `del predictions` after the loss.
    """
    if not isinstance(profiler, Profiler):
        raise ArgTypeError(f"profiler must be a helpers.meta_profile.Profiler, got {type(profiler).__name__}")
    choice("checkpoint", checkpoint, CHECKPOINTS)
    budget = positive_number("budget_bytes", budget_bytes)
    margin = number_in_range("cuda_margin", cuda_margin, 0.0, 1.0, high_open=True)
    usable = budget * (1 - margin) if profiler.target == "cuda" else budget
    start = time.perf_counter()
    modes = {"plain": "none"} if checkpoint == "none" else {"plain": "none", "checkpointed": "blocks"}
    profiles, steps = {}, {}
    for mode, ck in modes.items():
        profiles[mode] = profiler.memory_profile(ck, (1, 2))
        steps[mode] = profiler.step(1, checkpoint=ck)
    plan, refusal, checked, released = None, "", None, None
    for _ in range(4):  # a plan is never below its own full profile: raise the fit and replan if it was
        plan, refusal = _plan(profiles, usable, effective_batch, min_micro_batch)
        if plan is None or not check:
            break
        mode = "checkpointed" if plan.checkpoint else "plain"
        full = profiler.step(plan.micro_batch, checkpoint="blocks" if plan.checkpoint else "none",
                             accumulation_steps=min(plan.accumulation_steps, 2))
        checked, released = full.peak_bytes, full.released.peak_bytes if full.released else None
        short = checked - plan.predicted_peak_bytes
        if short <= 0 or checked <= usable:
            break
        profiles[mode] = dataclasses.replace(profiles[mode], other_bytes=profiles[mode].other_bytes + short)
    if plan is not None and checked is not None and checked > usable:
        refusal = (f"the best configuration the fit found, {plan.describe()}, peaks at {checked} bytes when "
                   f"profiled in full, over the {round(usable)} bytes available")
        plan, checked, released = None, None, None
    if plan is not None and not check:
        k = plan.accumulation_steps
        released = profiles["checkpointed" if plan.checkpoint else "plain"].predict_peak(
            plan.micro_batch, accumulation_steps=k, keep_output=False)
    b = plan.micro_batch if plan is not None else 1
    kernels = tuple(sorted({k for s in steps.values() for k in s.kernels}))
    notes = []
    if profiler.target == "cuda":
        notes.append(
            f"CUDA target: attention assumed {', '.join(kernels) or 'absent'} (PyTorch's CUDA SDPA order: "
            "flash for fp16/bf16 without a mask, else memory-efficient); foreach optimizer (about one "
            f"parameter-sized temporary during the step); {margin:.0%} of the budget kept free "
            "(--cuda-margin) for what the profile does not count: cuBLAS/cuDNN workspaces and kernels "
            "other than the assumed ones (inside torch.cuda.max_memory_allocated), fragmentation "
            "(memory_reserved minus memory_allocated) and the CUDA context (outside the allocator; "
            "nvidia-smi shows it)"
        )
        notes.append(
            "CUDA target: a fused-attention backward's own buffers are assumed, not measured: "
            "FlashAttention-2 keeps an fp32 dq accumulator and fp32 row sums; the memory-efficient kernel "
            "fp32 row sums, and fp32 dq, dk, dv accumulators for 16-bit inputs "
            "(helpers.kernel_buffers.attention_backward_buffer_bytes)"
        )
    if profiler.optimizer_name in ("adam", "adamw"):
        notes.extend(f"{name}: {caveat}" for name, caveat in CAVEATS.items())
    return PlanReport(
        name,
        profiler.n_params,
        profiler.spec.describe(),
        profiler.optimizer_name,
        profiler.target,
        profiler.precision,
        kernels,
        steps,
        profiles,
        budget,
        usable,
        effective_batch,
        plan,
        refusal,
        checked,
        _estimates(profiler.n_params, profiler.optimizer_name, profiles["plain"], b),
        _remedies(steps, profiles, b, profiler.optimizer_name),
        time.perf_counter() - start,
        notes,
        released,
    )


# ---------------------------------------------------------------------------
# Presets by extrapolation over blocks (the lesson's widget)
# ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def preset_profile(
    name: str,
    seq_len: int,
    checkpoint: str = "none",
    *,
    optimizer: str = "adam",
    target: str = "cuda",
    precision: str = "fp32",
) -> MemoryProfile:
    """A preset's `MemoryProfile`, from copies with 1 and 2 blocks extrapolated to all of them.

    Every block is identical, so each fitted figure (floor, bytes per example, the
    optimizer step's peak, ...) is a straight line in the number of blocks: two short
    profiles give it for any depth, in well under a second even for the 7B shape.
    """
    _, _, cfg = preset_spec(name, seq_len)
    fits = []
    for n in (1, 2):
        small = dataclasses.replace(cfg, n_layers=n)
        profiler = Profiler(
            functools.partial(GPT, small),
            BatchSpec.lm(cfg.seq_len, cfg.vocab_size),
            optimizer,
            target=target,
            precision=precision,
        )
        fits.append(profiler.memory_profile(checkpoint, (1, 2)))
    one, two = fits
    method = f"meta-tracker (target {target}), blocks extrapolated"
    return _extrapolated(one, two, cfg.n_layers, method=method, label=f"{name} {checkpoint}")


def _extrapolated(one: MemoryProfile, two: MemoryProfile, n: int, **names: str) -> MemoryProfile:
    """The profile of `n` blocks from those of 1 and 2 blocks: every figure on its straight line."""

    def line(attr: str) -> float:
        a, b = getattr(one, attr), getattr(two, attr)
        return a + (n - 1) * (b - a)

    numbers = {
        f.name: line(f.name)
        for f in dataclasses.fields(MemoryProfile)
        if f.name not in ("method", "micro_batches", "label", "released")
    }
    numbers["floor_bytes"] = round(numbers["floor_bytes"])
    numbers["gradient_bytes"] = round(numbers["gradient_bytes"])
    released = None
    if one.released is not None and two.released is not None:
        released = _extrapolated(one.released, two.released, n, **names)
    return MemoryProfile(**numbers, micro_batches=one.micro_batches, released=released, **names)


def gpt_param_count(cfg: GPTConfig) -> int:
    """Parameters of the project GPT with this config (untied head, biases, LayerNorms)."""
    v, s, h, n = cfg.vocab_size, cfg.seq_len, cfg.d_model, cfg.n_layers
    return v * h + s * h + n * (12 * h * h + 13 * h) + 2 * h + h * v


def show_plan(
    preset: str = "gpt2-xl",
    seq_len: int = 1024,
    micro_batch: int = 4,
    accumulation_steps: int = 8,
    checkpoint: bool = False,
    budget_gb: float = 24.0,
) -> None:
    """One widget move: the predicted peak of B x K for a preset, the estimates, and the planner's choice."""
    from helpers import plots

    b = positive_int("micro_batch", micro_batch)
    k = positive_int("accumulation_steps", accumulation_steps)
    budget = positive_number("budget_gb", budget_gb) * GB
    usable = budget * (1 - DEFAULT_CUDA_MARGIN)
    _, _, cfg = preset_spec(preset, seq_len)
    plain = preset_profile(preset, cfg.seq_len, "none")
    ckpt = preset_profile(preset, cfg.seq_len, "blocks")
    profile = ckpt if checkpoint else plain
    peak = profile.predict_peak(b, accumulation_steps=k)
    n = gpt_param_count(cfg)
    print(f"{preset}, sequence {cfg.seq_len}: {n / 1e9:.2f} B parameters; Adam fp32, CUDA target")
    print(f"effective batch B x K = {b} x {k} = {b * k}{', checkpointed' if checkpoint else ''}")
    fits = peak <= usable
    print(
        f"predicted peak {peak / GB:.1f} GB ({profile.binding_phase(b, accumulation_steps=k)} phase binds) "
        f"-> {'fits' if fits else 'does NOT fit'} in {usable / GB:.1f} GB "
        f"(after a {DEFAULT_CUDA_MARGIN:.0%} CUDA margin)"
    )
    print(margin_line(budget, usable))
    try:
        plan = recommend(usable, b * k, plain, ckpt)
        print(f"planner for {b * k} examples per update: {plan.describe()}\n  {plan.reason}")
    except ValueError as err:
        print(
            f"planner: no plan. The floor is {plain.floor_bytes / GB:.1f} GB; shard, offload or lower the "
            f"precision of the model state ({str(err).split('Remedies for the model state: ')[-1]})"
        )
    fig, (ax,) = plots.figure(width=7.0, height=3.0)
    acts = profile.activations(b) + profile.other_bytes + profile.other_bytes_per_example * b
    bars = {
        "weights only": {"parameters": 4 * n},
        "model states": {"parameters": 4 * n, "gradients": 4 * n, "optimizer_state": 8 * n},
        "ours (profiled)": {
            "parameters": 4 * n,
            "gradients": 4 * n,
            "optimizer_state": 8 * n,
            "activations": max(0.0, peak - 16 * n - max(0.0, acts - profile.activations(b))),
            "other": max(0.0, acts - profile.activations(b)),
        },
    }
    plots.stacked_bars(
        ax,
        bars,
        budget=budget,
        budget_label=f"{budget / GB:.0f} GB card (a budget: nothing allocated)",
        title=f"{preset}: {b} x {k}{' checkpointed' if checkpoint else ''}",
    )
    plots.show(fig)


# ---------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m helpers.plan",
        description="Profile a model's training memory on the meta device and plan micro-batch, "
        "accumulation and checkpointing for a GPU budget.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", help=f"one of {', '.join(PRESETS)}")
    src.add_argument("--model", help="package.module:factory, a callable returning an nn.Module")
    src.add_argument("--hf-config", help="a local Hugging Face config.json (needs transformers)")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (language models)")
    p.add_argument("--vocab-size", type=int, help="vocabulary size (language models, with --model)")
    p.add_argument("--input-shape", help="one example's shape, e.g. 3,224,224 (other models)")
    p.add_argument("--num-classes", type=int, help="number of classes (with --input-shape)")
    p.add_argument("--optimizer", default="adam", choices=OPTIMIZERS)
    p.add_argument("--budget", default="24GB", help="memory budget: 24GB (decimal, 24e9 bytes), '24 GiB' "
                   "(binary: a card sold as 24 GB reports about 24 GiB), 24e9 bytes (default 24GB)")
    p.add_argument(
        "--effective-batch", type=int, default=32, help="examples per optimizer update (default 32)"
    )
    p.add_argument(
        "--checkpoint",
        default="blocks",
        choices=CHECKPOINTS,
        help="blocks: the planner may checkpoint every block; none: never (default blocks)",
    )
    p.add_argument("--target", default="cuda", choices=TARGETS, help="device the plan is for (default cuda)")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS, help="fp32, or bf16 autocast")
    p.add_argument(
        "--cuda-margin",
        type=float,
        default=DEFAULT_CUDA_MARGIN,
        help="fraction of the budget kept free on CUDA (default 0.10)",
    )
    p.add_argument("--min-micro-batch", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    return p


def _spec_from_args(args: argparse.Namespace) -> BatchSpec:
    if args.input_shape is not None:
        if args.num_classes is None:
            raise ValueError("--input-shape needs --num-classes")
        try:
            shape = tuple(int(d) for d in args.input_shape.split(","))
        except ValueError as err:
            raise ValueError(
                f"--input-shape must be comma-separated ints like 3,224,224, got {args.input_shape!r}"
            ) from err
        return BatchSpec.classifier(shape, args.num_classes)
    if args.seq_len is None or args.vocab_size is None:
        raise ValueError(
            "describe the batch: --seq-len and --vocab-size for a language model, or "
            "--input-shape and --num-classes for other models"
        )
    return BatchSpec.lm(args.seq_len, args.vocab_size)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m helpers.plan ...`: print the profile and the plan (or JSON); 2 on bad input."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        budget = parse_budget(args.budget)
        if args.preset is not None:
            build, spec, _ = preset_spec(args.preset, args.seq_len)
            name = args.preset
        elif args.hf_config is not None:
            build, spec = hf_factory(args.hf_config, args.seq_len)
            name = args.hf_config
        else:
            build, spec, name = load_factory(args.model), _spec_from_args(args), args.model
        profiler = Profiler(build, spec, args.optimizer, target=args.target, precision=args.precision)
        report = plan_model(
            profiler,
            name=name,
            budget_bytes=budget,
            effective_batch=args.effective_batch,
            checkpoint=args.checkpoint,
            cuda_margin=args.cuda_margin,
            min_micro_batch=args.min_micro_batch,
        )
    except ValueError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.table())
    return 0


# ---------------------------------------------------------------------------
# Protocol and exercises
# ---------------------------------------------------------------------------


def check_config(scale: str) -> GPTConfig:
    """The small GPT whose meta profile the lesson checks against a real measurement."""
    return by_scale(
        scale,
        tiny=GPTConfig(256, 32, 64, 4, 2, dropout=0.0, fused_attention=True),
        small=GPTConfig(512, 128, 128, 4, 4, dropout=0.0, fused_attention=True),
        medium=GPTConfig(4096, 512, 512, 8, 8, dropout=0.0, fused_attention=True),
        full=GPTConfig(8192, 1024, 768, 12, 12, dropout=0.0, fused_attention=True),
    )


CHECK_MICRO_BATCH = 4


def predicted_peak_bytes(scale: str) -> int:
    """The peak of the lesson's only real run: `check_config(scale)` at micro-batch 4 with Adam.

    Computed by the meta profile the lesson checks against that very run (no memory
    is allocated for it). Everything else in the lesson lives on the meta device.
    """
    choice("scale", scale, SCALES)
    cfg = check_config(scale)
    profiler = Profiler(functools.partial(GPT, cfg), BatchSpec.lm(cfg.seq_len, cfg.vocab_size), "adam")
    return profiler.step(CHECK_MICRO_BATCH).peak_bytes


def widget_latency_cases(scale: str, device: torch.device) -> dict[str, Callable[[], object]]:
    """One callable per control of the lesson's widget (all work is on the meta device)."""
    choice("scale", scale, SCALES)
    base = {
        "preset": "gpt2-xl",
        "seq_len": 1024,
        "micro_batch": 4,
        "accumulation_steps": 8,
        "checkpoint": False,
        "budget_gb": 24.0,
    }
    moves = {
        "preset llama-1b": {"preset": "llama-1b"},
        "preset llama-7b": {"preset": "llama-7b"},
        "sequence 2048": {"seq_len": 2048},
        "B=1": {"micro_batch": 1},
        "B=16": {"micro_batch": 16},
        "K=1": {"accumulation_steps": 1},
        "K=32": {"accumulation_steps": 32},
        "checkpoint on": {"checkpoint": True},
        "budget 80 GB": {"budget_gb": 80.0},
    }
    return {name: (lambda kw={**base, **change}: show_plan(**kw)) for name, change in moves.items()}


def check_exercise_1(floor_gb: object) -> str:
    """Exercise 1: the floor of llama-7b with fp32 Adam, in GB (decimal)."""
    truth = preset_profile("llama-7b", 4096, "none").floor_bytes / GB
    x = answer_number(floor_gb)
    if x is None:
        msg = f"Give a number of GB, got {type(floor_gb).__name__}."
    elif abs(x - truth) <= 0.02 * truth:
        msg = (
            f"Correct: about {truth:.0f} GB, 16 bytes per parameter. It exceeds an 80 GB card before a "
            "single activation: no micro-batch, accumulation or checkpointing helps; "
            "shard or offload the state."
        )
    else:
        msg = "Not yet. Count 4 bytes of weights, 4 of gradients and 8 of Adam state per parameter."
    print(msg)
    return msg


def check_exercise_2(micro_batch: object, accumulation_steps: object, checkpoint: object) -> str:
    """Exercise 2: the planner's choice for gpt2-xl (sequence 1024), 40 GB card, 32 examples per update."""
    plain, ckpt = preset_profile("gpt2-xl", 1024, "none"), preset_profile("gpt2-xl", 1024, "blocks")
    plan = recommend(40 * GB * (1 - DEFAULT_CUDA_MARGIN), 32, plain, ckpt)
    answer = (micro_batch, accumulation_steps, checkpoint)
    if answer == (plan.micro_batch, plan.accumulation_steps, plan.checkpoint):
        msg = f"Correct: {plan.describe()}. {plan.reason}"
    elif answer[:2] == (plan.micro_batch, plan.accumulation_steps):
        msg = "Close: the sizes are right; does that micro-batch need checkpointing to fit?"
    else:
        msg = (
            "Not yet. Move the widget to gpt2-xl, 40 GB, and try B = 32, 16, 8, ... without checkpointing "
            "first, then with it; K = 32 / B."
        )
    print(msg)
    return msg


def check_exercise_3(bytes_saved: object) -> str:
    """Exercise 3: activation bytes per example that checkpointing saves for gpt2-xl at sequence 1024."""
    truth = (
        preset_profile("gpt2-xl", 1024, "none").activation_bytes_per_example
        - preset_profile("gpt2-xl", 1024, "blocks").activation_bytes_per_example
    )
    x = answer_number(bytes_saved)
    if x is None:
        msg = f"Give a number of bytes, got {type(bytes_saved).__name__}."
    elif abs(x - truth) <= 0.03 * truth:
        msg = f"Correct: about {truth / 2**30:.2f} GiB per example, paid for with one extra forward pass."
    else:
        msg = (
            "Not yet. Subtract the checkpointed profile's activation_bytes_per_example from the plain one's "
            "(preset_profile('gpt2-xl', 1024, ...))."
        )
    print(msg)
    return msg


if __name__ == "__main__":
    sys.exit(main())
