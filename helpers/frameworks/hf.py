"""Hugging Face Transformers, run for real against the lessons' loops (instrument, lesson 10).

Every model is built from a config written in code (random weights, nothing downloaded),
so the same checks run offline on any machine. Needs the `frameworks` extra; the
module imports Transformers only when a function is called.

- Models and data (`causal_lm_config`, `causal_lm`, `dropout_settings`, `training_rows`,
  `collate`, `micro_batches`, `predicted_tokens`, `KINDS`): in `helpers.frameworks.hf_models`.
- The loop: `group_token_step(model, batches)`, lesson 05's group-token-count
  accumulation written for a causal LM that shifts its labels inside.
- Checkpointing: `saved_bytes`, `loss_and_grad`, `decoder_layers`, `checkpointed_by_hand`
  (lesson 02's `checkpoint` call on every decoder layer), `enable_checkpointing` (the
  library's switch, reentrant or not), `missing_grads`.
- Trainer: `SWITCHED_OFF` (what would hide the comparison), `comparison_arguments`,
  `knob_rows` (those knobs beside the installed defaults), `quiet`, `trainer_update`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from helpers.core.training import IGNORE_INDEX, cleared_grads
from helpers.core.validate import bool_arg, int_in_range, positive_int, positive_number
from helpers.frameworks.hf_models import collate, predicted_tokens
from helpers.measure.memory import saved_activation_bytes
from helpers.techniques.accumulation import flat_grad

__all__ = [
    "SWITCHED_OFF", "checkpointed_by_hand", "comparison_arguments", "decoder_layers", "enable_checkpointing",
    "group_token_step", "knob_rows", "loss_and_grad", "missing_grads", "parameter_change", "quiet",
    "saved_bytes", "snapshot", "trainer_update",
]

# -- the loop ----------------------------------------------------------------------------------
def group_token_step(model: nn.Module, batches: Sequence[dict[str, torch.Tensor]]) -> float:
    """Lesson 05's fix for one group: every micro-batch's summed token loss / the group's count.

    The count is `predicted_tokens(batches)`, taken before any forward. Gradients add up
    in `.grad` (clearing them first is the caller's job).

    Args:
        model: a Transformers causal LM.
        batches: the group's collated micro-batches.

    Returns:
        The group's loss, as logged.
    """
    n = predicted_tokens(batches)
    logged = 0.0
    for b in batches:
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), b["labels"][:, 1:].flatten(),
                               ignore_index=IGNORE_INDEX, reduction="sum") / n
        loss.backward()
        logged += loss.item()
    return logged


def snapshot(model: nn.Module) -> list[torch.Tensor]:
    """Copies of `model`'s parameters, for `parameter_change`.

    Args:
        model: the model.

    Returns:
        Detached copies, in `model.parameters()` order.
    """
    return [p.detach().clone() for p in model.parameters()]


def parameter_change(model: nn.Module, start: Sequence[torch.Tensor]) -> torch.Tensor:
    """Every parameter minus its value in `start`, flattened into one float32 vector.

    Args:
        model: the model now.
        start: its parameters before, from `snapshot`.

    Returns:
        The change.

    Raises:
        ValueError: if `start` has another number of tensors.
    """
    now = list(model.parameters())
    if len(now) != len(start):
        raise ValueError(f"start holds {len(start)} tensors but the model has {len(now)} parameters")
    return torch.cat([(p.detach() - s).flatten().float() for p, s in zip(now, start, strict=True)])


# -- checkpointing -----------------------------------------------------------------------------
def saved_bytes(model: nn.Module, batch: dict[str, torch.Tensor]) -> int:
    """Bytes autograd keeps after the forward of `model(**batch).loss` (live-storage tracker).

    Args:
        model: a Transformers model (gradients cleared after).
        batch: its keyword inputs, labels included.

    Returns:
        The bytes.
    """
    out = saved_activation_bytes(lambda: model(**batch).loss)
    model.zero_grad(set_to_none=True)
    return out


def loss_and_grad(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[float, torch.Tensor]:
    """The loss of one forward and backward of `model(**batch)`, and the flat gradient.

    Args:
        model: a Transformers model (gradients cleared before and after).
        batch: its keyword inputs, labels included.

    Returns:
        (loss, flat gradient).
    """
    with cleared_grads(model):
        loss = model(**batch).loss
        loss.backward()
        return loss.item(), flat_grad(model)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated decoder layers, the units Transformers checkpoints one by one.

    Args:
        model: a Transformers model.

    Returns:
        Its `GradientCheckpointingLayer`s, in order.

    Raises:
        ValueError: if it has none.
    """
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no GradientCheckpointingLayer to checkpoint")
    return layers


@contextlib.contextmanager
def checkpointed_by_hand(model: nn.Module) -> Iterator[int]:
    """Inside the block every decoder layer runs through lesson 02's non-reentrant `checkpoint`.

    The layers' own `forward` comes back on exit.

    Args:
        model: a Transformers causal LM.

    Yields:
        The number of layers wrapped.
    """
    layers = decoder_layers(model)

    def wrapped(forward: object) -> object:
        def run(*args: object, **kwargs: object) -> object:
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        return run

    for layer in layers:
        layer.forward = wrapped(layer.forward)
    try:
        yield len(layers)
    finally:
        for layer in layers:
            del layer.forward  # the instance attribute; the class's forward shows through again


def enable_checkpointing(model: nn.Module, *, reentrant: bool) -> None:
    """The library's switch, `activation_checkpointing_enable`, with `use_reentrant=reentrant`.

    Transformers 5.23 renamed `gradient_checkpointing_enable` to `activation_checkpointing_enable`
    and keeps the old name as an alias that raises a FutureWarning ("removed in v6").

    Args:
        model: a Transformers model.
        reentrant: True only for the reentrant trap; lessons pass False.
    """
    kwargs = {"use_reentrant": bool_arg("reentrant", reentrant)}
    model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)


def missing_grads(model: nn.Module) -> list[str]:
    """Trainable parameters (requires_grad) whose `.grad` is None after a backward.

    Args:
        model: the model, after a backward.

    Returns:
        Their names.
    """
    return [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]


# -- the Trainer -------------------------------------------------------------------------------
# (argument, value for the comparison, why): each would make the Trainer's update differ from
# the plain loop for a reason that is not accumulation. `optim` is not a default to undo but a
# choice: Adam's first update is about lr x sign(gradient), which would hide a gradient error.
SWITCHED_OFF = (
    ("max_grad_norm", 0.0, "clips the update to norm 1.0 by default; 0 turns clipping off"),
    ("weight_decay", 0.0, "would shrink every weight on top of the gradient step"),
    ("warmup_steps", 0, "a warmup would scale the first update's learning rate"),
    ("lr_scheduler_type", "constant", "the default linear decay changes the rate each update"),
    ("train_sampling_strategy", "sequential", "the default shuffles rows into other micro-batches"),
    ("optim", "sgd", "Adam's first step is ~lr x sign(g): it would hide a gradient error"),
)


def comparison_arguments(output_dir: str, *, micro_batch: int, accumulation_steps: int,
                         learning_rate: float, max_steps: int = 1, device: torch.device | str = "cpu",
                         **overrides: object) -> object:
    """`TrainingArguments` for comparing one Trainer update with the loop, quiet and offline.

    Args:
        output_dir: a scratch folder (nothing is saved there: no checkpoints, no logs).
        micro_batch: `per_device_train_batch_size`, the B of one micro-step.
        accumulation_steps: `gradient_accumulation_steps`, K.
        learning_rate: the SGD learning rate.
        max_steps: optimizer updates to run.
        device: "cpu" sets `use_cpu=True`; a CUDA device leaves the Trainer on the GPU.
        **overrides: any other `TrainingArguments` field, applied last.

    Returns:
        The arguments, with every knob in `SWITCHED_OFF` set to its comparison value.
    """
    import transformers

    positive_int("micro_batch", micro_batch)
    positive_int("accumulation_steps", accumulation_steps)
    positive_number("learning_rate", learning_rate)
    positive_int("max_steps", max_steps)
    fields = transformers.TrainingArguments.__dataclass_fields__
    knobs = {name: value for name, value, _ in SWITCHED_OFF if name in fields}
    options = dict(
        output_dir=output_dir, per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=accumulation_steps, learning_rate=learning_rate, max_steps=max_steps,
        use_cpu=torch.device(device).type == "cpu", report_to="none", save_strategy="no",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0, seed=0, **knobs)
    options.update(overrides)
    return transformers.TrainingArguments(**options)


def knob_rows(args: object) -> list[tuple[str, str, str, str]]:
    """What each `SWITCHED_OFF` knob is in `args`, and also `average_tokens_across_devices`.

    Args:
        args: Transformers `TrainingArguments`.

    Returns:
        (argument, value in `args`, the installed default, why) per knob that exists.
    """
    fields = type(args).__dataclass_fields__
    names = [(n, why) for n, _, why in SWITCHED_OFF] + [
        ("average_tokens_across_devices", "sums the token count over workers; one worker here")]
    def shown(value: object) -> str:
        return repr(getattr(value, "value", value))  # enums (SchedulerType.CONSTANT) as their string

    return [(n, shown(getattr(args, n)), shown(fields[n].default), why) for n, why in names if n in fields]


def quiet(trainer: object) -> object:
    """Remove the callbacks that print (the metrics dict) or draw progress bars.

    Args:
        trainer: a Transformers `Trainer`.

    Returns:
        The same `trainer`.
    """
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)  # type: ignore[attr-defined]
    return trainer


def trainer_update(model: nn.Module, rows: Sequence[dict[str, torch.Tensor]], *, micro_batch: int,
                   accumulation_steps: int, learning_rate: float, output_dir: str,
                   mask_first: bool = False, **overrides: object) -> torch.Tensor:
    """Run one `Trainer` update of `model` on `rows` and return the parameter change.

    `model` is trained in place.

    Args:
        model: a Transformers causal LM.
        rows: at least `micro_batch * accumulation_steps` rows.
        micro_batch, accumulation_steps, learning_rate: the Trainer's settings.
        output_dir: the Trainer's output folder.
        mask_first: the collator is `collate(mask_first=mask_first)`.
        **overrides: after `comparison_arguments` switches the `SWITCHED_OFF` knobs off,
            e.g. `max_grad_norm=1.0`.

    Returns:
        The parameter change (`parameter_change`).
    """
    import transformers

    int_in_range("rows", len(rows), micro_batch * accumulation_steps, 10**9)  # at least one full group
    start = snapshot(model)
    args = comparison_arguments(output_dir, micro_batch=micro_batch, accumulation_steps=accumulation_steps,
                                learning_rate=learning_rate, device=next(model.parameters()).device,
                                **overrides)
    trainer = quiet(transformers.Trainer(model=model, args=args, train_dataset=list(rows),
                                         data_collator=functools.partial(collate, mask_first=mask_first)))
    trainer.train()  # type: ignore[attr-defined]
    return parameter_change(model, start)
