"""Lesson 09's planner: the meta-device profile matches real CPU measurement, and the command works."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from helpers.core.data import BatchSpec
from helpers.meta.profiler import Profiler
from helpers.meta.target_kernels import cuda_kernel
from helpers.models.gpt import GPT, GPTConfig
from helpers.techniques.checkpointing import apply_ac, blocks_of

# -- models the planner has never seen ---------------------------------------------------------


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(24, 96)
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(96, 192), nn.Tanh(), nn.Linear(192, 96))
                                    for _ in range(3))
        self.out = nn.Linear(96, 7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for layer in self.layers:
            x = x + layer(x)
        return self.out(x)


class _ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stages = nn.ModuleList(
            nn.Sequential(nn.Conv2d(c_in, 12, 3, padding=1), nn.BatchNorm2d(12), nn.ReLU())
            for c_in in (3, 12, 12))
        self.head = nn.Linear(12, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage in self.stages:
            x = stage(x)
        return self.head(x.mean(dim=(2, 3)))


def _encoder(dropout: float = 0.0) -> nn.Module:
    layer = nn.TransformerEncoderLayer(48, 4, 96, dropout=dropout, batch_first=True)
    return nn.Sequential(nn.Linear(10, 48), nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
                         nn.Flatten(), nn.Linear(48 * 16, 3))


def _gpt(fused: bool) -> nn.Module:
    return GPT(GPTConfig(vocab_size=96, seq_len=24, d_model=48, n_heads=4, n_layers=2,
                         dropout=0.1, fused_attention=fused))


MODELS = {
    "mlp": (_MLP, BatchSpec.classifier((24,), 7), 16),
    "conv-batchnorm": (_ConvBN, BatchSpec.classifier((3, 12, 12), 5), 8),
    "gpt": (functools.partial(_gpt, False), BatchSpec.lm(24, 96), 6),
    "gpt-fused-attention": (functools.partial(_gpt, True), BatchSpec.lm(24, 96), 6),
    "transformer-encoder": (_encoder, BatchSpec.classifier((16, 10), 3), 6),
}


def _pair(name: str, precision: str = "fp32", **meta_kw: object):  # noqa: ANN202
    build, spec, b = MODELS[name]
    return build, spec, b, {dev: Profiler(build, spec, device=dev, precision=precision, **meta_kw)
                            for dev in ("meta", "cpu")}


@pytest.fixture
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    """torch's intra-op threads for the test (kernels' buffers are per thread), put back after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("checkpoint", ["none", "blocks"])
@pytest.mark.parametrize("name", list(MODELS))
def test_meta_profile_matches_cpu_within_1_percent(name: str, checkpoint: str, threads: int) -> None:
    """At 1 and 2 intra-op threads: `make test` runs one, a learner's kernel on 2 cores two."""
    _, _, b, prof = _pair(name)
    meta, cpu = (prof[d].step(b, checkpoint=checkpoint) for d in ("meta", "cpu"))
    assert cpu.method == "cpu-tracker" and meta.method.startswith("meta-tracker")
    for attr in ("peak_bytes", "forward_end_bytes", "backward_peak_bytes", "optimizer_peak_bytes"):
        # never below the CPU allocator's record of the real step, and within 1% of it
        assert 0 <= getattr(meta, attr) / getattr(cpu, attr) - 1 < 0.01, (attr, getattr(meta, attr),
                                                                          getattr(cpu, attr))
    for cat, value in cpu.forward_end_breakdown.items():
        assert meta.forward_end_breakdown[cat] == pytest.approx(value, rel=0.01, abs=512), cat


@pytest.mark.parametrize("name", ["mlp", "gpt", "transformer-encoder"])
def test_checkpointing_lowers_the_activations_it_should(name: str) -> None:
    _, _, b, prof = _pair(name)
    plain = prof["meta"].step(b).forward_end_breakdown["activations"]
    ckpt = prof["meta"].step(b, checkpoint="blocks").forward_end_breakdown["activations"]
    assert ckpt < plain


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("name", list(MODELS))
def test_bf16_rule_on_meta_matches_real_cpu_autocast(name: str, threads: int) -> None:
    """Where the peak falls depends on the thread count (oneDNN's buffers are per thread): with one
    thread a conv net's peak is a 16-bit mean's fp32 copy, or a recompute holding the RNG state."""
    _, _, b, prof = _pair(name, precision="bf16")
    for ck in ("none", "blocks"):
        meta, cpu = (prof[d].step(b, checkpoint=ck) for d in ("meta", "cpu"))
        assert 0 <= meta.peak_bytes / cpu.peak_bytes - 1 < 0.01, (ck, meta.peak_bytes, cpu.peak_bytes)
        assert meta.forward_end_bytes == pytest.approx(cpu.forward_end_bytes, rel=0.01), ck


def test_without_routing_meta_attention_keeps_the_score_matrix() -> None:
    build, spec, _, _ = _pair("transformer-encoder")
    real = Profiler(build, spec, device="cpu").step(6)
    routed = Profiler(build, spec).step(6)
    unrouted = Profiler(build, spec, route_attention=False).step(6)
    assert routed.kernels == ("flash",)
    assert unrouted.peak_bytes > 1.01 * real.peak_bytes  # the math path saves the S x S probabilities
    assert 0 <= routed.peak_bytes / real.peak_bytes - 1 < 0.01, (routed.peak_bytes, real.peak_bytes)


def test_cpu_target_follows_the_cpu_kernel_choice_with_dropout() -> None:
    build, spec, _, _ = _pair("transformer-encoder")
    with_dropout = Profiler(functools.partial(_encoder, 0.1), spec).step(2)
    assert with_dropout.kernels == ("math",)  # CPU's flash kernel has no dropout


def test_cuda_target_states_its_kernel() -> None:
    assert cuda_kernel(torch.bfloat16, 64, has_mask=False) == 1  # flash
    assert cuda_kernel(torch.float32, 64, has_mask=False) == 2  # memory-efficient
    assert cuda_kernel(torch.bfloat16, 64, has_mask=True) == 2
    build = functools.partial(GPT, GPTConfig(96, 24, 64, 4, 2, dropout=0.1, fused_attention=True))
    spec = BatchSpec.lm(24, 96)
    fp32 = Profiler(build, spec, target="cuda").step(2)
    bf16 = Profiler(build, spec, target="cuda", precision="bf16").step(2)
    assert fp32.kernels == ("memory-efficient",) and bf16.kernels == ("flash",)
    odd = Profiler(_pair("gpt-fused-attention")[0], spec, target="cuda", precision="bf16").step(2)
    assert odd.kernels == ("math",)  # head_dim 12: no fused CUDA kernel in half precision


def test_user_wrapper_and_generic_blocks() -> None:
    calls: list[int] = []

    def wrapper(block, x):  # noqa: ANN001, ANN202
        calls.append(1)
        return torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)

    build, spec, b, _ = _pair("mlp")
    p = Profiler(build, spec)
    custom = p.step(b, checkpoint=wrapper)
    blocks = p.step(b, checkpoint="blocks")
    assert calls and custom.peak_bytes == blocks.peak_bytes
    model = _MLP()
    assert blocks_of(model) is model.layers
    with apply_ac(model):
        assert "forward" in vars(model.layers[0])
    assert "forward" not in vars(model.layers[0])
    with pytest.raises(ValueError, match="no nn.ModuleList"):
        blocks_of(nn.Linear(2, 2))


# -- inputs and the command line ----------------------------------------------------------------


# -- the lesson's protocol and exercises --------------------------------------------------------
