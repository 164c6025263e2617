"""`python -m helpers.plan`: plan your own model's training memory for a GPU you don't have (lesson 09).

The command reads a model (`--preset`, `--model package.module:factory` or `--hf-config`), a batch
and a budget, profiles one training update on the meta device (`helpers.meta_profile.Profiler`),
and prints the plan (`helpers.plan.report.plan_model`): the inputs live in `helpers.plan.presets`, the
report in `helpers.plan.report`. `example_classifier` (from `helpers.plan.presets`) is a small model to
try `--model helpers.plan.presets:example_classifier` with.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
from collections.abc import Sequence

from helpers.core.data import BatchSpec
from helpers.core.training import OPTIMIZERS
from helpers.meta.profiler import CHECKPOINTS, OPTIMIZER_IMPLS, PRECISIONS, TARGETS, Profiler
from helpers.meta.target_kernels import GPUS
from helpers.plan.calibration import status
from helpers.plan.cards import CARDS, CONTEXT_BYTES, CONTEXT_SOURCE, Card, auto_card, budget_bytes, card
from helpers.plan.hf_configs import BUILDERS, NO_TRANSFORMERS, transformers_missing
from helpers.plan.presets import (
    DEFAULT_CUDA_MARGIN,
    PRESETS,
    hf_factory,
    load_factory,
    parse_budget,
    preset_spec,
)
from helpers.plan.report import PlanReport, plan_model

__all__ = ["main"]


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
    src.add_argument("--hf-config", help="a local Hugging Face config.json: GPT-2, Llama, Mistral and Qwen2 "
                     "configs are built here; any other causal LM needs transformers")
    p.add_argument("--hf-builder", default="auto", choices=BUILDERS,
                   help="auto: our own architecture when it builds the config, else Transformers")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (language models)")
    p.add_argument("--vocab-size", type=int, help="vocabulary size (language models, with --model)")
    p.add_argument("--input-shape", help="one example's shape, e.g. 3,224,224 (other models)")
    p.add_argument("--num-classes", type=int, help="number of classes (with --input-shape)")
    p.add_argument("--optimizer", default="adam", choices=OPTIMIZERS)
    p.add_argument("--optimizer-impl", default="default", choices=OPTIMIZER_IMPLS,
                   help="default: foreach on CUDA (parameter-sized temporaries in the step), the "
                   "per-tensor loop on CPU; fused (fused=True: modelled as per-tensor on meta); per-tensor "
                   "(foreach=False)")
    p.add_argument("--budget", default=None, help="memory budget: 24GB (decimal, 24e9 bytes), '24 GiB' "
                   "(binary, 2**30), or 24e9 bytes. A card sold as 24 GB reports less (an L4 21.96 GiB, "
                   "an RTX 3090 23.7 GiB): name it with --gpu instead. Default: the --gpu card's own memory "
                   "less the CUDA context, or 24GB for a card named only by its capability")
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
    p.add_argument("--gpu", default="A100", help=f"the CUDA card: one of {', '.join(CARDS)} (its compute "
                   "capability and, without --budget, its memory as torch reports it); auto (this machine's "
                   f"GPU); or only a capability: {', '.join(g for g in GPUS if g not in CARDS)}, 8.0 or 75. "
                   "The capability sets the attention kernel (no flash attention below sm80, e.g. a T4) "
                   "(default A100: sm80, and a 24GB budget)")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS,
                   help="fp32; bf16: autocast over fp32 master weights, fp32 gradients, fp32 Adam "
                   "(16 B/param); pure-bf16: everything bf16 (8 B/param; small updates are lost without "
                   "stochastic rounding or Kahan summation). A config's torch_dtype never sets it "
                   "(default fp32)")
    p.add_argument("--trainable", default="all",
                   help="all; a parameter-name regex; or lora:<rank>[:<module-name regex>] (default all)")
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


def _card(gpu: str) -> Card | None:
    """The card `--gpu` names (its memory is known), `auto`'s GPU, or None for a capability only."""
    if gpu.lower() == "auto":
        return auto_card()
    if gpu.upper() in GPUS and gpu.upper() not in CARDS:
        return None  # "A100", "A10": a capability, not one card's memory
    try:
        return card(gpu)
    except ValueError:
        return None


def _capability(gpu: str) -> int:
    """sm number from a card name in GPUS or CARDS, "8.0" or "80"; ValueError otherwise."""
    found = _card(gpu)
    if found is not None:
        return found.capability
    if gpu.upper() in GPUS:
        return GPUS[gpu.upper()]
    try:
        value = float(gpu)
    except ValueError:
        value = 0.0
    cap = round(value * 10) if value < 10 else round(value)
    if not 30 <= cap <= 120:
        raise ValueError(f"--gpu {gpu!r}: give one of {', '.join(dict.fromkeys([*CARDS, *GPUS]))}, auto, "
                         "or a compute capability such as 8.0 or 75")
    return cap


def _run(args: argparse.Namespace) -> tuple[tuple[str, ...], PlanReport]:
    """The source lines and the plan of one command; ValueError on bad input."""
    lines: list[str] = []
    gpu = _card(args.gpu) if args.target == "cuda" else None
    if args.budget is not None:
        budget = parse_budget(args.budget)
    elif gpu is not None:
        budget = budget_bytes(gpu)
        lines.append(f"budget {budget / 2**30:.2f} GiB: the {gpu.device_name} (sold as {gpu.sold_as}) "
                     f"reports {gpu.total_gib:.2f} GiB [{gpu.source}], less the CUDA context "
                     f"[{CONTEXT_SOURCE}]")
    else:
        budget = parse_budget("24GB")
    if args.preset is not None:
        build, spec, cfg = preset_spec(args.preset, args.seq_len)
        name = args.preset
        lines.append(f"{args.preset}: {cfg.name}, the released architecture "
                     f"({'tied' if cfg.tie_embeddings else 'untied'} embeddings)")
    elif args.hf_config is not None:
        hf = hf_factory(args.hf_config, args.seq_len, builder=args.hf_builder)
        build, spec, name = hf.build, hf.spec, args.hf_config
        lines.append(f"{args.hf_config}: model_type {hf.model_type}, built by {hf.source}; "
                     f"{hf.stored_line}")
        lines.extend(f"note: {n}" for n in hf.notes)
        if hf.source != "transformers" and transformers_missing():
            lines.append(f"note: {NO_TRANSFORMERS}")
    else:
        build, spec, name = load_factory(args.model), _spec_from_args(args), args.model
    capability = gpu.capability if gpu is not None else _capability(args.gpu)  # `auto` reads the GPU once
    profiler = Profiler(build, spec, args.optimizer, target=args.target, precision=args.precision,
                        trainable=args.trainable, capability=capability, optimizer_impl=args.optimizer_impl)
    if args.target == "cuda":
        lines.append(f"target GPU {args.gpu} (compute capability sm{profiler.capability})")
        lines.append(f"calibration: {status(gpu.device_name if gpu is not None else args.gpu)}")
    report = plan_model(
        profiler,
        name=name,
        budget_bytes=budget,
        effective_batch=args.effective_batch,
        checkpoint=args.checkpoint,
        cuda_margin=args.cuda_margin,
        min_micro_batch=args.min_micro_batch,
    )
    if gpu is not None and args.budget is None:  # the budget is the card's: show the card as a whole
        report = dataclasses.replace(report, card_total_bytes=gpu.total_bytes, context_bytes=CONTEXT_BYTES)
    return tuple(lines), report


@functools.lru_cache(maxsize=8)
def _preset_run(settings: tuple[tuple[str, object], ...]) -> tuple[tuple[str, ...], PlanReport]:
    """`_run` of a `--preset` command, kept: a preset is fixed code and a meta profile is deterministic,
    so the same command again (lesson 00 prints the table, then reads the same run as JSON) gives the
    same plan without profiling the same updates twice. A `--model` factory or a `--hf-config` file
    may change between runs, so those are planned afresh every time."""
    return _run(argparse.Namespace(**dict(settings)))


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m helpers.plan ...`: print the profile and the plan (or JSON); 2 on bad input."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.preset is not None:
            lines, report = _preset_run(tuple(sorted((k, v) for k, v in vars(args).items() if k != "json")))
        else:
            lines, report = _run(args)
    except ValueError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    if args.json:
        print(json.dumps({**report.to_dict(), "source": list(lines)}, indent=2))
    else:
        print("\n".join([*lines, report.table()]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
