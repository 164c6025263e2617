"""helpers.models.architectures: the same function and the same memory as Transformers.

The independent reference is Transformers itself: the same config built by
`AutoModelForCausalLM.from_config` (random weights), profiled on meta and run for real on the CPU
(the allocator's record), per category, in fp32 and bf16 autocast, plain and checkpointed, K = 1
and K = 2. Under CI=true a missing Transformers fails these tests instead of skipping them.

The released configs' parameter counts and checks (`helpers.models.architecture_config`) are tested
in `tests/models/test_architecture_config.py`, the layers and a block's activations
(`helpers.models.architecture_layers`) in `tests/models/test_architecture_layers.py`.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import pytest
import torch
from support.architectures import SMALL
from support.tiers import check_cases
from support.transformers_oracles import copy_transformers_weights, hf_dict

from helpers.core.data import BatchSpec
from helpers.meta.profiler import Profiler
from helpers.models import architecture_layers as layers
from helpers.models.architecture_config import ArchConfig
from helpers.models.architectures import CausalLM, released
from helpers.plan.hf_configs import transformers_causal_lm, transformers_missing

CI = os.environ.get("CI", "").lower() == "true"
needs_transformers = pytest.mark.skipif(
    transformers_missing() and not CI, reason="needs Transformers (pip install 'ckpt-vs-accum[frameworks]')")

SEQ, MICRO = 32, 2
MODES = [(ckpt, k) for ckpt in ("none", "blocks") for k in (1, 2)]


def test_transformers_is_installed_under_ci() -> None:
    if transformers_missing() and not CI:
        pytest.skip("Transformers not installed here (pip install 'ckpt-vs-accum[frameworks]')")
    assert not transformers_missing(), (
        "CI=true but Transformers is missing: pip install 'ckpt-vs-accum[frameworks]'"
    )


# -- the released presets' limits -----------------------------------------------------------------


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
@pytest.mark.parametrize(("family", "precision"), check_cases(
    [(f, p) for f in SMALL for p in ("fp32", "bf16")], keep={("gpt2", "fp32"), ("llama", "bf16")}))
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
