"""A training step's memory profiled on PyTorch's meta device (lesson 09).

The tracker in `helpers.memory` follows tensor storages, not allocator counters, so
it runs unchanged on the meta device, where tensors have shapes, dtypes and sizes
but no memory and no compute. A `Profiler` builds any model there and measures one
accumulation update (K micro-steps, then the optimizer step) in a fraction of a
second, even for billions of parameters:

- the floor (parameters + gradients + optimizer state);
- the live bytes at the end of the forward pass, and the peak of the backward pass
  and of the optimizer step, each with its breakdown by category;
- bytes per example, from two micro-batch sizes (`Profiler.memory_profile`, which
  returns lesson 06's `helpers.measure.memory_profile.MemoryProfile`);
- all of it for a plan, as one record (`Profiler.profile`, a
  `helpers.meta.model_profile.ModelProfile`, which `python -m helpers.plan` reads once).

Two things differ between the meta device and the device you will train on, and the
profile models both for a `target` ("cpu" or "cuda"):

- **Attention kernel.** `F.scaled_dot_product_attention` asks `aten._fused_sdp_choice`
  which kernel to run; on meta the answer is the math path, which keeps the whole
  attention matrix for backward. `helpers.meta.target_kernels._TargetKernels` answers as the target would:
  for "cpu" it asks the real CPU with tiny tensors of the same dtype, mask and dropout
  (flash attention without dropout, the math path with it); for "cuda" it assumes
  PyTorch's CUDA order: flash attention for fp16/bf16 without a mask, else the
  memory-efficient kernel. Both fused kernels keep the output and a log-sum-exp
  per row (the meta device runs the CPU flash kernel's shapes for them), never S x S.
- **Optimizer implementation.** "cpu" uses the per-parameter loop (CPU's default),
  "cuda" the `foreach` implementation (CUDA's default), whose temporaries cover all
  parameters at once.
- **Kernels' own buffers.** A fused-attention backward allocates work buffers inside the
  kernel, which no dispatch-level tracker sees (the CPU allocator does: lesson 09 checks
  the profile against its record). For each such backward op the profile adds their bytes
  as "other" for the op's duration (`attention_backward_buffer_bytes`, from the kernels'
  source: see its docstring for what it assumes for a CUDA target), and names the figure
  in `StepProfile.kernel_buffer_bytes`.

The profiled update is the explainer's loop as written: `predictions` and `loss` are
variables, alive until the next micro-step reassigns them and, for the last micro-step,
through `optimizer.step()`. `StepProfile.released` is the same run as a loop with
`del predictions` after the loss would hold it.

Mixed precision: `torch.autocast` does not act on meta tensors. `precision="bf16"`
applies autocast's per-op dtype rule instead (`helpers.meta.target_kernels._AutocastRule`): matmuls, linear
layers, convolutions and attention run in bf16 on cast copies (weights cast once per
forward, as autocast's cache does), losses (and, for "cuda", normalisations, softmax
and pointwise transcendental ops) in fp32, everything else in its inputs' dtype.
Parameters, gradients and Adam state stay fp32, as under autocast.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from helpers.core.data import BatchSpec
from helpers.core.training import OPTIMIZERS, make_optimizer
from helpers.core.validate import ArgTypeError, callable_arg, choice, positive_int
from helpers.measure.memory import tracked_run
from helpers.measure.memory_profile import MemoryProfile, fit_profile
from helpers.measure.tracker import MemoryTracker, release_point
from helpers.meta.kernel_buffers import kernel_buffers, meta_rng_module, rng_states_counted
from helpers.meta.memo import SHARED as SHARED_MEMO
from helpers.meta.memo import MetaRunner
from helpers.meta.model_profile import MODES, ModelProfile
from helpers.meta.step_profile import StepProfile, _marks_blocks_done, _step_profile
from helpers.meta.target_kernels import DEFAULT_CAPABILITY, _AutocastRule, _TargetKernels
from helpers.models.nets import BlockWrapper
from helpers.models.trainable import apply_trainable, trainable_count
from helpers.techniques.checkpointing import apply_ac

__all__ = [
    "CHECKPOINTS", "OPTIMIZER_IMPLS", "PRECISIONS", "PRECISION_BYTES_PER_PARAM", "PURE_BF16_WARNING",
    "TARGETS", "Profiler",
]

TARGETS = ("cpu", "cuda")
PRECISIONS = ("fp32", "bf16", "pure-bf16")
# How the optimizer step runs: the target's default, torch's multi-tensor `foreach` (CUDA's default:
# temporaries for all parameters at once), `fused` (one kernel, no parameter-sized temporaries; on
# meta it is modelled by the per-tensor loop, an estimate) or the per-tensor loop (foreach=False).
OPTIMIZER_IMPLS = ("default", "foreach", "fused", "per-tensor")
# What each precision mode keeps per trainable parameter with Adam: weights + gradients + two moments.
PRECISION_BYTES_PER_PARAM = {"fp32": 16, "bf16": 16, "pure-bf16": 8}
PURE_BF16_WARNING = ("pure bf16: weights, gradients and Adam state are bf16 (8 B/param, no fp32 master "
                     "copy); "
                     "an update smaller than about 1/256 of a weight rounds to nothing, so small updates are "
                     "lost unless the optimizer uses stochastic rounding or Kahan summation")
CHECKPOINTS = ("none", "blocks")


# ---------------------------------------------------------------------------
# The profiler (its record of one update, `StepProfile`, is in `helpers.meta.step_profile`; of a
# model, `ModelProfile`, in `helpers.meta.model_profile`)
# ---------------------------------------------------------------------------


@dataclass
class Profiler:
    """Build a model once (on meta, or a real device) and profile its training updates.

    `build` is a zero-argument callable returning an `nn.Module` built on the current
    default device (it is called under `torch.device(device)`), or an existing module.
    `optimizer` is a name in `OPTIMIZERS`; `target` ("cpu"/"cuda") sets the attention
    kernel and the optimizer implementation modelled on meta; `precision` is a mode named by
    what it keeps: "fp32"; "bf16", autocast over fp32 master weights with fp32 gradients and
    fp32 Adam state (16 B/param, as fp32); "pure-bf16", the model itself in bf16, so its
    gradients and Adam state are bf16 too (8 B/param; `PURE_BF16_WARNING`). On a real device,
    "bf16" runs `torch.autocast` itself. A config's stored dtype never changes the mode: the
    model is built as `build` makes it (fp32) and cast only for "pure-bf16". `trainable` is
    "all", a parameter-name regex or "lora:<rank>[:<module regex>]" (`helpers.models.trainable`): only
    parameters that require grad get gradients and optimizer state, and `n_trainable` counts them.
    `capability` is the CUDA target's compute capability (e.g. 75 for a T4: no flash attention;
    `GPUS` names the usual cards). `optimizer_impl` is one of `OPTIMIZER_IMPLS`.
    `route_attention=False` leaves attention on the meta device's own (math) path, to
    show what the routing corrects. `memo=False` runs every op's meta kernel; by default a
    call seen before is answered from its metadata (`helpers.meta.memo`): the same profile, faster.
    """

    build: Callable[[], nn.Module] | nn.Module
    spec: BatchSpec
    optimizer_name: str = "adam"
    device: str = "meta"
    target: str = "cpu"
    precision: str = "fp32"
    seed: int = 0
    route_attention: bool = True
    trainable: str = "all"
    capability: int = DEFAULT_CAPABILITY
    optimizer_impl: str = "default"
    memo: bool = True
    model: nn.Module = field(init=False)
    optimizer: torch.optim.Optimizer = field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.spec, BatchSpec):
            raise ArgTypeError(f"spec must be a BatchSpec, got {type(self.spec).__name__}")
        choice("optimizer", self.optimizer_name, OPTIMIZERS)
        choice("target", self.target, TARGETS)
        choice("precision", self.precision, PRECISIONS)
        self.device = str(torch.device(self.device))
        if isinstance(self.build, nn.Module):
            model = self.build
        else:
            callable_arg("build", self.build, "a zero-argument callable returning an nn.Module")
            with torch.random.fork_rng(devices=[]), torch.device(self.device):
                torch.manual_seed(self.seed)
                model = self.build()
            if not isinstance(model, nn.Module):
                raise ArgTypeError(f"build() must return an nn.Module, got {type(model).__name__}")
        if self.precision == "pure-bf16":
            model = model.to(torch.bfloat16)
        self.trainable_spec = apply_trainable(model, self.trainable)
        self.model = model.train()
        choice("optimizer_impl", self.optimizer_impl, OPTIMIZER_IMPLS)
        impl = self.optimizer_impl
        if impl == "default":  # what the target runs by default: foreach on CUDA, the per-tensor loop on CPU
            impl = "foreach" if self.target == "cuda" else "per-tensor"
        if impl == "fused" and not self.meta:
            params = [p for p in self.model.parameters() if p.requires_grad]
            cls = torch.optim.AdamW if self.optimizer_name == "adamw" else torch.optim.Adam
            self.optimizer = cls(params, lr=1e-3, fused=True)
        else:  # on meta, fused (no parameter-sized temporaries) is modelled by the per-tensor loop
            foreach = impl == "foreach" and (self.meta or self.target == "cuda")
            self.optimizer = make_optimizer(self.optimizer_name, self.model, foreach=foreach)
        self.impl = impl
        self._warm = False
        self._cache: dict[tuple[int, str, int], StepProfile] = {}

    @property
    def meta(self) -> bool:
        """True when profiling on the meta device (no memory, no compute)."""
        return self.device == "meta"

    @property
    def n_params(self) -> int:
        """Number of parameters (shared ones once)."""
        return sum(p.numel() for p in {id(p): p for p in self.model.parameters()}.values())

    @property
    def n_trainable(self) -> int:
        """Number of parameters that require grad: only they have gradients and optimizer state."""
        return trainable_count(self.model)

    def _init_state(self) -> None:
        """Create the optimizer state (steady training) with one step on zero gradients."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        with torch.no_grad():
            for p in params:
                p.grad = torch.zeros_like(p)
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._warm = True

    def _update(
        self,
        batches: list[tuple[torch.Tensor, torch.Tensor]],
        wrapper: str | BlockWrapper,
        tracker: MemoryTracker | None,
        rule: _AutocastRule | None,
    ) -> None:
        """The explainer's loop as written: `predictions` and `loss` live until reassigned."""
        real_bf16 = self.precision == "bf16" and not self.meta
        autocast = (
            torch.autocast(torch.device(self.device).type, dtype=torch.bfloat16)
            if real_bf16
            else contextlib.nullcontext()
        )
        k = len(batches)
        self.optimizer.zero_grad(set_to_none=True)
        blocks = contextlib.nullcontext() if wrapper == "none" else apply_ac(
            self.model, "full" if wrapper == "blocks" else wrapper)
        with blocks:
            for i, (x, y) in enumerate(batches):
                with (autocast, rule.forward() if rule is not None else contextlib.nullcontext(),
                      _marks_blocks_done(self.model, tracker)):
                    predictions = self.model(x)
                    loss = self.spec.loss(predictions, y)
                release_point(predictions, loss)  # where `del predictions` would drop them
                if tracker is not None and i == k - 1:
                    tracker.mark("end of forward")
                (loss / k).backward()
                if tracker is not None:
                    tracker.drop_held()  # what autograd kept of this micro-step is gone
        self.optimizer.step()

    def step(
        self, micro_batch: int, *, checkpoint: str | BlockWrapper = "none", accumulation_steps: int = 2
    ) -> StepProfile:
        """Profile one update of `accumulation_steps` micro-batches of `micro_batch` examples.

        With 2 or more steps the gradients of earlier micro-steps (and the outputs the
        loop's `predictions` variable still holds) are alive in later forward passes (any
        accumulation update); the peak is the same for any K >= 2. The first call runs one
        untracked update so that the optimizer state exists. On a real CPU the totals come
        from the CPU allocator's record of the run, the categories from the tracker.
        """
        b = positive_int("micro_batch", micro_batch)
        k = positive_int("accumulation_steps", accumulation_steps)
        key = (b, checkpoint, min(k, 2)) if isinstance(checkpoint, str) and self.meta else None
        if key in self._cache:  # a meta profile is deterministic: the same update gives the same answer
            return dataclasses.replace(self._cache[key], accumulation_steps=k)
        if not (callable(checkpoint) or checkpoint in CHECKPOINTS):
            choice("checkpoint", checkpoint, CHECKPOINTS)
        rule = _AutocastRule(self.target) if self.meta and self.precision == "bf16" else None
        kernels = (_TargetKernels(self.target, rule, self.capability) if self.meta and self.route_attention
                   else None)
        buffers: dict[str, int] = {}
        modes = contextlib.ExitStack()
        with modes:
            if rule is not None:
                modes.enter_context(rule)
                modes.enter_context(rule.recomputes())
            if kernels is not None:
                modes.enter_context(kernels)
            if self.meta:
                modes.enter_context(meta_rng_module())
            if not self._warm:
                self._init_state()
            batches = [self.spec.batch(b, self.device, self.seed + i) for i in range(k)]
            if self.precision == "pure-bf16":
                batches = [(x.to(torch.bfloat16) if x.is_floating_point() else x, y) for x, y in batches]
            if self.meta and self.target == "cpu":
                modes.enter_context(rng_states_counted())
            own = kernel_buffers(self.target, buffers) if self.meta else None
            tracker = MemoryTracker(model=self.model, optimizer=self.optimizer, kernel_buffers=own)
            if self.meta:
                tracker.runner = MetaRunner(SHARED_MEMO if self.memo else None)
            try:
                timeline_of = tracked_run(lambda: self._update(batches, checkpoint, tracker, rule), tracker)
            finally:
                self.optimizer.zero_grad(set_to_none=True)
        fields = {
            "micro_batch": b, "accumulation_steps": k, "device": self.device,
            "method": f"meta-tracker (target {self.target})" if self.meta else "cpu-tracker",
            "target": self.target, "precision": self.precision,
            "kernels": tuple(sorted(kernels.kernels)) if kernels is not None else (),
            "kernel_buffer_bytes": buffers,
        }
        timelines = {released: timeline_of(released) for released in (False, True)}
        keep, released = (_step_profile(tl, fields) for tl in timelines.values())
        result = dataclasses.replace(keep, released=released)
        if key is not None:
            self._cache[key] = result
        return result

    def memory_profile(
        self, checkpoint: str | BlockWrapper = "none", micro_batches: tuple[int, ...] = (1, 2)
    ) -> MemoryProfile:
        """Lesson 06's `MemoryProfile` (floor, bytes per example, optimizer peak) from a few updates."""
        label = checkpoint if isinstance(checkpoint, str) else "custom wrapper"
        return fit_profile(lambda b: self.step(b, checkpoint=checkpoint), micro_batches, label=label)

    def profile(self, checkpoint: str = "blocks") -> ModelProfile:
        """The model's `ModelProfile`: what a plan reads, profiled once.

        The "plain" mode always; with `checkpoint="blocks"` also the "checkpointed" one (every
        block checkpointed). Each mode gets its fit from micro-batches 1 and 2 and its
        one-example step; the record takes full steps of candidates through this profiler later.
        """
        choice("checkpoint", checkpoint, CHECKPOINTS)
        modes = {"plain": MODES["plain"]} if checkpoint == "none" else dict(MODES)
        profiles = {mode: self.memory_profile(ck, (1, 2)) for mode, ck in modes.items()}
        steps = {mode: self.step(1, checkpoint=ck) for mode, ck in modes.items()}
        # the per-tensor loop beside foreach needs a fresh build (a given module is not copied),
        # made only if a plan asks for it (the record memoises its steps)
        swap = self.impl == "foreach" and not isinstance(self.build, nn.Module)
        return ModelProfile(
            self.n_params, self.n_trainable, self.spec.describe(), self.trainable_spec.describe(),
            self.optimizer_name, self.target, self.precision, self.capability, self.impl, profiles, steps,
            take_step=lambda b, ck, k: self.step(b, checkpoint=ck, accumulation_steps=k),
            take_per_tensor_step=self._per_tensor_step if swap else None)

    def _per_tensor_step(self, micro_batch: int, checkpoint: str) -> StepProfile:
        """This update with the per-tensor optimizer loop, on a fresh build of the same model."""
        loop = dataclasses.replace(self, optimizer_impl="per-tensor")
        return loop.step(micro_batch, checkpoint=checkpoint)
