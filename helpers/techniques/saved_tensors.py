"""What autograd keeps for one transformer block, and Korthikanti et al.'s formula for it (lesson 02).

- `saved_tensor_table`: every tensor the backward graph of one module holds,
  op by op, with the submodule that saved it and the formula term it belongs to.
- `korthikanti_terms`: sbh(34 + 5as/h) term by term, adapted to the bytes per
  element of activations and of dropout masks.
- `dropout_mask_bytes`: how many bytes per element this device's dropout keeps.
- `attention_core_policy`: Korthikanti et al.'s *selective recomputation* as a
  selective-checkpoint policy: recompute the attention core, save the rest.
- `save_matmul_outputs`: a cruder policy (keep Linear outputs, recompute all else).

Lesson 02 reaches these through `helpers.techniques.checkpointing`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_flatten
from torch.utils.checkpoint import CheckpointPolicy

from helpers.core.validate import callable_arg, instance_arg, int_at_least, tensor_arg
from helpers.measure.dispatch import OpObserver
from helpers.measure.memory import saved_activation_bytes

__all__ = [
    "Policy", "SavedTensor", "attention_core_policy", "bytes_by_term", "dropout_mask_bytes", "origin_group",
    "save_matmul_outputs", "saved_tensor_bytes", "saved_tensor_table",
]


def dropout_mask_bytes(device: torch.device | str = "cpu") -> float:
    """Measured bytes per element that a training-mode dropout keeps for backward.

    A bool mask (1 byte) on CUDA; on CPU torch keeps a scaled float mask, as
    many bytes as the activation itself. The mask's random draw happens inside
    `fork_rng`, so the caller's random stream is left as it was.

    Args:
        device: where to measure.

    Returns:
        The bytes per element.
    """
    device = torch.device(device)
    x = torch.ones(4096, device=device, requires_grad=True)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        return saved_activation_bytes(lambda: F.dropout(x, 0.5, training=True)) / x.numel()


@dataclass(frozen=True)
class SavedTensor:
    """One tensor autograd saved for backward."""

    module: str  # the submodule whose forward was running when it was saved
    op: str  # the backward node that keeps it, e.g. "Addmm"
    field: str  # which of the node's inputs/outputs it is, e.g. "mat1"
    shape: tuple[int, ...]
    dtype: str
    nbytes: int  # 0 when the same memory was already counted in an earlier row
    term: str  # Korthikanti term (or "not in the formula: ...")


def _term(module: str, op: str, field: str, tensor: torch.Tensor,
          siblings: Sequence[torch.Tensor], s: int) -> str:
    leaf = module.rsplit(".", 1)[-1]
    square = tensor.dim() >= 2 and tuple(tensor.shape[-2:]) == (s, s)
    if leaf in ("ln1", "ln2"):
        return "LayerNorm inputs" if tensor.shape[-1] != 1 else "not in the formula: LN mean/rstd"
    named = {"qkv": "QKV input", "proj": "projection input", "fc": "MLP input",
             "fc_out": "fc_out input (GELU output)", "attn_drop": "attention dropout mask",
             "resid_drop": "projection dropout mask", "mlp_drop": "MLP dropout mask"}
    if leaf in named:
        return named[leaf]
    if square and (op.startswith("Mul") or op.startswith("NativeDropout")):
        return "attention dropout mask"  # fused attention falling back to the math path
    if op.startswith("Softmax") or op.startswith("SafeSoftmax"):
        return "softmax output"
    if op.startswith("Gelu"):
        return "GELU input"
    if op.startswith("Bmm"):
        if square:
            return "attention dropout output"
        return "V" if any(tuple(t.shape[-2:]) == (s, s) for t in siblings) else "Q, K"
    if "Attention" in op:  # fused scaled_dot_product_attention
        return {"query": "Q, K", "key": "Q, K", "value": "V"}.get(
            field, "not in the formula: fused-kernel output/logsumexp")
    return "not in the formula: other"


def _forward_noting_modules(block: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, dict[tuple, str]]:
    """Run `block` on a copy of `x`; map each saved tensor (storage, offset, numel) to the
    name of the submodule whose forward was running when autograd saved it."""
    names = {m: n for n, m in block.named_modules()}
    stack: list[str] = []
    where: dict[tuple, str] = {}

    def enter(module: nn.Module, _: object) -> None:
        stack.append(names[module])

    def leave(*_: object) -> None:
        stack.pop()

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())
        where.setdefault(key, stack[-1] if stack else "")
        return t

    hooks = [m.register_forward_pre_hook(enter) for m in names]
    hooks += [m.register_forward_hook(leave) for m in names]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = block(x.detach().clone().requires_grad_(x.requires_grad))
    finally:
        for hook in hooks:
            hook.remove()
    return out, where


def _saved_by_node(out: torch.Tensor) -> list[tuple[str, list[tuple[str, torch.Tensor]]]]:
    """(op, [(field, tensor), ...]) for every backward node behind `out`, in forward order.

    The one place that reads autograd's private attributes: `node._saved_<field>`
    (what the node keeps for backward) and `node._sequence_nr()` (the order the
    nodes were made in). The op is the node's class name without "Backward0/1".
    """
    nodes, todo, seen = [], [out.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        nodes.append(node)
        todo.extend(n for n, _ in node.next_functions)
    nodes.sort(key=lambda n: n._sequence_nr())
    result = []
    for node in nodes:
        op = type(node).__name__.removesuffix("Backward0").removesuffix("Backward1")
        fields = [(f.removeprefix("_saved_"), getattr(node, f)) for f in dir(node) if f.startswith("_saved_")]
        result.append((op, [(f, t) for f, t in fields if isinstance(t, torch.Tensor)]))
    return result


def saved_tensor_table(block: nn.Module, x: torch.Tensor) -> list[SavedTensor]:
    """Run `block(x)` once in training mode and list every tensor autograd saved.

    The input is copied inside the region, so the block's own input counts (in a
    stack it is the previous block's output). Parameters and buffers are not
    activations and are left out.

    Args:
        block: the module, e.g. a `helpers.models.gpt.GPTBlock`.
        x: its input, (batch, seq, hidden).

    Returns:
        `SavedTensor` rows in forward order; a tensor that shares memory with an earlier
        row gets `nbytes=0`. `term` maps each row to Korthikanti et al.'s terms for a `GPTBlock`.

    Raises:
        ValueError: if `x` is not 3-D.
    """
    instance_arg("block", block, nn.Module, "torch.nn.Module")
    tensor_arg("x", x)
    if x.dim() != 3:
        raise ValueError(f"x must be (batch, seq, hidden), got shape {tuple(x.shape)}")
    state = {t.untyped_storage().data_ptr() for t in [*block.parameters(), *block.buffers()]}
    out, where = _forward_noting_modules(block, x)
    rows, counted = [], set()
    for op, tensors in _saved_by_node(out):
        for field, t in tensors:
            ptr = t.untyped_storage().data_ptr()
            if ptr in state or t.numel() == 0:
                continue
            key = (ptr, t.storage_offset(), t.numel())
            module = where.get(key, "")
            nbytes = 0 if key in counted else t.numel() * t.element_size()
            counted.add(key)
            term = _term(module, op, field, t, [u for _, u in tensors], x.shape[1])
            rows.append(SavedTensor(module or "(block)", op, field, tuple(t.shape), str(t.dtype)[6:],
                                    nbytes, term))
    return rows


def bytes_by_term(rows: Sequence[SavedTensor]) -> dict[str, int]:
    """Sum the rows of `saved_tensor_table` per Korthikanti term.

    Args:
        rows: the table's rows.

    Returns:
        {term: bytes}.
    """
    out: dict[str, int] = {}
    for row in rows:
        out[row.term] = out.get(row.term, 0) + row.nbytes
    return out


# ---------------------------------------------------------------------------
# Selective-checkpoint policies
# ---------------------------------------------------------------------------

Policy = Callable[..., CheckpointPolicy]
_LINEAR_MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
# Redone on recompute at no FLOP cost: applying a dropout mask (CPU: mul; CUDA: the fused
# native_dropout) and making the mask (CPU: empty_like().bernoulli_().div_()), whose random draw
# the restored RNG state repeats. In-place ops cannot be cached at all: autograd bumps the
# tensor's version after the policy's mode has cached it, and the checkpoint then refuses it.
_FREE_TO_REDO = (torch.ops.aten.mul.Tensor, torch.ops.aten.native_dropout.default,
                 torch.ops.aten.empty_like.default)


def save_matmul_outputs(ctx: object, op: object, *args: object, **kwargs: object) -> CheckpointPolicy:
    """Policy: keep the outputs of the Linear matmuls (`mm`, `addmm`), recompute everything else.

    "Everything else" is LayerNorm, GELU, every dropout and the whole attention
    core. It is *not* Korthikanti et al.'s scheme, which keeps LayerNorm, GELU
    and the residual dropouts and recomputes only the attention core
    (`attention_core_policy`).

    Args:
        ctx: the selective-checkpoint context (unused).
        op: the op about to run.
        *args, **kwargs: its arguments (unused).

    Returns:
        `MUST_SAVE` for a Linear matmul, else `PREFER_RECOMPUTE`.
    """
    return CheckpointPolicy.MUST_SAVE if op in _LINEAR_MATMULS else CheckpointPolicy.PREFER_RECOMPUTE


def attention_core_policy(batch: int, n_heads: int) -> Policy:
    """Korthikanti et al.'s selective recomputation for a `helpers.models.gpt.GPTBlock`.

    The returned policy recomputes the attention core: Q K^T, the scaling and
    causal mask, softmax, the softmax dropout and the product with V. Those are
    exactly the ops on the per-head tensors, shaped (batch, n_heads, ., .) or,
    inside the batched matmuls, (batch * n_heads, ., .). Every other op is saved,
    except the residual dropouts, which cost no FLOPs to redo: their masks are
    redrawn from the restored RNG state (`preserve_rng_state=True`, the default)
    and applied again.

    Two honest differences from the formula's 34sbh (16-bit) that stay: a
    selective checkpoint keeps the *outputs* of the ops it saves, and the outputs
    of `attn.proj` and `fc_out` feed only a dropout, whose backward needs just
    the mask, so plain autograd drops them and this policy keeps them (2sbh
    activation elements); and the two residual dropout masks are redrawn, not
    kept (2sbh mask elements).

    Args:
        batch: the micro-batch the block runs on.
        n_heads: its heads (>= 2); the sequence length must differ from it (else the
            two layouts look alike).

    Returns:
        The policy, for `create_selective_checkpoint_contexts`.
    """
    int_at_least("batch", batch, 1)
    int_at_least("n_heads", n_heads, 2)  # one head would make (batch * heads, s, .) look like (batch, s, h)
    rows = batch * n_heads

    def per_head(t: object) -> bool:
        if not isinstance(t, torch.Tensor):
            return False
        return (t.dim() == 4 and tuple(t.shape[:2]) == (batch, n_heads)) or (
            t.dim() == 3 and t.shape[0] == rows)

    def policy(ctx: object, op: object, *args: object, **kwargs: object) -> CheckpointPolicy:
        if op is torch.ops.aten.bmm.default or any(per_head(t) for t in args):
            return CheckpointPolicy.MUST_RECOMPUTE
        if op in _FREE_TO_REDO or getattr(getattr(op, "_schema", None), "is_mutable", False):
            return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE

    return policy


class _Origins(OpObserver):
    """Remember, for every storage an op allocates, the op's name (the last op to allocate there)."""

    def __init__(self) -> None:
        super().__init__()
        self.origin: dict[int, str] = {}

    def observe(self, func, args, kwargs, out) -> None:  # noqa: ANN001
        """Name the op as the origin of each storage it newly allocated."""
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                ptr = t.untyped_storage().data_ptr()
                if ptr not in inputs:  # a new allocation, not a view or an in-place result
                    self.origin[ptr] = func.overloadpacket.__name__


def saved_tensor_bytes(forward: Callable[[], torch.Tensor], model: nn.Module) -> dict[tuple[str, str], int]:
    """Bytes autograd saves during `forward()`, by (op that allocated it, dtype).

    Runs `forward` once under a saved-tensor hook and counts each saved storage once.
    Tensors that existed before the call (the model's parameters and buffers, the input
    batch) are not activations and are left out. Ops are aten names: `addmm` (a Linear),
    `_to_copy` (a dtype cast, e.g. autocast's), `native_layer_norm`, `_softmax`, ...
    Call it inside `torch.autocast(...)` to see what autocast keeps.

    Args:
        forward: a zero-argument callable returning a tensor that requires grad.
        model: the model it runs.

    Returns:
        {(op, dtype): bytes}.

    Raises:
        ValueError: if `forward` returns no tensor that requires grad.
    """
    callable_arg("forward", forward, "a zero-argument callable")
    instance_arg("model", model, nn.Module, "torch.nn.Module")
    saved: dict[int, torch.Tensor] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.setdefault(t.untyped_storage().data_ptr(), t)
        return t

    origins = _Origins()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), origins:
        out = forward()
    if not isinstance(out, torch.Tensor) or not out.requires_grad:
        raise ValueError("forward must return a tensor that requires grad (a training-mode forward)")
    table: dict[tuple[str, str], int] = {}
    for ptr, t in saved.items():
        op = origins.origin.get(ptr)
        if op is None or ptr == 0:  # made before the call (parameters, buffers, the batch), or empty
            continue
        key = (op, str(t.dtype).removeprefix("torch."))
        table[key] = table.get(key, 0) + t.untyped_storage().nbytes()
    return table


_GROUPS = {
    "addmm": "matmul outputs", "mm": "matmul outputs", "bmm": "matmul outputs",
    "baddbmm": "matmul outputs", "linear": "matmul outputs", "matmul": "matmul outputs",
    "_to_copy": "autocast casts", "native_layer_norm": "LayerNorm outputs and stats",
    "_softmax": "attention softmax", "_log_softmax": "loss (log-softmax)",
    "nll_loss_forward": "loss (log-softmax)", "add": "residual stream (block inputs)",
    "gelu": "GELU outputs", "clone": "q, k, v copies (attention reshapes)",
    "arange": "positions (token indices)",
}


def origin_group(op: str) -> str:
    """A learner's name for the aten op that allocated a saved tensor.

    Args:
        op: the aten op's name, e.g. "addmm".

    Returns:
        Its group, e.g. "matmul outputs" (the op's own name when it has none).
    """
    return _GROUPS.get(op, op)
