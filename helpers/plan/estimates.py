"""What people estimate, and what the remedies for the floor leave (lessons 06 and 09).

- `popular_estimates` -> `Estimate`s: the rules of thumb people use (weights only, 16 and 18
  bytes per parameter, Korthikanti's activation formula with and without recomputation,
  `korthikanti_activation_bytes`) beside a measurement.
- `remedy_floors` -> `RemedyFloor`s: what each state remedy leaves of the measured floor, per
  worker, with the caveat a remedy carries (`CAVEATS`).
- `estimates_beside_ours`, `remedy_savings`: the same two read from a model's `ModelProfile`, for
  the plan's report (`python -m helpers.plan`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from helpers.core.training import STATE_PER_PARAM
from helpers.core.validate import bool_arg, choice, positive_int
from helpers.measure.formulas import korthikanti_activation_bytes
from helpers.meta.model_profile import MODES, ModelProfile
from helpers.models.gpt import GPTConfig

__all__ = ["CAVEATS", "EIGHT_BIT", "FSDP", "MIXED_PRECISION", "MIXED_PRECISION_BYTES", "PURE_BF16",
           "Estimate", "RemedyFloor", "estimates_beside_ours", "popular_estimates", "remedy_floors",
           "remedy_savings"]


# -- The estimators people use, and the remedies for the floor -------------------------------------


@dataclass(frozen=True)
class Estimate:
    """One estimator's prediction beside the measured value it estimates."""

    name: str
    predicted_bytes: float
    measured_bytes: int
    leaves_out: str

    @property
    def error(self) -> float:
        """Relative error (predicted - measured) / measured; negative is an underestimate."""
        return (self.predicted_bytes - self.measured_bytes) / self.measured_bytes


def popular_estimates(cfg: GPTConfig, n_params: int, micro_batch: int, measured_peak: int, *,
                      checkpointed: bool, planner_bytes: int | None = None) -> list[Estimate]:
    """The estimates people use for the peak of a training step, beside `measured_peak`.

    Weights only (4 bytes/param, what model-loading calculators report), 16 bytes/param
    (fp32 Adam: weights, gradients, two moments), 18 bytes/param (the figure quoted for
    mixed-precision Adam), 16 bytes/param plus Korthikanti's activations, and the
    planner's prediction when given.

    Args:
        cfg: the GPT's config (for Korthikanti's activations).
        n_params: its parameters.
        micro_batch: sequences per micro-step.
        measured_peak: the measured peak bytes each estimate is compared with.
        checkpointed: count Korthikanti's activations with full recomputation.
        planner_bytes: the planner's prediction, if any.

    Returns:
        One `Estimate` per rule: its bytes, its error against `measured_peak`, what it leaves out.
    """
    n_params = positive_int("n_params", n_params)
    positive_int("measured_peak", measured_peak)
    korth = korthikanti_activation_bytes(cfg, micro_batch, recompute=checkpointed)
    kname = "full recompute, 2sbh per layer" if checkpointed else "sbh(34 + 5as/h) per layer"
    out = [
        Estimate("weights only (4 B/param)", 4 * n_params, measured_peak,
                 "gradients, optimizer state, activations, temporaries: counts model loading only"),
        Estimate("16 B/param (fp32 Adam)", 16 * n_params, measured_peak,
                 "activations, the logits, optimizer temporaries: model state only"),
        Estimate("18 B/param (mixed-precision Adam)", 18 * n_params, measured_peak,
                 "activations; it also counts a persistent 16-bit weight copy (2 + 4 + 4 + 8), which "
                 "autocast does not keep: its bf16 copies live as activations (MIXED_PRECISION_BYTES)"),
        Estimate(f"16 B/param + Korthikanti ({kname})", 16 * n_params + korth, measured_peak,
                 "embeddings, final norm, logits and loss, the gradient of the logits, "
                 + ("one block's recomputed internals during backward, " if checkpointed else "")
                 + "optimizer temporaries"),
    ]
    if planner_bytes is not None:
        out.append(Estimate("planner (fitted to measurements)", planner_bytes, measured_peak,
                            "nothing it was fitted on; it must be refitted for a new model or device"))
    return out


@dataclass(frozen=True)
class RemedyFloor:
    """What one remedy for model state leaves of the floor, per worker, and what it does not say.

    `caveat` is empty, or the condition the row's number needs (print it beside the row).
    """

    remedy: str
    floor_bytes: float
    saving_bytes: float
    caveat: str = ""


MIXED_PRECISION = "mixed precision (bf16 autocast, fp32 state)"
PURE_BF16 = "pure bf16 (weights, gradients, Adam state)"
FSDP = "FSDP / ZeRO-3"
EIGHT_BIT = "8-bit Adam state (an estimate, never measured)"
# NOTE [mixed precision]: the one breakdown of the 16 B/param that every lesson, note and estimate
# uses. bf16 autocast over fp32 weights keeps fp32 weights (4), fp32 gradients (4) and Adam's two
# fp32 moments (8) = 16 B/param: the same floor as fp32. Autocast keeps no persistent bf16 weights or
# gradients: the bf16 weight copies it casts in each forward are saved for backward and freed with
# the other activations (lesson 01 measures them). Only pure bf16 is smaller (2 + 2 + 4 = 8 B/param),
# and plain bf16 updates round small steps to nothing.
MIXED_PRECISION_BYTES = "4 (fp32 weights) + 4 (fp32 gradients) + 8 (fp32 Adam moments) = 16 B/param"
CAVEATS = {
    MIXED_PRECISION: f"autocast keeps the fp32 state, {MIXED_PRECISION_BYTES} as in fp32; its bf16 "
                     "weight copies are made in each forward and live as activations, not state: it "
                     "shrinks activations, not the floor",
    PURE_BF16: "no fp32 master copy, 2 + 2 + 4 = 8 B/param, but bf16 weights lose small updates unless "
               "the optimizer uses stochastic rounding or Kahan summation",
    EIGHT_BIT: "an estimate, not a measurement: 1 byte per moment (2 B/param), plus the quantisation "
               "scales and the library's own temporaries, which no meta profile sees",
    FSDP: "1/W of the floor is the persistent state per worker; the per-rank peak also holds the "
          "all-gathered unit being computed; lesson 07 measures it",
}


def remedy_floors(parameters: int, gradients: int, optimizer_state: int,
                  workers: Sequence[int] = (2, 4), *, precision: str = "fp32") -> list[RemedyFloor]:
    """The floor under each remedy, computed from the measured floor of fp32 Adam.

    Bytes per parameter: fp32 Adam 16, SGD with momentum 12, SGD 8, mixed precision
    4 + 4 + 8 = 16 (autocast's fp32 state: no saving), pure bf16 8, bf16 Adam moments 12,
    offloaded optimizer state 8, ZeRO-1 over W workers 8 + 8/W, FSDP / ZeRO-3 16/W of
    persistent state. Sharding is measured for real in lesson 07.

    Args:
        parameters, gradients, optimizer_state: measured fp32 bytes (4, 4 and 8 per
            parameter: Adam's state is two parameter-sized moments).
        workers: the worker counts of the sharding rows.
        precision: the mode the bytes were measured in: "fp32" or "bf16" (autocast over fp32
            weights: the same fp32 state, so the same rows; the mixed-precision row keeps all of
            it), or "pure-bf16" (2 + 2 + 4 bytes measured: the precision rows go, and the
            first row is the measured pure-bf16 floor).

    Returns:
        One `RemedyFloor` per remedy: the floor per worker, its saving against the measured
        floor, and its caveat (`CAVEATS`).
    """
    choice("precision", precision, ("fp32", "bf16", "pure-bf16"))
    p, g, s = (positive_int(n, v) for n, v in (("parameters", parameters), ("gradients", gradients),
                                             ("optimizer_state", optimizer_state)))
    floor = p + g + s
    first = {"fp32": "Adam, fp32 (measured)", "bf16": "Adam, bf16 mixed precision (measured)",
             "pure-bf16": "Adam, pure bf16 (measured)"}[precision]
    rows = [
        (first, floor, CAVEATS[PURE_BF16] if precision == "pure-bf16" else ""),
        ("SGD with momentum (one buffer)", p + g + s / 2, ""),
        ("SGD, no momentum (no state)", p + g, ""),
        (MIXED_PRECISION, p + g + s, CAVEATS[MIXED_PRECISION]),  # autocast: the fp32 state itself
        (PURE_BF16, p / 2 + g / 2 + s / 2, CAVEATS[PURE_BF16]),
        ("bf16 Adam state (fp32 weights and gradients)", p + g + s / 2, ""),
        (EIGHT_BIT, p + g + s / 4, CAVEATS[EIGHT_BIT]),
        ("optimizer state offloaded to CPU", p + g, ""),
    ]
    if precision == "pure-bf16":  # already 16-bit: no precision row applies
        rows = [r for r in rows if r[0] not in (MIXED_PRECISION, PURE_BF16,
                                                "bf16 Adam state (fp32 weights and gradients)",
                                                EIGHT_BIT)]
    for w in (positive_int("workers[i]", w) for w in workers):
        rows.append((f"optimizer state sharded over {w} workers (ZeRO-1)", p + g + s / w, ""))
        rows.append((f"persistent state sharded over {w} workers ({FSDP})", floor / w, CAVEATS[FSDP]))
    return [RemedyFloor(name, f, floor - f, caveat) for name, f, caveat in rows]


def estimates_beside_ours(profile: ModelProfile, micro_batch: int, *, exact: bool = True) -> dict[str, float]:
    """The two counts people quote (weights only; model states only) beside ours, in bytes.

    Ours is the peak of an update at `micro_batch` (K >= 2, no checkpointing): its full profile
    with `exact`, else the fit's prediction.
    """
    b = positive_int("micro_batch", micro_batch)
    n, optimizer = profile.n_params, profile.optimizer
    state = 4 * STATE_PER_PARAM[optimizer]  # fp32 parameter-sized state tensors
    ours = (profile.full_step(b, 2, False).peak_bytes if bool_arg("exact", exact)
            else profile.profiles["plain"].predict_peak(b))
    return {
        "weights only (fp32, what loading tools count)": 4.0 * n,
        f"model states only (weights + grads + {optimizer} state)": (8.0 + state) * n,
        f"ours: profiled peak at micro-batch {b}": float(ours),
    }


def remedy_savings(profile: ModelProfile, micro_batch: int, mode: str = "plain", *,
                   checkpointing: bool = True, exact: bool = True) -> dict[str, float]:
    """What each remedy saves at `micro_batch`, in bytes, read from the profile.

    Halving the micro-batch, checkpointing every block (when profiled), the state remedies of
    `remedy_floors` (Adam only; 8 workers for the sharding rows) and, when the step of `mode`
    binds at the optimizer and the profile can swap its foreach loop, what fused=True or
    foreach=False saves (the per-tensor step's peak against foreach's). `checkpointing=False`
    leaves the checkpoint row out (a plan that keeps checkpointing off). With `exact` the first
    two rows compare full profiles of the updates (K >= 2); without it, the fits' predictions,
    which miss where the binding phase moves between the fitted sizes and `micro_batch`.
    """
    b = positive_int("micro_batch", micro_batch)
    choice("mode", mode, profile.modes)
    checkpointing, exact = bool_arg("checkpointing", checkpointing), bool_arg("exact", exact)

    def peak(size: int, checkpointed: bool) -> float:
        if exact:
            return profile.full_step(size, 2, checkpointed).peak_bytes
        return profile.profiles["checkpointed" if checkpointed else "plain"].predict_peak(size)

    out: dict[str, float] = {}
    if b > 1:
        halved = peak(b, False) - peak(b // 2, False)
        out[f"micro-batch {b} -> {b // 2} (accumulate twice as many steps)"] = halved
    if checkpointing and "checkpointed" in profile.profiles:
        out[f"checkpoint every block (at micro-batch {b})"] = peak(b, False) - peak(b, True)
    bd = profile.steps["plain"].optimizer_breakdown
    p, g, s = bd["parameters"], bd["gradients"], bd["optimizer_state"]
    if profile.optimizer in ("adam", "adamw") and min(p, g, s) > 0:
        for row in remedy_floors(p, g, s, workers=(8,), precision=profile.precision):
            if row.saving_bytes > 0:
                out[row.remedy] = row.saving_bytes
    if profile.profiles[mode].binding_phase(b) == "optimizer":
        per_tensor = profile.per_tensor_step(b, MODES[mode])
        if per_tensor is not None:
            saving = profile.full_step(b, 2, mode == "checkpointed").peak_bytes - per_tensor.peak_bytes
            if saving > 0:
                out[f"fused=True Adam (estimate: the per-tensor step's peak, at micro-batch {b})"] = saving
                out[f"foreach=False Adam (the per-tensor loop, at micro-batch {b})"] = saving
    return out
