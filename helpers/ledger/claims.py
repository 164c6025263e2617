"""The explainer's claims, each with a quick check that measures it again (lesson 08).

Every `Claim` restates one sentence of the explainer in our words, names the lesson
and section that teach it, and carries a check: a function of a shared `Lab` that returns
`Evidence` (pass/fail, a number with its unit, and a sentence). The checks
(`helpers.ledger.claim_checks`, `helpers.ledger.framework_checks`) call the instruments the lessons use,
so a lesson and its ledger row cannot drift apart; `helpers.ledger.claim_lab` holds the `Lab` they
share. `helpers.review` runs them.

Most checks run on a small, fast GPT (`LAB_CONFIG`). The headline numbers
(`LESSON_MODEL_CLAIMS`) run on the model of the lesson that shows them, at this device's
scale: what checkpointing saves and costs (C09, C11) on lesson 02's GPT
(`helpers.models.gpt.deep_gpt_setup`), the explainer's table (C08, C25) on lesson 01's
(`helpers.models.gpt.explainer_model`). So the ledger and the lessons show one set of numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from helpers.ledger import claim_checks as core
from helpers.ledger import framework_checks as fw
from helpers.ledger.claim_lab import Evidence, Lab

__all__ = ["CLAIMS", "Claim"]


@dataclass(frozen=True)
class Claim:
    """One claim of the explainer, in our words, with where it is taught and how it is checked."""

    id: str
    text: str
    lesson: str  # "NN §section": the notebook and the section (cell) that teaches it
    measures: str  # what the check measures, in a few words (the ledger's "check" column)
    run: Callable[[Lab], Evidence]
    condition: str = ""  # when the claim holds only under a condition, the row says which
    needs: str = ""  # a helpers module the check needs (rows wait until that lesson exists)


CLAIMS: tuple[Claim, ...] = (
    Claim("C01", "The forward pass keeps intermediate tensors (activations) because backward needs them.",
           "01 §2", "bytes kept alive by one training forward", core._c_saved),
    Claim("C02", "Backward releases the activations as it uses them.", "01 §2",
           "share of the activation peak still alive when backward ends", core._c_released),
    Claim("C03", "Gradient buffers take as much memory as the parameters.", "01 §1",
           "gradient bytes / parameter bytes after a step", core._c_grads_equal_params),
    Claim("C04", "Adam's state (two running averages) is twice the parameters.", "01 §1",
           "optimizer-state bytes / parameter bytes", core._c_adam_state),
    Claim("C05", "Activations grow with the micro-batch, in a straight line.", "01 §3",
           "linear fit of activations at micro-batch 4, 6, 8", core._c_linear),
    Claim("C06", "Weights, gradients and optimizer state are a floor that the micro-batch does not move.",
           "01 §3", "spread of the floor across micro-batch 4, 6, 8", core._c_floor),
    Claim("C07", "Accumulation keeps one micro-batch's activations at a time, whatever K.", "01 §5",
           "peak at K = 4 vs K = 2 for micro-batch 4", core._c_peak_one_micro_batch),
    Claim("C08", "A smaller micro-batch with more steps builds the same effective batch with less memory.",
           "01 §4", "activations of 4x8 vs 8x4 (effective batch 32)", core._c_smaller_micro_batch),
    Claim("C09", "Checkpointing discards a region's internal activations and keeps its boundaries.",
           "02 §2", "saved bytes with every block checkpointed vs plain", core._c_ckpt_saves),
    Claim("C10", "The recomputed activations give the same gradients.", "02 §2",
           "gradient with vs without checkpointing", core._c_ckpt_same_grads,
           condition="dropout off, or its RNG state replayed (preserve_rng_state=True)"),
    Claim("C11", "Checkpointing pays for the memory with extra forward compute, at most one forward.",
           "02 §3", "extra counted FLOPs of a checkpointed step / one forward of the checkpointed blocks",
           core._c_ckpt_flops),
    Claim("C12", "Checkpointing does nothing for inference: without backward nothing is saved.", "02 §7",
           "bytes kept by a forward under torch.no_grad(), plain and checkpointed", core._c_ckpt_inference),
    Claim("C13", "Accumulation with loss / K reproduces the full batch's gradient.", "03 §2",
           "accumulated vs full-batch gradient", core._c_accum_equal,
           condition="an additive loss and no batch-dependent operations (no BatchNorm, dropout off)"),
    Claim("C14", "Without dividing by K the accumulated gradient is K times too large.", "03 §2",
           "norm ratio of unscaled accumulation to the full batch", core._c_unscaled),
    Claim("C15", "A correct accumulation loop does not grow memory from one micro-step to the next.",
           "03 §3", "live bytes after micro-step 4 minus after micro-step 1", core._c_flat),
    Claim("C16", "Keeping the graph alive (retain_graph, a list of losses) grows memory every micro-step.",
           "03 §3", "activation-sized growth per micro-step with the losses kept", core._c_leak),
    Claim("C17", "Clip once, after accumulating; clipping every micro-batch is a different algorithm.",
           "03 §4", "clip-once vs clip-each against the clipped full batch", core._c_clip),
    Claim("C18", "A short final group must be weighted by its real size, not by 1/K.", "03 §5",
           "loss/K vs n_i/N weighting on 14 examples in micro-batches of 4", core._c_partial_group),
    Claim("C19", "BatchNorm normalises with each micro-batch's statistics, so accumulation differs.",
           "04 §1", "gradient error under BatchNorm vs GroupNorm", core._c_batchnorm),
    Claim("C20", "Dropout draws different masks per micro-batch than for the full batch.", "04 §2",
           "gradient error with own masks vs sliced full-batch masks", core._c_dropout),
    Claim("C21", "Step the learning-rate scheduler once per update, not per micro-step.", "04 §3",
           "examples seen when warmup ends, per update vs per micro-step", core._c_scheduler),
    Claim("C22", "Under mixed precision, unscale once, then clip, then step and update the scaler.",
           "04 §4", "applied update vs float32; clipping before unscaling", core._c_amp),
    Claim("C23", "With padding, micro-batches hold different token counts; divide by the group's tokens.",
           "05 §2", "naive token means vs the group-token-count fix", core._c_tokens),
    Claim("C24", "Many small micro-steps launch more kernels for the same arithmetic.", "03 §7",
           "ops dispatched and FLOPs, 1 x 8 vs 8 x 1", core._c_launches),
    Claim("C25", "Checkpointing and accumulation combine: each lowers a different part of the peak.",
           "06 §1", "peaks of 8x4, 4x8 and 4x8 checkpointed; floor unchanged", core._c_combined),
    Claim("C26", "When model state alone exceeds the budget, neither technique helps.", "06 §5",
           "the planner with a budget below the measured floor", core._c_state_floor,
           needs="helpers.planner"),
    Claim("C27", "The effective batch is micro-batch x accumulation steps x workers.", "07 §1",
           "check_batch_sizes(B=4, K=8, W=2)", core._c_b_k_w, needs="helpers.distributed"),
    Claim("C28", "Transformers' checkpointing switch keeps less for backward and gives the same gradients.",
           "10 §1", "saved bytes and gradients of a Llama, plain vs checkpointing on", fw._c_hf_checkpointing,
           needs="transformers"),
    Claim("C29", "Trainer(gradient_accumulation_steps=K) gives the group-token-count update on padded data.",
           "10 §2", "one Trainer update vs lesson 05's loop (K = 4)", fw._c_trainer_accumulation,
           condition="clipping, weight decay, warmup, schedule and shuffling off; a model whose loss_type "
                     "says its labels are shifted (Llama; not GPT-2)",
           needs="transformers"),
    Claim("C30", "Accelerate's accumulate() syncs and steps once per K micro-steps, with the loss/K update.",
           "10 §3", "sync_gradients over 4 micro-steps and the update vs loss / K",
           fw._c_accelerate_accumulation, needs="accelerate"),
    Claim("C31", "Lightning clips once per update and steps the scheduler once per update.", "10 §4",
           "clips and scheduler steps for 2 updates of K = 4", fw._c_lightning_accumulation,
           needs="lightning"),
    Claim("C32", "torch.compile's activation memory budget trades saved bytes for recompute.", "10 §5",
           "saved bytes and recompute FLOPs of compiled MLP blocks at budget 1.0 and 0.0",
           fw._c_compile_budget, needs="helpers.frameworks.compiled"),
)
