"""helpers.frameworks.compiled: what torch.compile keeps for backward at each activation memory budget.

The saved bytes read from the compiled autograd nodes are checked against an independent reader:
saved-tensor hooks (with dynamo off) that see what the compiled function hands to
`save_for_backward`. About 10 s: each budget is a fresh compile.
"""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
import torch._functorch.config as functorch_config

from helpers.frameworks import compiled
from helpers.models.gpt import GPTConfig, seeded_gpt
from helpers.techniques.saved_tensors import save_matmul_outputs

CFG = GPTConfig(vocab_size=32, seq_len=12, d_model=16, n_heads=2, n_layers=2, dropout=0.0)


@pytest.fixture
def setup() -> tuple[torch.nn.Module, torch.Tensor]:
    gen = torch.Generator().manual_seed(2)
    return seeded_gpt(CFG, "cpu"), torch.randn(3, CFG.seq_len, CFG.d_model, generator=gen).requires_grad_()


def _hooked_saved_bytes(model: torch.nn.Module, h: torch.Tensor, budget: float) -> int:
    keep = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers(), h]}
    torch.compiler.reset()
    model.block_wrapper = torch.compile(lambda block, x: block(x), backend=compiled.BACKEND)
    seen: dict[int, int] = {}

    @torch._dynamo.disable
    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in keep:
            seen[st.data_ptr()] = st.nbytes()
        return t

    try:
        with functorch_config.patch(activation_memory_budget=budget), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's own deprecation notices while compiling
            model.run_blocks(h).sum().backward()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model.run_blocks(h)
    finally:
        model.block_wrapper = None
        model.zero_grad(set_to_none=True)
        h.grad = None
    return sum(seen.values())


@pytest.mark.parametrize("budget", [1.0, 0.0])
def test_saved_bytes_match_what_save_for_backward_received(setup, budget: float) -> None:
    model, h = setup
    point = compiled.compiled_point(model, h, budget)
    assert point.saved_bytes == _hooked_saved_bytes(model, h, budget) > 0
    assert model.block_wrapper is None and h.grad is None


def test_the_budget_trades_bytes_for_flops_and_zero_is_full_checkpointing(setup) -> None:
    model, h = setup
    curve = [compiled.compiled_point(model, h, b) for b in (1.0, 0.5, 0.0)]
    full = compiled.eager_point(model, h, compiled.full_checkpoint, "full")
    plain = compiled.eager_point(model, h, None, "plain")
    assert [p.budget for p in curve] == [1.0, 0.5, 0.0]
    assert curve[0].saved_bytes >= curve[1].saved_bytes > curve[2].saved_bytes
    assert curve[0].recompute_flops == 0 <= curve[1].recompute_flops <= curve[2].recompute_flops
    assert curve[2].saved_bytes == full.saved_bytes and curve[2].recompute_flops == full.recompute_flops
    assert plain.recompute_flops == 0 and plain.baseline_flops == curve[0].backward_flops


def test_compile_time_warnings_and_log_lines_are_kept_not_printed(capfd) -> None:
    lines: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # as under LESSONS_STRICT=1
        with compiled._caught(lines):
            warnings.warn("old api", DeprecationWarning, stacklevel=1)
            logging.getLogger("torch._higher_order_ops.wrap").warning("context_fn   under\n compile")
    assert lines == ["DeprecationWarning: old api",
                     "log torch._higher_order_ops.wrap: context_fn under compile"]
    assert capfd.readouterr().err == ""


def test_a_selective_policy_compiles_and_its_warning_is_caught(setup, capfd) -> None:
    model, h = setup
    point = compiled.compiled_point(model, h, 1.0, wrapper=compiled.selective(save_matmul_outputs))
    eager = compiled.eager_point(model, h, compiled.selective(save_matmul_outputs), "eager")
    assert 0 < point.saved_bytes <= eager.saved_bytes and point.recompute_flops == eager.recompute_flops
    assert "context_fn" not in capfd.readouterr().err  # torch's log line went into point.warnings


def test_arguments_are_checked(setup) -> None:
    model, h = setup
    with pytest.raises(ValueError, match="budget"):
        compiled.compiled_point(model, h, 1.5)
    with pytest.raises(ValueError, match="no compiled node"):
        compiled.saved_by_compiled(model.run_blocks(h))
    with pytest.raises(ValueError, match="policy"):
        compiled.selective("not a policy")
