"""Tests of helpers.models.trainable and the precision modes: what trains, what each mode keeps."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from support.transformers_oracles import hf_dict
from torch import nn

from helpers.core.data import BatchSpec
from helpers.meta.profiler import PURE_BF16_WARNING, Profiler
from helpers.models.architecture_config import RELEASED, ArchConfig
from helpers.models.architectures import CausalLM
from helpers.models.trainable import (
    LORA_DEFAULT_TARGETS,
    LoRALinear,
    TrainableSpec,
    apply_trainable,
    parse_trainable,
    trainable_count,
)
from helpers.plan import estimates
from helpers.plan.hf_configs import from_hf_config
from helpers.plan.report import plan_model

SMALL = dataclasses.replace(RELEASED["llama-3.2-1b"], vocab_size=512, hidden_size=64, intermediate_size=128,
                            num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16)
SPEC = BatchSpec.lm(32, 512)


def _build() -> nn.Module:
    return CausalLM(SMALL)


def _n() -> int:
    return sum(p.numel() for p in {id(p): p for p in _build().parameters()}.values())


@pytest.mark.parametrize(("precision", "per_param"), [("fp32", 16), ("bf16", 16), ("pure-bf16", 8)])
def test_floor_bytes_per_parameter_of_each_mode(precision: str, per_param: int) -> None:
    """Adam's floor: fp32 4 + 4 + 8; bf16 mixed precision keeps fp32 master weights, gradients and
    moments, so 16 as well (autocast's bf16 copies are not state); pure bf16 2 + 2 + 4 = 8."""
    step = Profiler(_build, SPEC, "adam", target="cuda", precision=precision).step(1)
    b = step.optimizer_breakdown
    floor = b["parameters"] + b["gradients"] + b["optimizer_state"]
    n = _n()
    assert floor / n == pytest.approx(per_param, rel=2e-3)  # + Adam's step counts (one scalar per tensor)


def test_report_prints_the_floor_per_parameter_and_the_pure_bf16_warning() -> None:
    for precision, per_param in (("bf16", 16), ("pure-bf16", 8)):
        report = plan_model(Profiler(_build, SPEC, "adam", target="cuda", precision=precision), name="small",
                            budget_bytes=1e9, effective_batch=4, check=False)
        text = report.table()
        assert f"{per_param}.0" in text.split("bytes per parameter")[0].split("floor")[-1]
        assert (PURE_BF16_WARNING in text) == (precision == "pure-bf16")
        if precision == "bf16":  # a bf16 row never drops the fp32 master copy: no saving to show
            assert not any(k.startswith(estimates.MIXED_PRECISION) for k in report.remedies)
        else:  # already 16-bit: no precision row applies
            assert not any("bf16" in k for k in report.remedies)


def test_a_configs_torch_dtype_never_changes_the_mode(tmp_path) -> None:  # noqa: ANN001
    raw = {**hf_dict(SMALL), "torch_dtype": "bfloat16"}
    hf = from_hf_config(raw, 32)
    assert hf.stored_line.startswith("weights stored as bf16")
    with torch.device("meta"):
        assert {p.dtype for p in hf.build().parameters()} == {torch.float32}
    ours = Profiler(hf.build, hf.spec, "adam", precision="bf16").step(1)
    assert ours.optimizer_breakdown["optimizer_state"] / _n() == pytest.approx(8, rel=2e-3)


def test_parse_trainable() -> None:
    assert parse_trainable("all").kind == "all"
    assert parse_trainable("norm").kind == "pattern"
    spec = parse_trainable("lora:8:q_proj")
    assert (spec.kind, spec.rank, spec.pattern) == ("lora", 8, "q_proj")
    assert parse_trainable("lora:4").pattern.startswith("(q_proj|v_proj")
    for bad in ("lora:x", "lora:0", "(", "", "lora:4:("):
        with pytest.raises(ValueError):
            parse_trainable(bad)


def test_lora_counts_and_floor_by_hand() -> None:
    """LoRA rank r on q_proj and v_proj of each block: r x (in + out) per layer. Hand count for the
    small config: q_proj 64 -> 64, v_proj 64 -> 32, so r (128 + 96) per block, 2 blocks. The floor is
    the frozen fp32 base (4 B per parameter, no gradient, no state) plus 16 B per LoRA parameter."""
    r = 4
    lora = 2 * r * ((64 + 64) + (64 + 32))
    prof = Profiler(_build, SPEC, "adam", target="cuda", trainable=f"lora:{r}")
    assert prof.n_trainable == lora
    assert prof.n_params == _n() + lora
    assert sum(isinstance(m, LoRALinear) for m in prof.model.modules()) == 4
    b = prof.step(1).optimizer_breakdown
    assert b["gradients"] == 4 * lora
    assert b["optimizer_state"] == pytest.approx(8 * lora, abs=4 * 8)  # + a step count per tensor
    assert b["parameters"] == 4 * (_n() + lora)


def test_lora_shrinks_the_floor_and_keeps_the_activations() -> None:
    full = Profiler(_build, SPEC, "adam", target="cuda")
    lora = Profiler(_build, SPEC, "adam", target="cuda", trainable="lora:4")
    pf, pl = (p.memory_profile("none", (1, 2)) for p in (full, lora))
    assert pl.floor_bytes < 0.4 * pf.floor_bytes
    # most of the base's activations are still saved: the gradient must flow back through every block
    # to the earlier blocks' factors. Only inputs kept solely for a frozen weight's gradient go (here
    # 80% stay: 485,888 of 606,848 bytes per example)
    lora_rate = pl.activation_bytes_per_example + pl.other_bytes_per_example
    full_rate = pf.activation_bytes_per_example + pf.other_bytes_per_example
    assert 0.7 * full_rate <= lora_rate < full_rate


def test_pattern_freezes_the_rest_and_refuses_a_pattern_that_matches_nothing() -> None:
    model = _build()
    apply_trainable(model, r"norm")
    assert 0 < trainable_count(model) < _n()
    assert all("norm" in n for n, p in model.named_parameters() if p.requires_grad)
    with pytest.raises(ValueError, match="matches no parameter"):
        apply_trainable(_build(), "no_such_parameter")
    with pytest.raises(ValueError, match="matches no linear"):
        apply_trainable(_build(), "lora:4:no_such_module")


GPT2_TINY = ArchConfig("gpt2", 512, 64, 256, 2, 4, 32, tie_embeddings=True)  # hidden 64, Conv1D layers


def test_parsed_specs_in_full_and_frozen() -> None:
    """Every field of what "all", a pattern and "lora:<r>" parse to (alpha 16: the scaling is 16 / r)."""
    assert parse_trainable("all") == TrainableSpec("all", "", 0, 16.0)
    assert parse_trainable("norm") == TrainableSpec("pattern", "norm", 0, 16.0)
    assert parse_trainable("lora:8") == TrainableSpec("lora", LORA_DEFAULT_TARGETS, 8, 16.0)
    spec = parse_trainable("lora:8")
    assert hash(spec) == hash(parse_trainable("lora:8"))  # frozen, so usable as a key
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.rank = 4  # type: ignore[misc]


def test_lora_linear_by_hand() -> None:
    """y = base(x) + x A^T B^T * alpha / r, alpha 16 by default; B starts at zero, so y = base(x) at first."""
    torch.manual_seed(0)
    base = nn.Linear(5, 3)
    lora = LoRALinear(base, 2)
    x = torch.randn(4, 5)
    assert lora.lora_A.weight.shape == (2, 5) and lora.lora_B.weight.shape == (3, 2)
    assert torch.count_nonzero(lora.lora_B.weight) == 0 and torch.equal(lora(x), base(x))
    with torch.no_grad():
        lora.lora_B.weight.normal_()
    expected = base(x) + x @ lora.lora_A.weight.T @ lora.lora_B.weight.T * (16.0 / 2)
    torch.testing.assert_close(lora(x), expected)
    assert LoRALinear(base, 4, alpha=8.0).scaling == 2.0


def test_lora_on_gpt2s_conv1d_by_hand() -> None:
    """GPT-2's c_attn is a Conv1D, its weight stored (in, out) = (64, 192): LoRA rank 4 adds A (4 x 64)
    and B (192 x 4), 4 x (64 + 192) per block (peft's count), 2 blocks; the output is unchanged at first."""
    torch.manual_seed(0)
    model = CausalLM(GPT2_TINY).eval()
    idx = torch.randint(0, 512, (2, 8))
    before = model(idx)
    apply_trainable(model, "lora:4")
    adapted = [m for m in model.modules() if isinstance(m, LoRALinear)]
    assert len(adapted) == 2
    assert all(m.lora_A.weight.shape == (4, 64) and m.lora_B.weight.shape == (192, 4) for m in adapted)
    assert trainable_count(model) == 2 * 4 * (64 + 192)
    torch.testing.assert_close(model(idx), before)


def test_a_pattern_matching_only_the_first_parameter() -> None:
    """The token embedding alone (the first parameter; the head shares it): 512 x 64 trainable."""
    model = CausalLM(GPT2_TINY)
    apply_trainable(model, r"^tok\.")
    assert trainable_count(model) == 512 * 64


def test_lora_a_starts_like_nn_linear_and_b_at_zero() -> None:
    """LoRA's A is drawn like nn.Linear's weight, U(-1/sqrt(in), 1/sqrt(in)) (kaiming a=sqrt 5); B is zero."""
    torch.manual_seed(0)
    lora = LoRALinear(nn.Linear(64, 32), 64)
    bound = 1 / 64**0.5  # nn.Linear's documented bound, 1/sqrt(in_features)
    top = lora.lora_A.weight.abs().max().item()
    assert 0.99 * bound < top <= bound * (1 + 1e-6)  # 4,096 draws reach the bound's last percent
    assert torch.count_nonzero(lora.lora_B.weight) == 0
