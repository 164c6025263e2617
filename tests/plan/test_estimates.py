"""helpers.plan.estimates (lesson 06): the estimators people quote, and the remedies for the floor.

Each estimate and each remedy's floor is checked against bytes counted by hand (per parameter,
per layer: Korthikanti et al.'s sbh(34 + 5as/h)).
"""

from __future__ import annotations

import pytest

from helpers.measure import formulas
from helpers.models.gpt import GPTConfig
from helpers.plan import estimates


# -- estimators and remedies -------------------------------------------------------------------
def test_popular_estimates() -> None:
    cfg = GPTConfig(vocab_size=1024, seq_len=16, d_model=32, n_heads=2, n_layers=2, dropout=0.0)
    est = estimates.popular_estimates(cfg, 1000, 4, 64_000, checkpointed=False, planner_bytes=60_000)
    by = {e.name.split(" (")[0]: e for e in est}
    assert by["weights only"].predicted_bytes == 4000 and by["16 B/param"].predicted_bytes == 16_000
    assert by["18 B/param"].predicted_bytes == 18_000
    assert by["planner"].error == pytest.approx(-0.0625)
    assert all(e.leaves_out for e in est)
    # full recompute keeps one (s, b, h) input per layer: 4 bytes each in fp32
    s, h, n = cfg.seq_len, cfg.d_model, cfg.n_layers
    assert formulas.korthikanti_activation_bytes(cfg, 4, recompute=True) == n * s * 4 * h * 4
    assert formulas.korthikanti_activation_bytes(cfg, 4, recompute=False) > n * s * 4 * h * 4


def test_remedy_floors() -> None:
    rows = {r.remedy: r for r in estimates.remedy_floors(100, 100, 200, workers=(4,))}
    adam = rows["Adam, fp32 (measured)"]
    assert adam.floor_bytes == 400 and adam.saving_bytes == 0
    assert rows["SGD with momentum (one buffer)"].floor_bytes == 300
    assert rows["SGD, no momentum (no state)"].floor_bytes == 200
    assert rows[estimates.MIXED_PRECISION].floor_bytes == 400
    assert rows[estimates.PURE_BF16].floor_bytes == 200
    assert rows["persistent state sharded over 4 workers (FSDP / ZeRO-3)"].floor_bytes == 100
    assert rows["optimizer state sharded over 4 workers (ZeRO-1)"].floor_bytes == 250
    with pytest.raises(ValueError, match="workers"):
        estimates.remedy_floors(100, 100, 200, workers=(0,))


# Bytes per parameter, counted by hand (issue 21): fp32 weights 4, gradients 4, Adam's two moments 8;
# bf16 copies 2 each; mixed precision (bf16 autocast) keeps the fp32 weights, gradients and moments, and
# no persistent bf16 copy: its casts live as activations (issue 37: one breakdown, 4 + 4 + 8).
HAND_COUNTED = {
    "Adam, fp32 (measured)": 4 + 4 + 8,
    "SGD with momentum (one buffer)": 4 + 4 + 4,
    "SGD, no momentum (no state)": 4 + 4,
    estimates.MIXED_PRECISION: 4 + 4 + 8,
    estimates.PURE_BF16: 2 + 2 + 2 + 2,
    "bf16 Adam state (fp32 weights and gradients)": 4 + 4 + 2 + 2,
    estimates.EIGHT_BIT: 4 + 4 + 1 + 1,
    "optimizer state offloaded to CPU": 4 + 4,
    "optimizer state sharded over 8 workers (ZeRO-1)": 4 + 4 + 8 / 8,
    "persistent state sharded over 8 workers (FSDP / ZeRO-3)": 16 / 8,
}


def test_remedy_floors_against_hand_counted_bytes_per_parameter() -> None:
    n = 1_000_003  # parameters; the measured fp32 Adam floor is 4 + 4 + 8 bytes of each
    rows = estimates.remedy_floors(4 * n, 4 * n, 8 * n, workers=(8,))
    assert {r.remedy: r.floor_bytes / n for r in rows} == pytest.approx(HAND_COUNTED)
    by = {r.remedy: r for r in rows}
    assert by[estimates.MIXED_PRECISION].saving_bytes == 0  # no saving on the floor
    assert "16 B/param" in by[estimates.MIXED_PRECISION].caveat
    assert "4 (fp32 weights) + 4 (fp32 gradients) + 8" in by[estimates.MIXED_PRECISION].caveat
    assert "2 + 2" not in by[estimates.MIXED_PRECISION].caveat  # no second breakdown of the same mode
    pure = by[estimates.PURE_BF16].caveat
    assert "stochastic rounding" in pure and "Kahan" in pure
    fsdp = by["persistent state sharded over 8 workers (FSDP / ZeRO-3)"]
    assert "per-rank peak" in fsdp.caveat
    assert all(not r.caveat for r in rows if r.remedy.startswith(("Adam", "SGD", "optimizer")))
    eight = by[estimates.EIGHT_BIT]
    assert "estimate" in eight.remedy and "not a measurement" in eight.caveat


def test_remedy_rows_follow_the_precision_mode() -> None:
    """bf16 mixed precision measures fp32 state: the same rows, the mixed row keeps all of it
    (16 B/param, no saving). Pure bf16 measures 2 + 2 + 4: no precision row applies."""
    n = 1000
    mixed = {r.remedy: r for r in estimates.remedy_floors(4 * n, 4 * n, 8 * n, precision="bf16")}
    assert mixed[estimates.MIXED_PRECISION].floor_bytes == 16 * n
    assert "Adam, bf16 mixed precision (measured)" in mixed
    pure = {r.remedy: r for r in estimates.remedy_floors(2 * n, 2 * n, 4 * n, precision="pure-bf16")}
    assert estimates.MIXED_PRECISION not in pure and estimates.PURE_BF16 not in pure
    assert pure["Adam, pure bf16 (measured)"].floor_bytes == 8 * n
    with pytest.raises(ValueError, match="precision"):
        estimates.remedy_floors(1, 1, 1, precision="fp8")


def test_korthikanti_estimate_by_hand() -> None:
    """sbh(34 + 5as/h) bytes per layer in 16-bit with 1-byte dropout masks; in fp32 without
    dropout: 64 sbh + 4 as^2 b (2 sbh and 5 as^2 b of masks and dropout output go); with
    dropout 66 sbh + 9 as^2 b; full recompute keeps a 4 sbh input per layer."""
    s, h, a, n, b = 8, 16, 2, 3, 2
    sbh, as2b = s * b * h, a * s * s * b  # 256 and 256
    no_dropout = GPTConfig(seq_len=s, d_model=h, n_heads=a, n_layers=n, dropout=0.0)
    dropout = GPTConfig(seq_len=s, d_model=h, n_heads=a, n_layers=n, dropout=0.1)
    assert formulas.korthikanti_activation_bytes(no_dropout, b, recompute=False) == n * (64 * sbh + 4 * as2b)
    assert formulas.korthikanti_activation_bytes(dropout, b, recompute=False) == n * (66 * sbh + 9 * as2b)
    est = {e.name: e for e in estimates.popular_estimates(no_dropout, 1000, b, 100_000, checkpointed=False)}
    korth = est["16 B/param + Korthikanti (sbh(34 + 5as/h) per layer)"]
    assert korth.predicted_bytes == 16_000 + 3 * 17_408
    assert korth.leaves_out.endswith("the gradient of the logits, optimizer temporaries")
    est = {e.name: e for e in estimates.popular_estimates(no_dropout, 1000, b, 100_000, checkpointed=True)}
    korth = est["16 B/param + Korthikanti (full recompute, 2sbh per layer)"]
    assert korth.predicted_bytes == 16_000 + n * 4 * sbh
    assert korth.leaves_out.endswith(
        "the gradient of the logits, one block's recomputed internals during backward, optimizer temporaries")


def test_remedy_floors_default_workers_and_every_row() -> None:
    rows = {r.remedy: r.floor_bytes for r in estimates.remedy_floors(100, 100, 200)}
    assert rows == {
        "Adam, fp32 (measured)": 400,
        "SGD with momentum (one buffer)": 300,
        "SGD, no momentum (no state)": 200,
        estimates.MIXED_PRECISION: 400,
        estimates.PURE_BF16: 200,
        "bf16 Adam state (fp32 weights and gradients)": 300,
        estimates.EIGHT_BIT: 250,
        "optimizer state offloaded to CPU": 200,
        "optimizer state sharded over 2 workers (ZeRO-1)": 300,
        "persistent state sharded over 2 workers (FSDP / ZeRO-3)": 200,
        "optimizer state sharded over 4 workers (ZeRO-1)": 250,
        "persistent state sharded over 4 workers (FSDP / ZeRO-3)": 100,
    }


@pytest.mark.parametrize(("args", "name"), [
    ((0, 100, 200), "parameters"), ((100, 0, 200), "gradients"), ((100, 100, 0), "optimizer_state"),
])
def test_remedy_floors_names_the_bad_argument(args: tuple[int, int, int], name: str) -> None:
    with pytest.raises(ValueError, match=f"^{name} must"):
        estimates.remedy_floors(*args)
    with pytest.raises(ValueError, match=r"^workers\[i\] must"):
        estimates.remedy_floors(100, 100, 200, workers=(2, 0))


# -- the report's rows, read from a model's profile ----------------------------------------------
@pytest.fixture(scope="module")
def llama_profile():  # noqa: ANN201
    """A small Llama-family model's CUDA-target profile (foreach Adam), both modes."""
    import functools

    from helpers.core.data import BatchSpec
    from helpers.meta.profiler import Profiler
    from helpers.models.architecture_config import ArchConfig
    from helpers.models.architectures import CausalLM

    cfg = ArchConfig("llama", 512, 64, 128, 2, 4, 16, num_kv_heads=2, tie_embeddings=True)
    build = functools.partial(CausalLM, cfg)
    return Profiler(build, BatchSpec.lm(16, 512), "adam", target="cuda").profile("blocks"), build


def test_estimates_beside_ours_count_bytes_per_parameter_by_hand(llama_profile) -> None:  # noqa: ANN001
    """4 B/param for the weights, 4 + 4 + 8 for weights, gradients and Adam's two moments."""
    import torch

    profile, build = llama_profile
    with torch.device("meta"):
        n = sum(p.numel() for p in build().parameters())
    rows = estimates.estimates_beside_ours(profile, 4)
    assert rows["weights only (fp32, what loading tools count)"] == 4 * n
    assert rows["model states only (weights + grads + adam state)"] == 16 * n
    assert rows["ours: profiled peak at micro-batch 4"] == profile.full_step(4, 2, False).peak_bytes
    fit = estimates.estimates_beside_ours(profile, 4, exact=False)
    assert fit["ours: profiled peak at micro-batch 4"] == profile.profiles["plain"].predict_peak(4)
    with pytest.raises(ValueError, match="micro_batch"):
        estimates.estimates_beside_ours(profile, 0)


def test_remedy_savings_are_what_real_steps_save() -> None:
    """Halving B and checkpointing every block save, on the meta profile (CPU target), what real CPU
    updates of the same model save (the CPU allocator's record, within 2%); the fit's rows (exact=False)
    are the fit's own differences, which miss where the binding phase moves (at B = 1 the optimizer
    binds this small model, so a fit from B = 1, 2 is below the full profile at B = 8)."""
    import functools

    from helpers.core.data import BatchSpec
    from helpers.meta.profiler import Profiler
    from helpers.models.architecture_config import ArchConfig
    from helpers.models.architectures import CausalLM

    cfg = ArchConfig("llama", 512, 64, 128, 2, 4, 16, num_kv_heads=2, tie_embeddings=True)
    build, spec = functools.partial(CausalLM, cfg), BatchSpec.lm(16, 512)
    profile = Profiler(build, spec, "adam", target="cpu").profile("blocks")
    real = Profiler(build, spec, "adam", device="cpu")
    b, halving = 8, "micro-batch 8 -> 4 (accumulate twice as many steps)"
    ckpt = "checkpoint every block (at micro-batch 8)"
    rows = estimates.remedy_savings(profile, b, "plain")
    plain8, plain4 = (real.step(n).peak_bytes for n in (8, 4))
    assert rows[halving] == pytest.approx(plain8 - plain4, rel=0.02)
    assert rows[ckpt] == pytest.approx(plain8 - real.step(8, checkpoint="blocks").peak_bytes, rel=0.02)
    fit = estimates.remedy_savings(profile, b, "plain", exact=False)
    plain = profile.profiles["plain"]
    assert fit[halving] == plain.predict_peak(8) - plain.predict_peak(4) < rows[halving]
    bd = profile.steps["plain"].optimizer_breakdown
    p, g, s = bd["parameters"], bd["gradients"], bd["optimizer_state"]
    tensors = len(list(real.model.parameters()))  # Adam keeps a 4-byte step count per parameter tensor
    assert (p, g, s) == (4 * profile.n_params, 4 * profile.n_params, 8 * profile.n_params + 4 * tensors)
    for row in estimates.remedy_floors(p, g, s, workers=(8,)):
        if row.saving_bytes > 0:
            assert rows[row.remedy] == row.saving_bytes
    assert ckpt not in estimates.remedy_savings(profile, b, "plain", checkpointing=False)
    assert not any(r.startswith("micro-batch") for r in estimates.remedy_savings(profile, 1, "plain"))
    with pytest.raises(ValueError, match="mode"):
        estimates.remedy_savings(profile, b, "sharded")


# -- what the remedies' rows carry, and when they appear ------------------------------------------
def test_estimates_and_remedy_floors_are_frozen_values() -> None:
    """An Estimate and a RemedyFloor are frozen, hashable values: no caller can alter a row once made."""
    import dataclasses

    est = estimates.popular_estimates(GPTConfig(seq_len=8, d_model=16, n_heads=2, n_layers=1), 1000, 2,
                                      100_000, checkpointed=False)[0]
    floor = estimates.remedy_floors(100, 100, 200)[0]
    for row, name in ((est, "predicted_bytes"), (floor, "floor_bytes")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(row, name, 0)
        assert hash(row) == hash(dataclasses.replace(row))


def test_caveats_sit_on_the_rows_whose_number_needs_them() -> None:
    """Mixed precision, pure bf16, 8-bit and FSDP rows carry their CAVEATS entry; every other row none."""
    n = 1000
    rows = {r.remedy: r.caveat for r in estimates.remedy_floors(4 * n, 4 * n, 8 * n, workers=(8,))}
    fsdp = "persistent state sharded over 8 workers (FSDP / ZeRO-3)"
    caveated = {name: estimates.CAVEATS[name] for name in (estimates.MIXED_PRECISION, estimates.PURE_BF16,
                                                           estimates.EIGHT_BIT)}
    caveated[fsdp] = estimates.CAVEATS[estimates.FSDP]
    assert {k: v for k, v in rows.items() if v} == caveated
    assert all(v == "" for k, v in rows.items() if k not in caveated)
    # measured in pure bf16, the measured row itself is the one that loses small updates
    pure = {r.remedy: r.caveat for r in estimates.remedy_floors(2 * n, 2 * n, 4 * n, precision="pure-bf16")}
    assert pure["Adam, pure bf16 (measured)"] == estimates.CAVEATS[estimates.PURE_BF16]
    assert rows["Adam, fp32 (measured)"] == ""


def test_the_report_rows_refuse_flags_that_are_not_bools(llama_profile) -> None:  # noqa: ANN001
    """exact and checkpointing must be True or False (1 and "yes" are refused, naming the argument)."""
    from helpers.core.validate import ArgTypeError

    profile, _ = llama_profile
    with pytest.raises(ArgTypeError, match="^exact must be a bool"):
        estimates.estimates_beside_ours(profile, 4, exact=1)
    with pytest.raises(ArgTypeError, match="^exact must be a bool"):
        estimates.remedy_savings(profile, 4, "plain", exact="yes")
    with pytest.raises(ArgTypeError, match="^checkpointing must be a bool"):
        estimates.remedy_savings(profile, 4, "plain", checkpointing=1)


def test_remedy_savings_default_mode_is_plain_and_halves_micro_batch_2(llama_profile) -> None:  # noqa: ANN001
    """Without a mode the rows are the plain step's; at B = 2 halving saves the full profiles' difference."""
    profile, _ = llama_profile
    rows = estimates.remedy_savings(profile, 2)
    assert rows == estimates.remedy_savings(profile, 2, "plain")
    halved = profile.full_step(2, 2, False).peak_bytes - profile.full_step(1, 2, False).peak_bytes
    assert rows["micro-batch 2 -> 1 (accumulate twice as many steps)"] == halved > 0


def test_state_remedies_are_listed_for_adam_and_adamw_only() -> None:
    """AdamW keeps Adam's two moments, so it gets the same state rows (those saving bytes); SGD gets none."""
    import functools

    from helpers.core.data import BatchSpec
    from helpers.meta.profiler import Profiler
    from helpers.models.architecture_config import ArchConfig
    from helpers.models.architectures import CausalLM

    cfg = ArchConfig("llama", 512, 64, 128, 2, 4, 16, num_kv_heads=2, tie_embeddings=True)
    build, spec = functools.partial(CausalLM, cfg), BatchSpec.lm(16, 512)
    adamw = Profiler(build, spec, "adamw", target="cuda").profile("none")
    bd = adamw.steps["plain"].optimizer_breakdown
    p, g, s = bd["parameters"], bd["gradients"], bd["optimizer_state"]
    assert s == 2 * p + 4 * len(list(build().parameters()))  # two moments and a 4-byte step count per tensor
    floors = estimates.remedy_floors(p, g, s, workers=(8,))
    rows = estimates.remedy_savings(adamw, 2, "plain", exact=False)
    assert {r.remedy: rows[r.remedy] for r in floors if r.remedy in rows} == {
        r.remedy: r.saving_bytes for r in floors if r.saving_bytes > 0}
    assert "Adam, fp32 (measured)" not in rows and estimates.MIXED_PRECISION not in rows  # they save nothing
    sgd = Profiler(build, spec, "sgd-momentum", target="cuda").profile("none")
    assert sgd.steps["plain"].optimizer_breakdown["optimizer_state"] > 0
    assert not any(r.remedy in estimates.remedy_savings(sgd, 2, "plain", exact=False) for r in floors)


FUSED = "fused=True Adam (estimate: the per-tensor step's peak, at micro-batch {})"
PER_TENSOR = "foreach=False Adam (the per-tensor loop, at micro-batch {})"


def test_fused_and_per_tensor_rows_where_the_optimizer_step_binds(llama_profile) -> None:  # noqa: ANN001
    """Where the optimizer step binds, both rows save foreach's full-step peak minus the per-tensor loop's."""
    profile, _ = llama_profile
    assert profile.profiles["plain"].binding_phase(1) == "optimizer"
    assert profile.profiles["plain"].binding_phase(2) == "forward"
    assert profile.profiles["checkpointed"].binding_phase(2) == "optimizer"
    for b, mode, checkpoint in ((1, "plain", "none"), (2, "checkpointed", "blocks")):
        rows = estimates.remedy_savings(profile, b, mode, exact=False)
        saving = (profile.full_step(b, 2, mode == "checkpointed").peak_bytes
                  - profile.per_tensor_step(b, checkpoint).peak_bytes)
        assert rows[FUSED.format(b)] == rows[PER_TENSOR.format(b)] == saving > 0
    # at B = 2 the plain step peaks in the forward pass: no optimizer row
    plain2 = estimates.remedy_savings(profile, 2, "plain", exact=False)
    assert FUSED.format(2) not in plain2 and PER_TENSOR.format(2) not in plain2


def test_no_optimizer_rows_where_the_per_tensor_loop_saves_nothing(llama_profile) -> None:  # noqa: ANN001
    """At B = 16 checkpointed the fit says the optimizer binds, but both full steps peak alike: no row."""
    profile, _ = llama_profile
    assert profile.profiles["checkpointed"].binding_phase(16) == "optimizer"
    assert profile.full_step(16, 2, True).peak_bytes == profile.per_tensor_step(16, "blocks").peak_bytes
    rows = estimates.remedy_savings(profile, 16, "checkpointed", exact=False)
    assert FUSED.format(16) not in rows and PER_TENSOR.format(16) not in rows
