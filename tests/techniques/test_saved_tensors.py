"""helpers.techniques.saved_tensors (lesson 02): what autograd keeps per block, against Korthikanti et al."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from helpers.core.data import token_batch
from helpers.core.device import seed_everything
from helpers.core.training import lm_loss
from helpers.measure import formulas
from helpers.measure.memory import saved_activation_bytes
from helpers.models.gpt import GPTBlock, GPTConfig, explainer_model
from helpers.techniques import saved_tensors as st
from helpers.techniques.saved_tensors import origin_group, saved_tensor_bytes

CORE_SHAPE = (2, 64, 16, 4)  # b, s, h, a: long enough that the s^2 terms show

CPU = torch.device("cpu")

B, S, H, A = 2, 16, 16, 2


def _block(**cfg: object) -> GPTBlock:
    seed_everything(0)
    return GPTBlock(GPTConfig(seq_len=S, d_model=H, n_heads=A, **cfg))


def test_korthikanti_16bit_matches_paper() -> None:
    terms = formulas.korthikanti_terms(s=S, b=B, h=H, a=A)
    assert sum(terms.values()) == pytest.approx(S * B * H * (34 + 5 * A * S / H))
    fp32 = formulas.korthikanti_terms(s=S, b=B, h=H, a=A, act_bytes=4, mask_bytes=1)
    assert sum(fp32.values()) == pytest.approx(S * B * H * (66 + 9 * A * S / H))
    no_drop = formulas.korthikanti_terms(s=S, b=B, h=H, a=A, dropout=False)
    assert sum(no_drop.values()) == pytest.approx(S * B * H * (32 + 2 * A * S / H))


@pytest.mark.parametrize("bad", [{"s": 0}, {"h": -1}, {"a": 1.5}, {"act_bytes": 0}])
def test_korthikanti_rejects_bad_sizes(bad: dict) -> None:
    kwargs = {"s": S, "b": B, "h": H, "a": A, **bad}
    with pytest.raises(ValueError):
        formulas.korthikanti_terms(**kwargs)


def test_dropout_mask_bytes_cpu() -> None:
    assert st.dropout_mask_bytes("cpu") == 4.0  # CPU keeps a scaled float mask


def test_saved_table_matches_tracker_and_formula() -> None:
    block = _block(dropout=0.1)
    x = torch.randn(B, S, H)
    rows = st.saved_tensor_table(block, x)
    measured = saved_activation_bytes(lambda: block(x + 0))
    assert sum(r.nbytes for r in rows) == pytest.approx(measured, rel=0.01)
    formula = formulas.korthikanti_terms(s=S, b=B, h=H, a=A, act_bytes=4,
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
    quad = formulas.korthikanti_terms(s=S, b=B, h=H, a=A, act_bytes=4, dropout=False)["softmax output"]
    assert plain - fused == pytest.approx(quad, rel=0.10)


def test_attention_core_policy_matches_korthikanti() -> None:
    b, s, h, a = CORE_SHAPE
    seed_everything(0)
    block = GPTBlock(GPTConfig(seq_len=s, d_model=h, n_heads=a, dropout=0.1))
    x = torch.randn(b, s, h)
    context = functools.partial(create_selective_checkpoint_contexts, st.attention_core_policy(b, a))
    plain = saved_activation_bytes(lambda: block(x + 0))
    core = saved_activation_bytes(lambda: checkpoint(block, x + 0, use_reentrant=False, context_fn=context))
    terms = formulas.korthikanti_terms(s=s, b=b, h=h, a=a, act_bytes=4, mask_bytes=st.dropout_mask_bytes())
    quadratic = sum(terms[t] for t in formulas.QUADRATIC_TERMS)
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
    formula = formulas.korthikanti_terms(s=S, b=B, h=H, a=A, act_bytes=4, mask_bytes=1)
    assert measured == pytest.approx(sum(formula.values()), rel=0.10)


@pytest.mark.cuda
def test_cuda_attention_core_policy_saves_the_quadratic_term() -> None:
    b, s, h, a = CORE_SHAPE
    block = GPTBlock(GPTConfig(seq_len=s, d_model=h, n_heads=a, dropout=0.1)).cuda()
    x = torch.randn(b, s, h, device="cuda")
    context = functools.partial(create_selective_checkpoint_contexts, st.attention_core_policy(b, a))
    plain = saved_activation_bytes(lambda: block(x + 0))
    core = saved_activation_bytes(lambda: checkpoint(block, x + 0, use_reentrant=False, context_fn=context))
    mask = st.dropout_mask_bytes("cuda")
    terms = formulas.korthikanti_terms(s=s, b=b, h=h, a=a, act_bytes=4, mask_bytes=mask)
    assert plain - core == pytest.approx(sum(terms[t] for t in formulas.QUADRATIC_TERMS), rel=0.10)


def test_saved_table_checks_its_arguments() -> None:
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        st.saved_tensor_table(_block(), [[1.0]])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="block must be a torch.nn.Module"):
        st.saved_tensor_table("block", torch.randn(B, S, H))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="act_bytes"):
        formulas.korthikanti_terms(s=S, b=B, h=H, a=A, act_bytes="4")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="s must be a positive int"):
        formulas.korthikanti_terms(s=True, b=B, h=H, a=A)


def test_saved_table_rows_come_in_forward_order() -> None:
    rows = st.saved_tensor_table(_block(dropout=0.0), torch.randn(B, S, H))
    modules = [r.module for r in rows if r.module != "(block)"]
    assert modules.index("ln1") < modules.index("attn.qkv") < modules.index("ln2") < modules.index("fc_out")
    assert all(r.op and r.field for r in rows)


def test_dropout_mask_bytes_leaves_the_global_rng_alone() -> None:
    state = torch.random.get_rng_state()
    st.dropout_mask_bytes("cpu")
    assert torch.equal(torch.random.get_rng_state(), state)


# --- hand-counted tables (issue 16). S2 != H and S2 != head_dim, so a mix-up of s with h or
# head_dim would show. Per token: sbh = 2*12*16 floats = 1536 bytes; per head pair: as^2b = 576
# floats = 2304 bytes; CPU keeps dropout masks as 4-byte floats.
S2 = 12
SBH, AS2B = B * S2 * H * 4, A * S2 * S2 * B * 4
FORMULA_ROWS = {"LayerNorm inputs": 2 * SBH, "QKV input": SBH, "Q, K": 2 * SBH, "V": SBH,
                "MLP input": SBH, "GELU input": 4 * SBH, "fc_out input (GELU output)": 4 * SBH,
                "not in the formula: LN mean/rstd": 2 * 2 * B * S2 * 4}  # mean and rstd of 2 LayerNorms
DROPOUT_ROWS = {"softmax output": AS2B, "attention dropout mask": AS2B, "attention dropout output": AS2B,
                "projection input": SBH, "projection dropout mask": SBH, "MLP dropout mask": SBH}


def _table(**cfg: object) -> tuple[GPTBlock, list[st.SavedTensor]]:
    seed_everything(0)
    block = GPTBlock(GPTConfig(seq_len=S2, d_model=H, n_heads=A, **cfg))
    return block, st.saved_tensor_table(block, torch.randn(B, S2, H))


def test_table_by_term_is_the_hand_count() -> None:
    block, rows = _table(dropout=0.1)
    # and the attention's 1/sqrt(head_dim) scale, kept by its Mul as one float64
    assert st.bytes_by_term(rows) == {**FORMULA_ROWS, **DROPOUT_ROWS, "not in the formula: other": 8}
    assert {r.dtype for r in rows} == {"float32", "float64"}
    names = {name or "(block)" for name, _ in block.named_modules()}
    assert {r.module for r in rows} <= names
    assert [r.module for r in rows if r.op == "Gelu"] == ["(block)"]  # F.gelu runs in the block itself
    assert {r.field for r in rows if r.module.endswith("qkv")} == {"mat1"}  # AddmmBackward0's input


def test_fused_attention_falling_back_to_math_is_labelled_by_term() -> None:
    # CPU's fused attention has no dropout kernel: it runs the math path inside `attn` (SafeSoftmax,
    # a Mul by the mask), with no attn_drop module to name the mask.
    _, rows = _table(dropout=0.1, fused_attention=True)
    assert st.bytes_by_term(rows) == {**FORMULA_ROWS, **DROPOUT_ROWS}
    assert {r.op for r in rows if r.term == "softmax output"} == {"SafeSoftmax"}


def test_fused_kernel_rows_are_labelled_by_field() -> None:
    _, rows = _table(dropout=0.0, fused_attention=True)
    fused = {r.field: r.term for r in rows if "Attention" in r.op}
    assert fused == {"query": "Q, K", "key": "Q, K", "value": "V",
                     "output": "not in the formula: fused-kernel output/logsumexp",
                     "logsumexp": "not in the formula: fused-kernel output/logsumexp"}
    # the kernel keeps its output (= the projection input, b*s*h floats) and a logsumexp per row
    # (b*a*s floats) instead of the softmax output; zero-byte rows share memory with earlier ones
    expected = {**FORMULA_ROWS, "not in the formula: fused-kernel output/logsumexp": SBH + B * A * S2 * 4}
    assert {t: n for t, n in st.bytes_by_term(rows).items() if n} == expected


def test_table_of_a_custom_block_names_op_and_fields() -> None:
    class Power(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x**x  # PowBackward1 keeps self, exponent (the same tensor) and result

    rows = st.saved_tensor_table(Power(), torch.rand(1, 2, 3, requires_grad=True))
    assert {r.op for r in rows} == {"Pow"}
    assert sorted(r.field for r in rows) == ["exponent", "result", "self"]
    assert sum(r.nbytes for r in rows) == 2 * 6 * 4  # the input's copy and the result, 6 floats each
    assert {r.module for r in rows} == {"(block)"}


def test_saved_table_leaves_no_hooks_behind() -> None:
    block = _block(dropout=0.1)
    st.saved_tensor_table(block, torch.randn(B, S, H))
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in block.modules())


def test_saved_tensor_rows_are_frozen() -> None:
    row = st.saved_tensor_table(_block(), torch.randn(B, S, H))[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.nbytes = 0  # type: ignore[misc]


@pytest.mark.parametrize("name", ["s", "b", "h", "a"])
def test_korthikanti_names_the_bad_size(name: str) -> None:
    kwargs = {"s": S, "b": B, "h": H, "a": A, name: 0}
    with pytest.raises(ValueError, match=f"^{name} must be a positive int"):
        formulas.korthikanti_terms(**kwargs)


def test_save_matmul_outputs_keeps_the_four_linear_outputs() -> None:
    # A full checkpoint keeps only its input (h floats per token); the policy adds the outputs of
    # qkv (3h), proj (h), fc (4h) and fc_out (h): 10h floats per token in all.
    block = _block(dropout=0.0)
    x = torch.randn(B, S, H)
    context = functools.partial(create_selective_checkpoint_contexts, st.save_matmul_outputs)
    kept = saved_activation_bytes(lambda: checkpoint(block, x + 0, use_reentrant=False, context_fn=context))
    assert kept == 10 * B * S * H * 4
    checkpoint(block, x + 0, use_reentrant=False, context_fn=context).square().sum().backward()
    got = [p.grad.clone() for p in block.parameters()]
    block.zero_grad(set_to_none=True)
    block(x + 0).square().sum().backward()
    for g, p in zip(got, block.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad)


def test_attention_core_policy_with_one_sequence() -> None:
    # batch 1 is allowed; with CPU's 4-byte masks the saving is exactly the 3 quadratic terms
    b, s, h, a = 1, 8, 8, 2
    seed_everything(0)
    block = GPTBlock(GPTConfig(seq_len=s, d_model=h, n_heads=a, dropout=0.1))
    x = torch.randn(b, s, h)
    context = functools.partial(create_selective_checkpoint_contexts, st.attention_core_policy(b, a))
    plain = saved_activation_bytes(lambda: block(x + 0))
    core = saved_activation_bytes(lambda: checkpoint(block, x + 0, use_reentrant=False, context_fn=context))
    assert plain - core == 3 * a * s * s * b * 4


def test_attention_core_policy_decides_by_layout() -> None:
    b, a, s, d = 1, 2, 5, 3
    policy = st.attention_core_policy(b, a)
    aten, P = torch.ops.aten, CheckpointPolicy
    assert policy(None, aten._softmax.default, torch.empty(b, a, s, s), -1, False) is P.MUST_RECOMPUTE
    qk = torch.empty(b * a, s, d), torch.empty(b * a, d, s)
    assert policy(None, aten.bmm.default, *qk) is P.MUST_RECOMPUTE
    # (b, s, heads, head_dim) before the transpose into heads is 4-D but not per head: saved
    assert policy(None, aten.transpose.int, torch.empty(b, s, a, d), 1, 2) is P.MUST_SAVE
    linear = torch.empty(6), torch.empty(s, 6), torch.empty(6, 6)
    assert policy(None, aten.addmm.default, *linear) is P.MUST_SAVE
    assert policy(None, aten.native_dropout.default, torch.empty(b, s, 6), 0.1, True) is P.PREFER_RECOMPUTE
    assert policy(None, aten.add_.Tensor, torch.empty(b, s, 6), torch.empty(b, s, 6)) is P.PREFER_RECOMPUTE


@pytest.mark.cuda
def test_cuda_dropout_mask_bytes_leaves_the_cuda_rng_alone() -> None:
    state = torch.cuda.get_rng_state()
    st.dropout_mask_bytes("cuda")
    assert torch.equal(torch.cuda.get_rng_state(), state)


@pytest.mark.cuda
def test_cuda_math_attention_mask_is_labelled() -> None:
    # fused attention forced onto the math path: CUDA's dropout there is native_dropout (bool mask)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    seed_everything(0)
    block = GPTBlock(GPTConfig(seq_len=S, d_model=H, n_heads=A, dropout=0.1, fused_attention=True)).cuda()
    with sdpa_kernel(SDPBackend.MATH):
        rows = st.saved_tensor_table(block, torch.randn(B, S, H, device="cuda"))
    assert st.bytes_by_term(rows)["attention dropout mask"] == A * S * S * B  # 1 byte per element


def test_saved_tensor_bytes_by_op_and_dtype() -> None:
    model = explainer_model("tiny", CPU)
    idx, targets = token_batch(2, model.cfg.seq_len, model.cfg.vocab_size)

    def forward() -> torch.Tensor:
        return lm_loss(model(idx), targets)

    fp32 = saved_tensor_bytes(forward, model)
    assert sum(fp32.values()) == saved_activation_bytes(forward)  # the live tracker agrees
    assert {dtype for _, dtype in fp32} <= {"float32", "int64"}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = saved_tensor_bytes(forward, model)

    def group(table: dict[tuple[str, str], int], name: str, dtype: str | None = None) -> int:
        return sum(n for (op, dt), n in table.items() if origin_group(op) == name and dtype in (None, dt))

    assert group(bf16, "matmul outputs") == group(fp32, "matmul outputs") // 2
    assert group(bf16, "loss (log-softmax)", "float32") == group(fp32, "loss (log-softmax)") > 0
    assert group(bf16, "autocast casts", "bfloat16") > 0 == group(fp32, "autocast casts")
    assert origin_group("addmm") == "matmul outputs" and origin_group("weird_op") == "weird_op"
    with pytest.raises(TypeError, match="callable"):
        saved_tensor_bytes(42, model)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="requires grad"):
        saved_tensor_bytes(lambda: torch.ones(2), model)


# -- Killing tests for the mutation run (new survivors) ---------------------------------------------------


def _one_weight() -> tuple[torch.nn.Module, torch.nn.Parameter]:
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.arange(1.0, 5.0))
    return model, model.w


def test_saved_table_leaves_out_an_empty_saved_tensor() -> None:
    """An empty (0x4) tensor made in the call and saved by `mul` holds no storage: no row at all.
    The parameter `mul` saves existed before the call, so the table is empty."""
    model, w = _one_weight()

    def forward() -> torch.Tensor:
        empty = torch.zeros(0, 4) * 2
        return (empty * w).sum() + (w * 3).sum()

    assert saved_tensor_bytes(forward, model) == {}


def test_a_graph_built_while_counting_still_backpropagates() -> None:
    """The hook hands saved tensors back unchanged: a loss the forward kept still backpropagates to the
    hand-derived gradient (d/dw sum(exp(w * w)) = 2w exp(w * w)); its row is exp's 16-byte output."""
    model, w = _one_weight()
    kept: list[torch.Tensor] = []

    def forward() -> torch.Tensor:
        kept.append((w * w).exp().sum())
        return kept[-1]

    table = saved_tensor_bytes(forward, model)
    assert table == {("exp", "float32"): 16}  # exp saves its output; w itself is left out
    kept[0].backward()
    assert torch.allclose(w.grad, 2 * w.detach() * (w.detach() ** 2).exp())
