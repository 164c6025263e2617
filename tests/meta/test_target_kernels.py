"""The attention kernel a CUDA target is assumed to run: dtype, mask, grouped-query attention, capability."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
import torch.nn.functional as F

from helpers.core.data import BatchSpec
from helpers.meta.profiler import Profiler
from helpers.meta.target_kernels import DEFAULT_CAPABILITY, GPUS, _AutocastRule, _TargetKernels, cuda_kernel
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


def test_cuda_kernel_thresholds_follow_sdp_utils() -> None:
    """aten/src/ATen/native/transformers/cuda/sdp_utils.cpp: flash takes head_dim up to 256
    (check_head_dim_size_flash); memory-efficient needs head_dim a multiple of 4 in fp32, 8 in half
    precision (check_head_dim_size_mem_efficient)."""
    bf16, fp32 = torch.bfloat16, torch.float32
    assert cuda_kernel(bf16, 256, False) == FLASH
    assert cuda_kernel(bf16, 264, False) == EFFICIENT  # past flash's 256
    assert cuda_kernel(fp32, 12, False) == EFFICIENT  # 12 = 3 x 4
    assert cuda_kernel(bf16, 12, False) == MATH  # not a multiple of 8
    assert cuda_kernel(torch.float16, 64, False, capability=79) == EFFICIENT


def test_gpu_table_holds_the_cards_compute_capabilities() -> None:
    """NVIDIA's list (developer.nvidia.com/cuda-gpus): T4 7.5, A10 8.6, L4 8.9, A100 8.0, H100 9.0;
    a profiler's default capability is that of the command's default card (--gpu A100)."""
    assert GPUS == {"T4": 75, "A10": 86, "A10G": 86, "L4": 89, "A100": 80, "H100": 90, "H200": 90}
    default_gpu = cli._parser().get_default("gpu")
    assert DEFAULT_CAPABILITY == cli._capability(default_gpu) == GPUS["A100"]


def _meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta", requires_grad=True)


def test_meta_attention_runs_the_kernel_the_target_would() -> None:
    # CUDA, fp32, 3 heads of 64 (batch 2): memory-efficient; enable_gqa with as many key/value heads as
    # query heads is no grouped-query attention (sdp_utils.cpp check_batch_size_and_num_heads_dense
    # checks the heads only when they differ), so it stays memory-efficient
    q = _meta(2, 3, 8, 64)
    with _TargetKernels("cuda") as routed:
        out = F.scaled_dot_product_attention(q, q, q, enable_gqa=True)
    assert routed.kernels == {"memory-efficient"} and out.shape == q.shape
    assert type(out.grad_fn).__name__ == "ScaledDotProductEfficientAttentionBackward0"
    # CUDA, bf16: CUDA's flash kernel (its node keeps the philox RNG state), not the CPU one
    q = _meta(2, 4, 8, 64, dtype=torch.bfloat16)
    with _TargetKernels("cuda") as routed:
        out = F.scaled_dot_product_attention(q, q, q)
    assert routed.kernels == {"flash"}
    assert type(out.grad_fn).__name__ == "ScaledDotProductFlashAttentionBackward0"
    # CPU, no dropout given: what the real CPU picks for the same call on real tensors
    real = torch.zeros(2, 4, 8, 64)
    with _TargetKernels("cpu") as routed:
        out = F.scaled_dot_product_attention(_meta(2, 4, 8, 64), _meta(2, 4, 8, 64), _meta(2, 4, 8, 64))
    cpu_choice = int(torch._fused_sdp_choice(real, real, real))
    assert cpu_choice == FLASH and routed.kernels == {"flash"}
    assert type(out.grad_fn).__name__ == "ScaledDotProductFlashAttentionForCpuBackward0"


def test_real_tensors_go_to_sdpa_as_given() -> None:
    original = F.scaled_dot_product_attention
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 4, 6, 8, generator=g), torch.randn(1, 4, 6, 8, generator=g)
    kv2 = torch.randn(1, 2, 6, 8, generator=g)
    mask = torch.randn(6, 6, generator=g)
    with _TargetKernels("cpu") as routed:
        assert torch.equal(F.scaled_dot_product_attention(q, k, k), original(q, k, k))
        assert torch.equal(F.scaled_dot_product_attention(q, k, k, mask), original(q, k, k, mask))
        assert torch.equal(F.scaled_dot_product_attention(q, kv2, kv2, enable_gqa=True),
                           original(q, kv2, kv2, enable_gqa=True))
        with pytest.raises(RuntimeError):  # fewer key/value heads without enable_gqa: as SDPA itself
            original(q, kv2, kv2)
        with pytest.raises(RuntimeError):
            F.scaled_dot_product_attention(q, kv2, kv2)
    assert routed.kernels == set() and F.scaled_dot_product_attention is original


def test_cuda_rule_runs_normalisations_softmax_and_exp_in_fp32() -> None:
    """torch.amp's "CUDA Ops that can autocast to float32" list has layer_norm, softmax and exp; CPU
    autocast leaves them in bf16 (checked here on the real CPU), and both run losses in fp32."""
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cpu = [f(x).dtype for f in (lambda t: F.layer_norm(t, (8,)), lambda t: F.softmax(t, -1), torch.exp)]
    xm = torch.empty(2, 8, dtype=torch.bfloat16, device="meta")
    target = torch.zeros(2, dtype=torch.long, device="meta")
    for device, expected in (("cpu", cpu), ("cuda", [torch.float32] * 3)):
        with _AutocastRule(device):
            got = [F.layer_norm(xm, (8,)).dtype, F.softmax(xm, -1).dtype, torch.exp(xm).dtype]
            assert F.cross_entropy(xm, target).dtype == torch.float32
        assert got == expected, device


def test_a_weight_is_cast_once_per_forward_pass_as_autocast_caches_it() -> None:
    """Two linear layers on one weight within a forward pass save the same bf16 copy, a new forward pass
    makes a new one: real CPU autocast (storages of the saved copies) and the rule on meta (their bases)."""

    def casts(device: str, region: object) -> list[int]:
        w = torch.ones(4, 8, device=device, requires_grad=True)
        x = torch.ones(2, 8, device=device, requires_grad=True)
        saved: list[torch.Tensor] = []

        def pack(t: torch.Tensor) -> torch.Tensor:
            if t.dtype == torch.bfloat16 and t.numel() == w.numel():
                saved.append(t)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            for _ in range(2):
                with region():
                    F.linear(x, w), F.linear(x, w)
        keys = [t.untyped_storage().data_ptr() if device == "cpu" else id(t._base) for t in saved]
        return [keys.index(key) for key in keys]  # which copy each saved tensor is

    real = casts("cpu", lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    rule = _AutocastRule("cpu")
    with rule:
        meta = casts("meta", rule.forward)
    assert real == meta == [0, 0, 2, 2]
    w = torch.ones(4, 8, device="meta", requires_grad=True)
    fresh, fp32 = _AutocastRule("cpu"), (torch.float32,)  # outside forward() nothing is kept
    assert fresh._cast(w, torch.bfloat16, fp32) is not fresh._cast(w, torch.bfloat16, fp32)
    assert not fresh.cache


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


def test_the_cpu_probe_picks_what_torch_picks_for_full_sized_attention() -> None:
    """The tiny tensors `_cpu_kernel` asks with give torch's own choice for real shapes (2 x 4 heads x 96
    tokens), over every dtype, head size, mask, dropout, causal and GQA setting the meta run can meet."""
    from helpers.meta.target_kernels import _cpu_kernel

    _cpu_kernel.cache_clear()
    seen = set()
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for head_dim in (64, 60, 62, 256, 300):
            for mask in (None, torch.bool, dtype):
                for dropout in (False, True):
                    for causal in (False, True):
                        for gqa in (False, True):
                            q = torch.zeros(2, 4, 96, head_dim, dtype=dtype)
                            kv = torch.zeros(2, 2 if gqa else 4, 96, head_dim, dtype=dtype)
                            m = None if mask is None else torch.zeros(96, 96, dtype=mask)
                            real = int(torch._fused_sdp_choice(
                                q, kv, kv, attn_mask=m, dropout_p=0.1 if dropout else 0.0,
                                is_causal=causal and m is None, **({"enable_gqa": True} if gqa else {})))
                            probe = _cpu_kernel(dtype, head_dim, mask, dropout, causal, gqa)
                            assert probe == real, (dtype, head_dim, mask, dropout, causal, gqa, probe, real)
                            seen.add(real)
    assert seen == {MATH, FLASH}  # both CPU kernels occur, so the comparison can tell them apart


def test_attention_dropout_on_a_cpu_target_runs_the_math_kernel_as_torch_does() -> None:
    """With dropout the CPU's SDPA takes the math path (torch's own choice on real tensors), and the meta
    run records the same kernel; without dropout both take flash."""
    q = torch.zeros(2, 4, 32, 16)
    for p, name in ((0.1, "math"), (0.0, "flash")):
        real = int(torch._fused_sdp_choice(q, q, q, dropout_p=p, is_causal=True))
        with _TargetKernels("cpu", None) as seen:
            out = F.scaled_dot_product_attention(*(q.to("meta"),) * 3, dropout_p=p, is_causal=True)
        assert out.shape == q.shape and seen.kernels == {name}
        assert real == {"math": MATH, "flash": FLASH}[name]


def test_a_boolean_mask_on_a_cuda_target_becomes_the_float_mask_sdpa_makes() -> None:
    """A bool mask (Mistral's window) on a CUDA target runs the memory-efficient kernel with the additive
    float mask SDPA builds from it: the meta output has the query's shape, and the kernel is recorded."""
    q = torch.zeros(1, 4, 32, 64, dtype=torch.bfloat16, device="meta")
    mask = torch.ones(32, 32, dtype=torch.bool, device="meta").tril()
    made: list[torch.Tensor] = []
    efficient = torch.ops.aten._scaled_dot_product_efficient_attention

    def spy(query, key, value, attn_mask, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        made.append(attn_mask)
        return efficient(query, key, value, attn_mask, *args, **kwargs)

    with _TargetKernels("cuda", None, capability=80) as seen:
        torch.ops.aten._scaled_dot_product_efficient_attention = spy
        try:
            out = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        finally:
            torch.ops.aten._scaled_dot_product_efficient_attention = efficient
    assert out.shape == q.shape and seen.kernels == {"memory-efficient"}
    assert len(made) == 1 and made[0].dtype == torch.bfloat16 and tuple(made[0].shape) == (32, 32)
