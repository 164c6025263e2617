"""helpers.models.architectures: the released models' parameter counts, and the same memory as Transformers.

The independent reference is Transformers itself: the same config built by
`AutoModelForCausalLM.from_config` (random weights), profiled on meta and run for real on the CPU
(the allocator's record), per category, in fp32 and bf16 autocast, plain and checkpointed, K = 1
and K = 2. Published parameter counts are the releases' own. Under CI=true a missing Transformers
fails these tests instead of skipping them.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import pytest
import torch
from support.blocks import block_activation_bytes
from support.transformers_oracles import copy_transformers_weights, hf_dict

from helpers.core.data import BatchSpec
from helpers.meta.profiler import Profiler
from helpers.models import architecture_layers as layers
from helpers.models.architecture_config import PUBLISHED_PARAMETERS, RELEASED, ArchConfig, param_count
from helpers.models.architectures import CausalLM, released
from helpers.models.gpt import GPTConfig
from helpers.plan.hf_configs import transformers_causal_lm, transformers_missing

CI = os.environ.get("CI", "").lower() == "true"
needs_transformers = pytest.mark.skipif(
    transformers_missing() and not CI, reason="needs Transformers (pip install 'ckpt-vs-accum[frameworks]')")

_ROPE3 = (("factor", 8.0), ("high_freq_factor", 4.0), ("low_freq_factor", 1.0),
          ("original_max_position_embeddings", 64), ("rope_type", "llama3"))
# One small config per family: grouped-query attention (llama, mistral, qwen2), Llama 3's rope bands,
# Mistral's sliding-window mask (the 32-token batches reach its 16-token window), Qwen2's q/k/v biases
# and tied head, GPT-2's tied head, Conv1D layers and dropout 0.1.
SMALL = {
    "llama": ArchConfig("llama", 96, 64, 160, 2, 4, 128, num_kv_heads=2, rope_theta=500000.0,
                        rope_scaling=_ROPE3),
    "mistral": ArchConfig("mistral", 96, 64, 160, 2, 4, 128, num_kv_heads=1, sliding_window=16),
    "qwen2": ArchConfig("qwen2", 96, 64, 160, 2, 4, 128, num_kv_heads=2, qkv_bias=True, tie_embeddings=True,
                        norm_eps=1e-6),
    "gpt2": ArchConfig("gpt2", 96, 64, 256, 2, 4, 64, tie_embeddings=True, qkv_bias=True, o_bias=True,
                       mlp_bias=True, embd_dropout=0.1, attn_dropout=0.1, resid_dropout=0.1),
}
SEQ, MICRO = 32, 2
MODES = [(ckpt, k) for ckpt in ("none", "blocks") for k in (1, 2)]


def test_transformers_is_installed_under_ci() -> None:
    if transformers_missing() and not CI:
        pytest.skip("Transformers not installed here (pip install 'ckpt-vs-accum[frameworks]')")
    assert not transformers_missing(), (
        "CI=true but Transformers is missing: pip install 'ckpt-vs-accum[frameworks]'"
    )


# -- parameter counts -----------------------------------------------------------------------------


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once


@pytest.mark.parametrize("name", list(RELEASED))
def test_presets_have_the_released_parameter_count_at_any_length(name: str) -> None:
    counts = set()
    for seq_len in (None, 128):
        build, spec, cfg = released(name, seq_len)
        with torch.device("meta"):
            counts.add(_count(build()))
        assert spec.vocab_size == cfg.vocab_size
    assert counts == {PUBLISHED_PARAMETERS[name]} == {param_count(RELEASED[name])}


@needs_transformers
def test_transformers_builds_the_same_counts_from_the_same_configs() -> None:
    for name, cfg in RELEASED.items():
        with torch.device("meta"):
            model = transformers_causal_lm(hf_dict(cfg))
        assert model.num_parameters() == PUBLISHED_PARAMETERS[name], name
        tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
        assert tied == cfg.tie_embeddings, name


def test_gpt2_refuses_more_than_its_1024_positions() -> None:
    with pytest.raises(ValueError, match="seq_len=1025 is too long for gpt2-small: its learned position "
                                         "table has 1024 positions"):
        released("gpt2-small", 1025)
    _, spec, _ = released("gpt2-small")
    assert spec.seq_len == 1024
    with pytest.raises(ValueError, match="seq <= 64"):
        CausalLM(SMALL["gpt2"])(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="name='gpt2' is not allowed"):
        released("gpt2")


def test_configs_are_validated() -> None:
    with pytest.raises(ValueError, match="num_heads=4 must be a multiple of num_kv_heads=3"):
        dataclasses.replace(SMALL["llama"], num_kv_heads=3)
    with pytest.raises(ValueError, match="family='bert' is not allowed"):
        dataclasses.replace(SMALL["llama"], family="bert")
    with pytest.raises(ValueError, match="rope_scaling of type 'yarn'"):
        dataclasses.replace(SMALL["llama"], rope_scaling=(("rope_type", "yarn"),))
    with pytest.raises(ValueError, match="gpt2 config has multi-head attention"):
        dataclasses.replace(SMALL["gpt2"], num_kv_heads=2)


# -- the same function as Transformers ------------------------------------------------------------


@needs_transformers
@pytest.mark.parametrize("family", list(SMALL))
def test_same_logits_as_transformers_with_its_weights(family: str) -> None:
    cfg = SMALL[family]
    theirs = transformers_causal_lm(hf_dict(cfg)).eval()
    ours = CausalLM(cfg).eval()
    copy_transformers_weights(ours, theirs)
    ids = torch.randint(cfg.vocab_size, (2, SEQ))
    for length in (SEQ, 8):  # Mistral: with its window mask at 32 tokens, without it at 8
        with torch.no_grad():
            want = theirs(ids[:, :length]).logits
            got = ours(ids[:, :length])
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (ours.head.weight is ours.tok.weight) == cfg.tie_embeddings


# -- the same memory as Transformers ---------------------------------------------------------------


def _cpu_runs_gqa_fused() -> bool:
    """Whether this torch's CPU SDPA runs `enable_gqa=True` in its fused (flash) kernel.

    Read from the ops that reach the dispatcher, not from a version number: torch 2.5's CPU SDPA
    sends grouped-query attention to the math kernel (which expands K and V itself and keeps the
    s x s weights); torch 2.13's flash kernel takes it whole.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    class Names(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    q, kv = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16)
    with Names() as seen:
        torch.nn.functional.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
    return any("flash_attention" in name for name in seen.names)



@needs_transformers
def test_mistral_masks_from_its_window_on_as_transformers_does() -> None:
    """At 15 tokens (under the 16-token window) no mask and enable_gqa; at 16, a mask and expanded K/V."""
    cfg = SMALL["mistral"]
    activations = {}
    for seq in (15, 16):
        spec = BatchSpec.lm(seq, cfg.vocab_size)
        ours = Profiler(functools.partial(CausalLM, cfg), spec).step(MICRO)
        theirs = Profiler(functools.partial(transformers_causal_lm, hf_dict(cfg)), spec).step(MICRO)
        _close(ours.breakdown, theirs.breakdown, f"mistral at {seq} tokens")
        activations[seq] = ours.breakdown["activations"]
    if _cpu_runs_gqa_fused():  # at 16 the expanded K and V are saved, at 15 the fused kernel needs none
        assert activations[16] > activations[15] * 16 / 15 * 1.01
    else:  # the math kernel expands K and V at both lengths and keeps the s x s weights too
        assert activations[16] > activations[15]



def _close(ours: dict[str, int], theirs: dict[str, int], what: str) -> None:
    for category, want in theirs.items():
        got = ours[category]
        assert abs(got - want) <= 0.01 * want, f"{what}: {category} {got:,} vs Transformers {want:,}"


def _forward_activations(cfg: ArchConfig, precision: str) -> int:
    prof = Profiler(functools.partial(CausalLM, cfg), BatchSpec.lm(SEQ, cfg.vocab_size), precision=precision)
    return prof.step(MICRO, accumulation_steps=1).forward_end_breakdown["activations"]


@needs_transformers
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("family", list(SMALL))
def test_meta_profile_matches_transformers_on_meta_and_on_the_cpu(family: str, precision: str) -> None:
    cfg = SMALL[family]
    # the blocks hold at least half of the activations, so the logits cannot hide a mismatch in them
    one, two = (_forward_activations(dataclasses.replace(cfg, num_layers=n), precision) for n in (1, 2))
    assert 2 * (two - one) >= 0.5 * two, f"blocks hold only {2 * (two - one) / two:.0%} of the activations"
    spec = BatchSpec.lm(SEQ, cfg.vocab_size)
    ours = Profiler(functools.partial(CausalLM, cfg), spec, precision=precision)
    hf_meta = Profiler(functools.partial(transformers_causal_lm, hf_dict(cfg)), spec, precision=precision)
    hf_cpu = Profiler(functools.partial(transformers_causal_lm, hf_dict(cfg)), spec, precision=precision,
                      device="cpu")
    for checkpoint, k in MODES:
        mine = ours.step(MICRO, checkpoint=checkpoint, accumulation_steps=k)
        what = f"{family} {precision} checkpoint={checkpoint} K={k}"
        on_meta = hf_meta.step(MICRO, checkpoint=checkpoint, accumulation_steps=k)
        _close(mine.breakdown, on_meta.breakdown, f"{what}: the peak, Transformers on meta")
        for phase, breakdown in mine.phases.items():  # the same device: every phase, not only the peak
            _close(breakdown, on_meta.phases[phase], f"{what}: {phase}, Transformers on meta")
        assert mine.kernels == on_meta.kernels
        real = hf_cpu.step(MICRO, checkpoint=checkpoint, accumulation_steps=k)
        _close(mine.breakdown, real.breakdown, f"{what}: the peak, a real CPU step of Transformers")


@needs_transformers
def test_the_comparison_sees_a_wrong_attention_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Expanding K and V for grouped-query attention when Transformers passes enable_gqa is > 1% off.

    More with the fused kernel (it needs no expanded copies); fewer where this torch's CPU runs
    enable_gqa in the math kernel, which keeps the s x s weights besides (torch 2.5).
    """
    cfg = SMALL["llama"]
    spec = BatchSpec.lm(SEQ, cfg.vocab_size)
    theirs = Profiler(functools.partial(transformers_causal_lm, hf_dict(cfg)), spec).step(MICRO)
    original = layers._sdpa

    def always_repeat(module, q, k, v, mask, groups):  # noqa: ANN001, ANN202
        return original(module, q, layers._repeat_kv(k, groups), layers._repeat_kv(v, groups), mask, 1)

    monkeypatch.setattr(layers, "_sdpa", always_repeat)
    wrong = Profiler(functools.partial(CausalLM, cfg), spec).step(MICRO)
    off = wrong.breakdown["activations"] / theirs.breakdown["activations"] - 1
    fused = _cpu_runs_gqa_fused()
    if not fused:
        off = -off
    assert off > 0.01, f"expanded K/V changed the activations by only {off:.2%} (fused kernel: {fused})"


# -- a Llama block against the project's GPT block of the same width -------------------------------


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_block_activation_bytes_against_hand_counts(precision: str) -> None:
    """Per token per block, for a Llama-2-7B-shaped block (h, i = 2.6875 h, MHA) at width 256."""
    h, i, heads = 256, 688, 4
    llama = ArchConfig("llama", 64, h, i, 2, heads, 128)
    gpt = GPTConfig(64, 128, h, heads, 2, dropout=0.0, fused_attention=True)
    ours, project = (block_activation_bytes(c, seq_len=64, precision=precision) for c in (llama, gpt))
    lse, stats = 4 * heads, 8  # attention's log-sum-exp per head; RMSNorm's rsqrt, LayerNorm's mean and rstd
    if precision == "fp32":
        # RMSNorm keeps x, x * rsqrt and its output (3h, twice); attention q, k, v, out (4h); SwiGLU 4i
        want_llama = 4 * (3 * h + 4 * h + 3 * h + 4 * i) + lse + stats
        want_gpt = 4 * 16 * h + lse + 2 * stats  # x, ln, qkv (3h), out, x, ln, fc (4h), gelu (4h)
    else:
        # fp32 x and x * rsqrt, then one bf16 cast of the norm's output per projection (q, k, v; gate, up)
        want_llama = (4 + 4 + 3 * 2) * h + (4 + 4 + 2 * 2) * h + 4 * 2 * h + 4 * 2 * i + lse + stats
        want_gpt = (4 + 2 + 6 + 2 + 4 + 2 + 8 + 8) * h + lse + 2 * stats
    assert (ours, project) == (want_llama, want_gpt)
    assert ours > project
