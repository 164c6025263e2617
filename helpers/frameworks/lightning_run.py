"""Lightning's gradient accumulation, clipping and scheduler, recorded (instrument, lesson 10).

`lightning.pytorch.Trainer(accumulate_grad_batches=K, gradient_clip_val=c)` divides each
micro-batch's loss by K, clips once the K backwards are done, steps the optimizer, and
steps a scheduler configured with `"interval": "step"` once per optimizer update.
`LoopModule` records each of those events so a lesson can count them. Needs the
`frameworks` extra; Lightning is imported only when a function is called.

- `loop_module(net, loss_fn, ...)`: a `LightningModule` around any `nn.Module`, SGD with
  a `LambdaLR` schedule, that records every clip: the gradient norm before it and the
  learning rate in use (`clip_norms`, `clip_lrs`).
- `quiet_trainer(**knobs)`: a `Trainer` on one CPU (or GPU) device with no logger,
  checkpoints, progress bar or model summary, knobs passed through.
- `scheduler_of(trainer)`: the scheduler the trainer stepped (its `last_epoch` counts steps).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn

from helpers.core.validate import callable_arg, instance_arg, positive_number
from helpers.frameworks.installed import silence_logs

__all__ = ["loop_module", "quiet_trainer", "scheduler_of"]


@functools.cache
def _module_class() -> type:
    import lightning.pytorch as pl

    class LoopModule(pl.LightningModule):
        """A LightningModule that trains `net` with SGD + LambdaLR and records every clip."""

        def __init__(self, net: nn.Module, loss_fn: Callable, lr: float,
                     lr_lambda: Callable[[int], float]) -> None:
            super().__init__()
            self.net, self.loss_fn, self.lr, self.lr_lambda = net, loss_fn, lr, lr_lambda
            self.clip_norms: list[float] = []  # gradient norm before each clip, one per update
            self.clip_lrs: list[float] = []    # learning rate of the update that clip belongs to

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
            x, y = batch
            return self.loss_fn(self.net(x), y)  # Lightning divides it by accumulate_grad_batches

        def configure_optimizers(self) -> dict:
            opt = torch.optim.SGD(self.net.parameters(), lr=self.lr)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, self.lr_lambda)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

        def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer,
                                        gradient_clip_val: float | None = None,
                                        gradient_clip_algorithm: str | None = None) -> None:
            grads = [p.grad for p in self.net.parameters() if p.grad is not None]
            self.clip_norms.append(float(torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g) for g in grads]))))
            self.clip_lrs.append(float(optimizer.param_groups[0]["lr"]))
            self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val,
                                gradient_clip_algorithm=gradient_clip_algorithm)

    return LoopModule


def loop_module(net: nn.Module, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], *,
                lr: float, lr_lambda: Callable[[int], float] = lambda step: 1.0) -> object:
    """A `LightningModule` that trains `net` on (inputs, targets) batches and records its clips.

    Args:
        net: the model; its parameters are trained in place.
        loss_fn: `loss_fn(net(inputs), targets)`, a mean over the micro-batch.
        lr: SGD's base learning rate.
        lr_lambda: the `LambdaLR` factor for update `step` (0, 1, ...): a schedule whose
            value shows when it was stepped.

    Returns:
        The module; after `fit`, `module.clip_norms` and `module.clip_lrs` hold one entry
        per clip Lightning performed.
    """
    instance_arg("net", net, nn.Module, "torch.nn.Module")
    callable_arg("loss_fn", loss_fn, "a loss_fn(outputs, targets)")
    callable_arg("lr_lambda", lr_lambda, "a function of the update number")
    return _module_class()(net, loss_fn, positive_number("lr", lr), lr_lambda)


def quiet_trainer(*, device: torch.device | str = "cpu", **knobs: object) -> object:
    """A `lightning.pytorch.Trainer` on one device that prints nothing of its own.

    Args:
        device: "cpu" or a CUDA device (one GPU).
        **knobs: the Trainer arguments a lesson wants to show (`accumulate_grad_batches`,
            `gradient_clip_val`, `max_steps`, ...).

    Returns:
        The Trainer: no logger, checkpointing, progress bar, model summary or sanity
        check. Its INFO lines ("GPU available: ...") are silenced by
        `helpers.frameworks.installed.silence_logs`; warnings it raises are the caller's to catch.
    """
    import lightning.pytorch as pl

    silence_logs()
    accelerator = "gpu" if torch.device(device).type == "cuda" else "cpu"
    return pl.Trainer(accelerator=accelerator, devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      **knobs)


def scheduler_of(trainer: object) -> torch.optim.lr_scheduler.LRScheduler:
    """The learning-rate scheduler `trainer` configured (the first one).

    Args:
        trainer: a fitted Lightning `Trainer`.

    Returns:
        The scheduler.

    Raises:
        ValueError: if the trainer has none.
    """
    configs = trainer.lr_scheduler_configs  # type: ignore[attr-defined]
    if not configs:
        raise ValueError("this trainer has no learning-rate scheduler (fit it with loop_module first)")
    return configs[0].scheduler
