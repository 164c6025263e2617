"""helpers.models.architecture_layers: each layer against an independent reference, and a block's
activations against a hand count.

GELU, RMSNorm and `repeat_kv` against torch's own (`F.gelu(approximate="tanh")`, `F.rms_norm`,
`repeat_interleave`); Conv1D against `F.linear`; the rotary frequencies against RoFormer's formula
and Llama 3's published bands, and rotated scores that depend only on the distance; attention that
is causal, and the same with `enable_gqa` as with an explicit mask and repeated K and V.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from support.blocks import block_activation_bytes

from helpers.models import architecture_layers as layers
from helpers.models.architecture_config import ArchConfig
from helpers.models.gpt import GPTConfig

LLAMA = ArchConfig("llama", 96, 64, 160, 2, 4, 128, num_kv_heads=2)  # head width 16, 2 query heads per K/V
LLAMA3_BANDS = (("factor", 8.0), ("high_freq_factor", 4.0), ("low_freq_factor", 1.0),
                ("original_max_position_embeddings", 64), ("rope_type", "llama3"))


def test_gelu_new_is_the_tanh_approximation() -> None:
    x = torch.linspace(-8, 8, 2001, dtype=torch.float64)
    torch.testing.assert_close(layers.gelu_new(x), F.gelu(x, approximate="tanh"), rtol=0, atol=1e-12)


def test_conv1d_is_a_linear_layer_with_its_weight_stored_transposed() -> None:
    conv = layers.Conv1D(5, 3)
    with torch.no_grad():
        conv.bias.normal_()
    x = torch.randn(2, 4, 3)
    assert conv.weight.shape == (3, 5) and sum(p.numel() for p in conv.parameters()) == 3 * 5 + 5
    torch.testing.assert_close(conv(x), F.linear(x, conv.weight.T, conv.bias))


def test_rms_norm_is_torchs_and_normalises_in_fp32() -> None:
    norm = layers.RMSNorm(8, 1e-6)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(3, 5, 8)
    torch.testing.assert_close(norm(x), F.rms_norm(x, (8,), norm.weight, 1e-6))
    low = x.to(torch.bfloat16)  # normalised in fp32, rounded to bf16 once, then scaled
    want = norm.weight * F.rms_norm(low.float(), (8,), None, 1e-6).to(torch.bfloat16)
    assert torch.equal(norm(low), want)


def test_repeat_kv_repeats_each_head_in_place() -> None:
    x = torch.randn(2, 3, 5, 4)
    assert torch.equal(layers._repeat_kv(x, 2), torch.repeat_interleave(x, 2, dim=1))
    assert layers._repeat_kv(x, 1) is x


def test_rotary_frequencies_are_roformers_and_llama3_scales_only_the_slow_bands() -> None:
    d = LLAMA.dim
    plain = torch.tensor([LLAMA.rope_theta ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)
    torch.testing.assert_close(layers._inv_freq(LLAMA).double(), plain, rtol=1e-6, atol=0)
    scaled = layers._inv_freq(ArchConfig("llama", 96, 64, 160, 2, 4, 128, rope_scaling=LLAMA3_BANDS)).double()
    wavelength = 2 * math.pi / plain
    fast, slow = wavelength < 64 / 4, wavelength > 64 / 1  # original length / high and / low factor
    assert fast.any() and slow.any() and (~fast & ~slow).any()
    torch.testing.assert_close(scaled[fast], plain[fast], rtol=1e-6, atol=0)  # kept
    torch.testing.assert_close(scaled[slow], plain[slow] / 8, rtol=1e-6, atol=0)  # divided by the factor
    middle = ~fast & ~slow
    assert (scaled[middle] < plain[middle]).all() and (scaled[middle] > plain[middle] / 8).all()


def test_rotated_scores_depend_only_on_the_distance() -> None:
    rotary = layers.Rotary(LLAMA)
    q, k = torch.randn(LLAMA.dim), torch.randn(LLAMA.dim)
    cos, sin = rotary(q, torch.arange(40)[None])  # (1, 40, head width), angles in fp32

    def at(v: torch.Tensor, pos: int) -> torch.Tensor:
        return v * cos[0, pos] + layers._rotate_half(v) * sin[0, pos]

    assert torch.equal(at(q, 0), q)  # position 0: no rotation
    for m, n in ((5, 2), (9, 9), (3, 17)):
        want = at(q, m) @ at(k, n)
        for shift in (1, 11, 20):
            torch.testing.assert_close(at(q, m + shift) @ at(k, n + shift), want, rtol=1e-5, atol=1e-5)
    assert not torch.isclose(at(q, 5) @ at(k, 2), at(q, 6) @ at(k, 2))  # the distance matters


def _block_out(block: torch.nn.Module, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    rope = layers.Rotary(LLAMA)(x, torch.arange(x.shape[1])[None])
    return block(x, rope, mask)


def test_llama_block_is_causal_and_gqa_equals_repeated_kv() -> None:
    block = layers.LlamaBlock(LLAMA).eval()
    x = torch.randn(2, 6, LLAMA.hidden_size)
    out = _block_out(block, x)  # no mask: SDPA's enable_gqa, causal
    later = x.clone()
    later[:, 4:] = torch.randn(2, 2, LLAMA.hidden_size)
    changed = _block_out(block, later)
    torch.testing.assert_close(changed[:, :4], out[:, :4])  # a later token changes no earlier output
    assert not torch.allclose(changed[:, 4:], out[:, 4:])
    causal = torch.ones(6, 6, dtype=torch.bool).tril()[None, None]  # True: may attend
    torch.testing.assert_close(_block_out(block, x, causal), out, rtol=1e-5, atol=1e-6)  # repeated K/V


def test_gpt2_block_is_causal() -> None:
    cfg = ArchConfig("gpt2", 96, 32, 128, 1, 4, 16)
    block = layers.GPT2Block(cfg).eval()
    x = torch.randn(1, 5, 32)
    later = x.clone()
    later[:, 3:] += 1.0
    out, changed = block(x), block(later)
    torch.testing.assert_close(changed[:, :3], out[:, :3])
    assert not torch.allclose(changed[:, 3:], out[:, 3:])


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
