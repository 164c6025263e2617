"""helpers.saved_tensors (lesson 02): what autograd keeps for a block, against Korthikanti et al."""

from __future__ import annotations

import functools

import pytest
import torch
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

from helpers import saved_tensors as st
from helpers.checkpointing import selective_shape
from helpers.device import seed_everything
from helpers.memory import saved_activation_bytes
from helpers.models import GPTBlock, GPTConfig

B, S, H, A = 2, 16, 16, 2


def _block(**cfg: object) -> GPTBlock:
    seed_everything(0)
    return GPTBlock(GPTConfig(seq_len=S, d_model=H, n_heads=A, **cfg))


def test_korthikanti_16bit_matches_paper() -> None:
    terms = st.korthikanti_terms(s=S, b=B, h=H, a=A)
    assert sum(terms.values()) == pytest.approx(S * B * H * (34 + 5 * A * S / H))
    fp32 = st.korthikanti_terms(s=S, b=B, h=H, a=A, act_bytes=4, mask_bytes=1)
    assert sum(fp32.values()) == pytest.approx(S * B * H * (66 + 9 * A * S / H))
    no_drop = st.korthikanti_terms(s=S, b=B, h=H, a=A, dropout=False)
    assert sum(no_drop.values()) == pytest.approx(S * B * H * (32 + 2 * A * S / H))


@pytest.mark.parametrize("bad", [{"s": 0}, {"h": -1}, {"a": 1.5}, {"act_bytes": 0}])
def test_korthikanti_rejects_bad_sizes(bad: dict) -> None:
    kwargs = {"s": S, "b": B, "h": H, "a": A, **bad}
    with pytest.raises(ValueError):
        st.korthikanti_terms(**kwargs)


def test_dropout_mask_bytes_cpu() -> None:
    assert st.dropout_mask_bytes("cpu") == 4.0  # CPU keeps a scaled float mask


def test_saved_table_matches_tracker_and_formula() -> None:
    block = _block(dropout=0.1)
    x = torch.randn(B, S, H)
    rows = st.saved_tensor_table(block, x)
    measured = saved_activation_bytes(lambda: block(x + 0))
    assert sum(r.nbytes for r in rows) == pytest.approx(measured, rel=0.01)
    formula = st.korthikanti_terms(s=S, b=B, h=H, a=A, act_bytes=4,
                                     mask_bytes=st.dropout_mask_bytes())
    assert measured == pytest.approx(sum(formula.values()), rel=0.10)
    by_term = st.bytes_by_term(rows)
    for term, nbytes in formula.items():
        assert by_term[term] == pytest.approx(nbytes), term


def test_storage_saved_by_two_ops_counts_once() -> None:
    # Without dropout the softmax output is saved by Softmax and again by the Bmm with V:
    # one storage, so the table must not count it twice.
    block = _block(dropout=0.0)
    x = torch.randn(B, S, H)
    rows = st.saved_tensor_table(block, x)
    measured = saved_activation_bytes(lambda: block(x + 0))
    assert sum(r.nbytes for r in rows) == pytest.approx(measured, rel=0.01)
    zero = [r for r in rows if r.nbytes == 0]
    assert len(zero) == 1, zero
    assert zero[0].op == "Bmm" and zero[0].shape == (B * A, S, S)
    assert st.bytes_by_term(rows)["softmax output"] == 4096  # a*s*s*b fp32: 2*16*16*2*4 bytes


def test_saved_table_rejects_2d_input() -> None:
    with pytest.raises(ValueError, match="batch, seq, hidden"):
        st.saved_tensor_table(_block(), torch.randn(S, H))


def test_fused_attention_removes_quadratic_term() -> None:
    x = torch.randn(B, S, H)
    plain_block = _block(dropout=0.0)
    plain = saved_activation_bytes(lambda: plain_block(x + 0))
    fused_block = _block(dropout=0.0, fused_attention=True)
    fused = saved_activation_bytes(lambda: fused_block(x + 0))
    quad = st.korthikanti_terms(s=S, b=B, h=H, a=A, act_bytes=4, dropout=False)["softmax output"]
    assert plain - fused == pytest.approx(quad, rel=0.10)


def test_attention_core_policy_matches_korthikanti() -> None:
    b, s, h, a = selective_shape("tiny")
    seed_everything(0)
    block = GPTBlock(GPTConfig(seq_len=s, d_model=h, n_heads=a, dropout=0.1))
    x = torch.randn(b, s, h)
    context = functools.partial(create_selective_checkpoint_contexts, st.attention_core_policy(b, a))
    plain = saved_activation_bytes(lambda: block(x + 0))
    core = saved_activation_bytes(lambda: checkpoint(block, x + 0, use_reentrant=False, context_fn=context))
    terms = st.korthikanti_terms(s=s, b=b, h=h, a=a, act_bytes=4, mask_bytes=st.dropout_mask_bytes())
    quadratic = sum(terms[t] for t in st.QUADRATIC_TERMS)
    # proj/fc_out outputs kept (2sbh floats), residual masks redrawn (2sbh masks of 4 bytes on CPU)
    assert plain - core == quadratic - 2 * s * b * h * 4 + 2 * s * b * h * st.dropout_mask_bytes()
    assert plain - core == pytest.approx(quadratic, rel=0.10)
    grads = {}
    forwards = {"plain": lambda: block(x + 0),
                "core": lambda: checkpoint(block, x + 0, use_reentrant=False, context_fn=context)}
    for name, fwd in forwards.items():
        seed_everything(3)
        fwd().square().sum().backward()
        grads[name] = torch.cat([p.grad.flatten() for p in block.parameters()])
        block.zero_grad(set_to_none=True)
    torch.testing.assert_close(grads["core"], grads["plain"])


@pytest.mark.parametrize("bad, error", [((0, 2), ValueError), ((2, 1), ValueError), ((True, 2), TypeError),
                                        ((2, 2.0), TypeError)])
def test_attention_core_policy_arguments(bad: tuple, error: type) -> None:
    with pytest.raises(error):
        st.attention_core_policy(*bad)


@pytest.mark.cuda
def test_cuda_block_matches_formula_with_bool_masks() -> None:
    assert st.dropout_mask_bytes("cuda") == 1.0  # CUDA keeps a bool mask
    block = _block(dropout=0.1).cuda()
    x = torch.randn(B, S, H, device="cuda")
    measured = saved_activation_bytes(lambda: block(x + 0))
    formula = st.korthikanti_terms(s=S, b=B, h=H, a=A, act_bytes=4, mask_bytes=1)
    assert measured == pytest.approx(sum(formula.values()), rel=0.10)


@pytest.mark.cuda
def test_cuda_attention_core_policy_saves_the_quadratic_term() -> None:
    b, s, h, a = selective_shape("tiny")
    block = GPTBlock(GPTConfig(seq_len=s, d_model=h, n_heads=a, dropout=0.1)).cuda()
    x = torch.randn(b, s, h, device="cuda")
    context = functools.partial(create_selective_checkpoint_contexts, st.attention_core_policy(b, a))
    plain = saved_activation_bytes(lambda: block(x + 0))
    core = saved_activation_bytes(lambda: checkpoint(block, x + 0, use_reentrant=False, context_fn=context))
    mask = st.dropout_mask_bytes("cuda")
    terms = st.korthikanti_terms(s=s, b=b, h=h, a=a, act_bytes=4, mask_bytes=mask)
    assert plain - core == pytest.approx(sum(terms[t] for t in st.QUADRATIC_TERMS), rel=0.10)


def test_saved_table_checks_its_arguments() -> None:
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        st.saved_tensor_table(_block(), [[1.0]])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="block must be a torch.nn.Module"):
        st.saved_tensor_table("block", torch.randn(B, S, H))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="act_bytes"):
        st.korthikanti_terms(s=S, b=B, h=H, a=A, act_bytes="4")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="s must be a positive int"):
        st.korthikanti_terms(s=True, b=B, h=H, a=A)


def test_saved_table_rows_come_in_forward_order() -> None:
    rows = st.saved_tensor_table(_block(dropout=0.0), torch.randn(B, S, H))
    modules = [r.module for r in rows if r.module != "(block)"]
    assert modules.index("ln1") < modules.index("attn.qkv") < modules.index("ln2") < modules.index("fc_out")
    assert all(r.op and r.field for r in rows)


def test_dropout_mask_bytes_leaves_the_global_rng_alone() -> None:
    state = torch.random.get_rng_state()
    st.dropout_mask_bytes("cpu")
    assert torch.equal(torch.random.get_rng_state(), state)
