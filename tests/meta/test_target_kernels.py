"""The attention kernel a CUDA target is assumed to run: dtype, mask, grouped-query attention, capability."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from helpers.core.data import BatchSpec
from helpers.meta.profiler import Profiler
from helpers.meta.target_kernels import GPUS, cuda_kernel
from helpers.models.architecture_config import RELEASED
from helpers.models.architectures import CausalLM
from helpers.plan import cli

FLASH, EFFICIENT, MATH = 1, 2, 0


def test_cuda_kernel_rule() -> None:
    bf16, fp32 = torch.bfloat16, torch.float32
    assert cuda_kernel(bf16, 64, False, gqa=True) == FLASH  # flash takes enable_gqa
    assert cuda_kernel(fp32, 64, False, gqa=True) == MATH  # memory-efficient does not: math
    assert cuda_kernel(bf16, 64, False, capability=GPUS["T4"]) == EFFICIENT  # sm75: no flash
    assert cuda_kernel(bf16, 64, False, gqa=True, capability=75) == MATH
    assert cuda_kernel(bf16, 64, True) == EFFICIENT  # a mask: Transformers expanded K, V already
    assert cuda_kernel(bf16, 64, False, capability=GPUS["H100"]) == FLASH


def test_grouped_query_attention_on_cuda_runs_flash_in_bf16_and_math_on_a_t4() -> None:
    """Llama-3.2-1B's blocks (8 of 32 key/value heads) at 2,048 tokens: flash keeps no S x S matrix, so
    the activations are less than half of math's (785.5 vs 1,881.0 MiB for two blocks)."""
    cfg = dataclasses.replace(RELEASED["llama-3.2-1b"], vocab_size=512, num_layers=2)
    spec = BatchSpec.lm(2048, 512)
    runs = {cap: Profiler(functools.partial(CausalLM, cfg), spec, target="cuda", precision="bf16",
                          capability=cap).step(1) for cap in (80, 75)}
    assert runs[80].kernels == ("flash",) and runs[75].kernels == ("math",)
    flash, math = (runs[c].forward_end_breakdown["activations"] for c in (80, 75))
    seq, heads, blocks = 2048, 32, 2
    assert math - flash > blocks * heads * seq * seq * 2  # at least the bf16 probabilities per block


def test_gpu_flag() -> None:
    assert cli._capability("T4") == 75 and cli._capability("8.6") == 86 and cli._capability("90") == 90
    with pytest.raises(ValueError, match="--gpu"):
        cli._capability("V100-ish")


def test_fused_and_per_tensor_adam_appear_where_the_optimizer_step_binds() -> None:
    """A small Llama-family model at one short sequence: CUDA's foreach Adam makes parameter-sized
    temporaries, so the step binds; fused=True / foreach=False save what the per-tensor loop's peak says."""
    from helpers.plan.report import plan_model

    cfg = dataclasses.replace(RELEASED["llama-3.2-1b"], vocab_size=512, hidden_size=64, intermediate_size=128,
                              num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16)
    build, spec = functools.partial(CausalLM, cfg), BatchSpec.lm(16, 512)
    foreach = Profiler(build, spec, "adam", target="cuda")
    per_tensor = Profiler(build, spec, "adam", target="cuda", optimizer_impl="per-tensor")
    saving = foreach.step(1).peak_bytes - per_tensor.step(1).peak_bytes
    assert saving > 0
    report = plan_model(foreach, name="small", budget_bytes=1e9, effective_batch=1, checkpoint="none")
    fused = [k for k in report.remedies if k.startswith("fused=True")]
    assert fused and report.remedies[fused[0]] == saving
    assert any(k.startswith("8-bit Adam state (an estimate") for k in report.remedies)
