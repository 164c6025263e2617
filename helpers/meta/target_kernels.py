"""The target device's side of a meta profile (lesson 09): attention kernel choice and autocast's rule.

On the meta device `F.scaled_dot_product_attention` would always take the math path, and
`torch.autocast` does nothing. `helpers.meta_profile.Profiler` models the device it plans for
("cpu" or "cuda") with two function modes from here:

- `_TargetKernels`: answers `aten._fused_sdp_choice` as the target would (`cuda_kernel` for
  CUDA's order, `_cpu_kernel` by asking the real CPU with tiny tensors) and runs the fused
  kernels' shapes, which keep the output and a log-sum-exp per row, never S x S.
- `_AutocastRule`: autocast's per-op dtype rule for `precision="bf16"` (matmuls, linear layers,
  convolutions and attention in bf16 on cast copies, losses and, for CUDA, normalisations,
  softmax and transcendental ops in fp32, the rest in their inputs' dtype).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch.autograd.graph import _engine_run_backward
from torch.overrides import TorchFunctionMode

__all__ = ["DEFAULT_CAPABILITY", "GPUS", "KERNEL_NAMES", "cuda_kernel"]


# ---------------------------------------------------------------------------
# The target device: attention kernel and autocast's dtype rule
# ---------------------------------------------------------------------------

_MATH, _FLASH, _EFFICIENT = 0, 1, 2  # torch.nn.attention.SDPBackend values
KERNEL_NAMES = {_MATH: "math", _FLASH: "flash", _EFFICIENT: "memory-efficient"}


@functools.lru_cache(maxsize=256)
def _cpu_kernel(
    dtype: torch.dtype, head_dim: int, mask: torch.dtype | None, dropout: bool, causal: bool, gqa: bool
) -> int:
    """Which SDPA kernel the real CPU picks for these settings (asked with tiny tensors)."""
    q = torch.zeros(1, 2, 4, head_dim, dtype=dtype)
    kv = torch.zeros(1, 1 if gqa else 2, 4, head_dim, dtype=dtype)
    m = None if mask is None else torch.zeros(4, 4, dtype=mask)
    kwargs = {"enable_gqa": True} if gqa else {}
    return int(
        torch._fused_sdp_choice(
            q,
            kv,
            kv,
            attn_mask=m,
            dropout_p=0.1 if dropout else 0.0,
            is_causal=causal and m is None,
            **kwargs,
        )
    )


# Compute capability (major * 10 + minor) of the cards `--gpu` names.
GPUS = {"T4": 75, "A10": 86, "A10G": 86, "L4": 89, "A100": 80, "H100": 90, "H200": 90}
DEFAULT_CAPABILITY = 80


def cuda_kernel(dtype: torch.dtype, head_dim: int, has_mask: bool, *, gqa: bool = False,
                capability: int = DEFAULT_CAPABILITY) -> int:
    """The SDPA kernel a CUDA target is assumed to run (PyTorch's CUDA preference order).

    Flash attention (sm80 and later: none on a T4, sm75) for fp16/bf16 inputs without an
    explicit mask and head_dim <= 256 (a multiple of 8); otherwise the memory-efficient
    kernel (fp32 too) when head_dim is a multiple of 4 (8 in half precision); otherwise the
    math path. With `gqa` (fewer key/value heads, passed with `enable_gqa=True`, which
    Transformers does only without a mask) only flash takes it: the memory-efficient kernel
    does not, and SDPA falls back to math, which expands K and V itself.
    """
    half = dtype in (torch.float16, torch.bfloat16)
    if half and not has_mask and head_dim <= 256 and head_dim % 8 == 0 and capability >= 80:
        return _FLASH
    if gqa:
        return _MATH
    if head_dim % (8 if half else 4) == 0:
        return _EFFICIENT
    return _MATH


class _TargetKernels:
    """Route `F.scaled_dot_product_attention` on meta tensors to the target's kernel.

    SDPA picks its kernel in C++ from the tensors' device; for meta tensors that is the
    math path. While active, `torch.nn.functional.scaled_dot_product_attention` (which
    `nn.MultiheadAttention` and most model code call through the module attribute) is
    replaced by a function that runs, on meta, the kernel the target would choose,
    and remembers which kernels ran. Real tensors go to the original function.
    """

    def __init__(self, target: str, rule: _AutocastRule | None = None,
                 capability: int = DEFAULT_CAPABILITY) -> None:
        self.target = target
        self.rule = rule
        self.capability = capability
        self.kernels: set[str] = set()
        self._original: Callable[..., torch.Tensor] | None = None

    def __enter__(self) -> _TargetKernels:
        self._original = F.scaled_dot_product_attention
        F.scaled_dot_product_attention = self._sdpa
        return self

    def __exit__(self, *exc: object) -> None:
        F.scaled_dot_product_attention = self._original

    def _sdpa(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        original = self._original
        kwargs = {"enable_gqa": True} if enable_gqa else {}
        if query.device.type != "meta":
            return original(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, **kwargs)
        if self.rule is not None:  # autocast runs attention in lower precision
            query, key, value = (
                self.rule._cast(t, self.rule.dtype, (torch.float32,)) for t in (query, key, value)
            )
        gqa = enable_gqa and key.shape[-3] != query.shape[-3]
        mask_dtype = None if attn_mask is None else attn_mask.dtype
        if self.target == "cpu":
            kernel = _cpu_kernel(
                query.dtype, query.shape[-1], mask_dtype, dropout_p > 0, bool(is_causal), gqa
            )
        else:
            kernel = cuda_kernel(query.dtype, query.shape[-1], attn_mask is not None, gqa=gqa,
                                 capability=self.capability)
        self.kernels.add(KERNEL_NAMES[kernel])
        if kernel == _MATH:
            return original(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, **kwargs)
        if attn_mask is not None and attn_mask.dtype == torch.bool:  # as SDPA converts it
            attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype, device=query.device).masked_fill(
                attn_mask.logical_not(), float("-inf")
            )
        if kernel == _EFFICIENT:
            return torch.ops.aten._scaled_dot_product_efficient_attention(
                query, key, value, attn_mask, query.requires_grad, dropout_p, bool(is_causal), scale=scale
            )[0]
        if self.target == "cuda":
            return torch.ops.aten._scaled_dot_product_flash_attention(
                query, key, value, dropout_p, bool(is_causal), scale=scale
            )[0]
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, dropout_p, bool(is_causal), attn_mask=attn_mask, scale=scale
        )[0]


_LOWER = frozenset(
    {
        "linear",
        "matmul",
        "__matmul__",
        "__rmatmul__",
        "mm",
        "bmm",
        "addmm",
        "baddbmm",
        "addbmm",
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "scaled_dot_product_attention",
        "multi_head_attention_forward",
        "prelu",
    }
)
_FP32_LOSSES = frozenset(
    {
        "cross_entropy",
        "nll_loss",
        "mse_loss",
        "l1_loss",
        "smooth_l1_loss",
        "huber_loss",
        "kl_div",
        "binary_cross_entropy",
        "binary_cross_entropy_with_logits",
        "poisson_nll_loss",
        "soft_margin_loss",
        "margin_ranking_loss",
        "multi_margin_loss",
        "multilabel_margin_loss",
        "hinge_embedding_loss",
        "cosine_embedding_loss",
        "triplet_margin_loss",
    }
)
_FP32_CUDA = _FP32_LOSSES | frozenset(
    {
        "layer_norm",
        "group_norm",
        "softmax",
        "log_softmax",
        "exp",
        "log",
        "rsqrt",
        "pow",
        "reciprocal",
        "norm",
        "logsumexp",
        "softplus",
        "cosine_similarity",
        "cumsum",
        "prod",
    }
)


class _AutocastRule(TorchFunctionMode):
    """autocast's per-op dtype rule at the level of torch functions (for meta tensors)."""

    def __init__(self, target: str, dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        self.dtype = dtype
        self.fp32 = _FP32_CUDA if target == "cuda" else _FP32_LOSSES
        self.caching = False
        self.cache: dict[int, torch.Tensor] = {}

    def _cast(self, value: object, to: torch.dtype, src: tuple[torch.dtype, ...]) -> object:
        if isinstance(value, torch.Tensor) and value.dtype in src and value.is_floating_point():
            cacheable = self.caching and value.is_leaf and value.requires_grad
            if cacheable and id(value) in self.cache:
                return self.cache[id(value)]
            out = value.to(to)
            if cacheable:
                self.cache[id(value)] = out
            return out
        if isinstance(value, tuple | list):
            return type(value)(self._cast(v, to, src) for v in value)
        return value

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if func is torch.Tensor.backward and len(args) == 1 and not any(kwargs.values()):
            # Tensor.backward would run with this mode switched off; a checkpoint's recomputation
            # must see the same dtype rule as its forward pass, so run the engine with it on.
            loss = args[0]
            with self:
                _engine_run_backward(
                    (loss,),
                    (torch.ones_like(loss),),
                    False,
                    False,
                    (),
                    allow_unreachable=True,
                    accumulate_grad=True,
                )
            return None
        if name in _LOWER:
            to, src = self.dtype, (torch.float32,)
        elif name in self.fp32:
            to, src = torch.float32, (torch.float16, torch.bfloat16)
        else:
            return func(*args, **kwargs)
        # last argument first, as autocast's C++ wrappers cast them (GCC evaluates call arguments right
        # to left): the order of the casts is the order in which backward runs their gradients
        cast_kwargs = {k: self._cast(v, to, src) for k, v in reversed(kwargs.items())}
        cast_args = [self._cast(v, to, src) for v in reversed(args)][::-1]
        return func(*cast_args, **dict(reversed(cast_kwargs.items())))

    @contextlib.contextmanager
    def forward(self) -> Iterator[None]:
        """A forward pass: casts of weights are made once and kept until it ends (autocast's cache)."""
        self.caching = True
        try:
            yield
        finally:
            self.caching = False
            self.cache.clear()

    @contextlib.contextmanager
    def recomputes(self) -> Iterator[None]:
        """While inside, each checkpoint recompute keeps its casts of weights until it ends.

        A recompute runs under the autocast state of its forward, and real autocast caches
        there too: a cast copy that no op saves (a bias's) lives until the recompute ends,
        not only until its op. Checkpoint runs every recompute inside
        `torch.random.fork_rng`, so that is where the cache is switched on.
        """
        original = torch.random.fork_rng

        @contextlib.contextmanager
        def fork_rng(*args: object, **kwargs: object) -> Iterator[None]:
            caching = contextlib.nullcontext() if self.caching else self.forward()  # a forward's own stays
            with original(*args, **kwargs), caching:  # type: ignore[arg-type]
                yield

        torch.random.fork_rng = fork_rng
        try:
            yield
        finally:
            torch.random.fork_rng = original
