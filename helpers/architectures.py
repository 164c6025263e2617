"""The released models people fine-tune, as torch modules: GPT-2 and the Llama family (lesson 09).

Each preset in `RELEASED` is a published `config.json` written in code (nothing is downloaded),
and `CausalLM(cfg)` builds that architecture with the released model's exact parameter count:

- **GPT-2** (small, medium, large, XL): token and learned position embeddings (a table fixed
  at 1,024 positions), pre-LayerNorm blocks whose attention and MLP are Transformers' `Conv1D`
  layers (`addmm` on a transposed weight), GELU "gelu_new" written out as Transformers writes it,
  dropout 0.1 where the config has it, and a head tied to the token embedding.
- **Llama family** (Llama-3.2-1B/3B, Llama-3.1-8B, Mistral-7B, Qwen2.5-0.5B, TinyLlama-1.1B):
  RMSNorm with Transformers' fp32 upcast, a SwiGLU MLP, rotary positions (no parameters; cos and
  sin computed once per forward and shared by every block), grouped-query attention, q/k/v biases
  for Qwen2, a sliding-window mask for Mistral when the sequence reaches the window, and a tied
  head where the release ties it (Llama-3.2-1B/3B, Qwen2.5-0.5B).

The ops are Transformers' own, in its order (checked against Transformers 5.24), so autograd
saves the same tensors: attention runs through `torch.nn.functional.scaled_dot_product_attention`
called as Transformers' `sdpa_attention_forward` calls it. With no mask it passes `is_causal=True`
(for more than one token) and, for grouped-query attention with head_dim <= 256, `enable_gqa=True`;
with a mask (Mistral's window) it expands K and V first (`repeat_kv`), and the expanded copies are
what attention saves. The logits come out in the head's dtype; the loss upcasts them (`lm_loss`'s
cross-entropy under autocast, as Transformers' `ForCausalLMLoss` does with `.float()`).

Blocks sit in an `nn.ModuleList` named `blocks` and run through `block_wrapper(block, x)` when one
is set (the convention of `helpers.models`), so `checkpoint` and `helpers.meta_profile.Profiler`
work unchanged. A Llama-family block also needs the shared rotary cos/sin (and the mask): the
wrapper gets `functools.partial(block, rope=..., mask=...)` in place of the block.

- `ArchConfig`, `RELEASED`, `PUBLISHED_PARAMETERS`, `param_count(cfg)` (closed form).
- `CausalLM(cfg)`; `released(name, seq_len)` -> (factory, `BatchSpec`, cfg), a `ValueError`
  beyond the release's positions.
- `block_activation_bytes(cfg, ...)`: the bytes one block saves for backward, per token.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from helpers.checks import choice, number_in_range, positive_int, positive_number
from helpers.meta_profile import BatchSpec, Profiler
from helpers.models import GPT, BlockWrapper, GPTConfig

__all__ = [
    "FAMILIES",
    "PUBLISHED_PARAMETERS",
    "RELEASED",
    "ArchConfig",
    "CausalLM",
    "block_activation_bytes",
    "param_count",
    "released",
]

FAMILIES = ("gpt2", "llama", "mistral", "qwen2")


@dataclass(frozen=True)
class ArchConfig:
    """A causal LM's architecture: the fields of its Transformers `config.json` that shape memory.

    `family` is "gpt2" (LayerNorm, Conv1D, gelu_new, learned positions) or a Llama-family type
    ("llama", "mistral", "qwen2": RMSNorm, SwiGLU, RoPE, grouped-query attention). `num_kv_heads`
    defaults to `num_heads`, `head_dim` to hidden_size / num_heads. `rope_scaling` holds
    Llama-3's ("llama3") frequency parameters as sorted (key, value) pairs, or is None.
    `stored_dtype` is the config's `torch_dtype`: how the released weights are stored. It is
    recorded, never used to build the model (training precision is the planner's choice).
    """

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    max_positions: int
    num_kv_heads: int | None = None
    head_dim: int | None = None
    tie_embeddings: bool = False
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, float | str], ...] | None = None
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None
    embd_dropout: float = 0.0
    attn_dropout: float = 0.0
    resid_dropout: float = 0.0
    pad_token_id: int | None = None
    name: str = ""
    stored_dtype: str | None = None

    def __post_init__(self) -> None:
        choice("family", self.family, FAMILIES)
        for field in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                      "max_positions"):
            positive_int(field, getattr(self, field))
        kv = positive_int("num_kv_heads", self.kv_heads)
        if self.num_heads % kv:
            raise ValueError(f"num_heads={self.num_heads} must be a multiple of num_kv_heads={kv}")
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size={self.hidden_size} must be divisible by "
                             f"num_heads={self.num_heads} (or give head_dim)")
        positive_int("head_dim", self.dim)
        if self.family == "gpt2" and (self.kv_heads != self.num_heads or self.dim * self.num_heads
                                      != self.hidden_size):
            raise ValueError("a gpt2 config has multi-head attention: num_kv_heads == num_heads and "
                             "head_dim == hidden_size / num_heads")
        if self.sliding_window is not None:
            positive_int("sliding_window", self.sliding_window)
        positive_number("norm_eps", self.norm_eps)
        positive_number("rope_theta", self.rope_theta)
        for field in ("embd_dropout", "attn_dropout", "resid_dropout"):
            number_in_range(field, getattr(self, field), 0.0, 1.0, high_open=True)
        if self.rope_scaling is not None:
            kind = dict(self.rope_scaling).get("rope_type")
            if kind != "llama3":
                raise ValueError(f"rope_scaling of type {kind!r} is not built here; "
                                 "allowed: 'llama3' or None")

    @property
    def kv_heads(self) -> int:
        """Key/value heads (grouped-query attention when fewer than `num_heads`)."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def dim(self) -> int:
        """Per-head width."""
        return self.hidden_size // self.num_heads if self.head_dim is None else self.head_dim

    @property
    def llama_like(self) -> bool:
        """True for the RMSNorm / SwiGLU / RoPE families."""
        return self.family != "gpt2"


def _gpt2(name: str, hidden: int, layers: int, heads: int) -> ArchConfig:
    return ArchConfig("gpt2", 50257, hidden, 4 * hidden, layers, heads, 1024, tie_embeddings=True,
                      qkv_bias=True, o_bias=True, mlp_bias=True, embd_dropout=0.1, attn_dropout=0.1,
                      resid_dropout=0.1, name=name)


def _llama3_rope(factor: float) -> tuple[tuple[str, float | str], ...]:
    return (("factor", factor), ("high_freq_factor", 4.0), ("low_freq_factor", 1.0),
            ("original_max_position_embeddings", 8192), ("rope_type", "llama3"))


# The published config.json of each release (Hugging Face Hub), the fields that shape memory.
RELEASED: dict[str, ArchConfig] = {
    "gpt2-small": _gpt2("gpt2", 768, 12, 12),
    "gpt2-medium": _gpt2("gpt2-medium", 1024, 24, 16),
    "gpt2-large": _gpt2("gpt2-large", 1280, 36, 20),
    "gpt2-xl": _gpt2("gpt2-xl", 1600, 48, 25),
    "llama-3.2-1b": ArchConfig("llama", 128256, 2048, 8192, 16, 32, 131072, num_kv_heads=8, head_dim=64,
                               tie_embeddings=True, rope_theta=500000.0, rope_scaling=_llama3_rope(32.0),
                               name="meta-llama/Llama-3.2-1B", stored_dtype="bfloat16"),
    "llama-3.2-3b": ArchConfig("llama", 128256, 3072, 8192, 28, 24, 131072, num_kv_heads=8, head_dim=128,
                               tie_embeddings=True, rope_theta=500000.0, rope_scaling=_llama3_rope(32.0),
                               name="meta-llama/Llama-3.2-3B", stored_dtype="bfloat16"),
    "llama-3.1-8b": ArchConfig("llama", 128256, 4096, 14336, 32, 32, 131072, num_kv_heads=8,
                               rope_theta=500000.0, rope_scaling=_llama3_rope(8.0),
                               name="meta-llama/Llama-3.1-8B", stored_dtype="bfloat16"),
    "mistral-7b": ArchConfig("mistral", 32000, 4096, 14336, 32, 32, 32768, num_kv_heads=8,
                             sliding_window=4096, name="mistralai/Mistral-7B-v0.1", stored_dtype="bfloat16"),
    "qwen2.5-0.5b": ArchConfig("qwen2", 151936, 896, 4864, 24, 14, 32768, num_kv_heads=2, tie_embeddings=True,
                               norm_eps=1e-6, rope_theta=1000000.0, qkv_bias=True, name="Qwen/Qwen2.5-0.5B",
                               stored_dtype="bfloat16"),
    "tinyllama-1.1b": ArchConfig("llama", 32000, 2048, 5632, 22, 32, 2048, num_kv_heads=4,
                                 name="TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T",
                                 stored_dtype="float32"),
}

# The releases' parameter counts as published (model cards and their safetensors totals).
PUBLISHED_PARAMETERS: dict[str, int] = {
    "gpt2-small": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824,
    "llama-3.1-8b": 8_030_261_248,
    "mistral-7b": 7_241_732_096,
    "qwen2.5-0.5b": 494_032_768,
    "tinyllama-1.1b": 1_100_048_384,
}


def param_count(cfg: ArchConfig) -> int:
    """The parameters of `CausalLM(cfg)`, counted from the config alone (each tied tensor once)."""
    h, d, kv, i = cfg.hidden_size, cfg.dim, cfg.kv_heads, cfg.intermediate_size
    q_out, kv_out = cfg.num_heads * d, kv * d
    attn = h * (q_out + 2 * kv_out) + q_out * h + cfg.qkv_bias * (q_out + 2 * kv_out) + cfg.o_bias * h
    if cfg.llama_like:
        mlp, norms = 3 * h * i + cfg.mlp_bias * (2 * i + h), 2 * h
        extra = h  # the final RMSNorm
    else:
        mlp, norms = 2 * h * i + cfg.mlp_bias * (i + h), 4 * h
        extra = cfg.max_positions * h + 2 * h  # learned positions, final LayerNorm
    embeddings = cfg.vocab_size * h * (1 if cfg.tie_embeddings else 2)
    return cfg.num_layers * (attn + mlp + norms) + extra + embeddings


# ---------------------------------------------------------------------------
# Layers, as Transformers writes them
# ---------------------------------------------------------------------------


class Conv1D(nn.Module):
    """GPT-2's linear layer: y = bias + x @ weight, the weight stored (in, out)."""

    def __init__(self, n_out: int, n_in: int) -> None:
        super().__init__()
        self.n_out = n_out
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size_out = x.size()[:-1] + (self.n_out,)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(size_out)


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's tanh-approximated GELU, written out op by op (Transformers' `NewGELUActivation`)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class RMSNorm(nn.Module):
    """Llama's RMSNorm: normalised in fp32, cast back to the input dtype, then scaled."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        return self.weight * x.to(dtype)


def _inv_freq(cfg: ArchConfig) -> torch.Tensor:
    d = cfg.dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).to(dtype=torch.float) / d))
    if cfg.rope_scaling is None:
        return inv_freq
    p = dict(cfg.rope_scaling)  # Llama 3's frequency bands ("llama3" rope_type)
    factor, low, high, old = (float(p[k]) for k in ("factor", "low_freq_factor", "high_freq_factor",
                                                    "original_max_position_embeddings"))
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) * ~(wavelen > old / low)
    return torch.where(medium, smoothed, scaled)


class Rotary(nn.Module):
    """cos and sin of the rotary positions, (1, seq, head_dim) in the input's dtype (no parameters)."""

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.register_buffer("inv_freq", _inv_freq(cfg), persistent=False)
        self.register_buffer("original_inv_freq", self.inv_freq.clone(), persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos() * 1.0, emb.sin() * 1.0
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(b, kv_heads, s, d) -> (b, kv_heads * n_rep, s, d): a copy, as Transformers makes it."""
    if n_rep == 1:
        return x
    b, kv, s, d = x.shape
    return x[:, :, None, :, :].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)


def _sdpa(module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
          mask: torch.Tensor | None, groups: int) -> torch.Tensor:
    """Transformers' `sdpa_attention_forward` on CPU/CUDA: (b, heads, s, d) in, (b, s, heads, d) out."""
    kwargs = {}
    s = q.shape[2]
    if groups > 1:
        if mask is None and k.shape[-1] == v.shape[-1] <= 256:
            kwargs["enable_gqa"] = True
        else:
            k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)
    y = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=module.dropout if module.training else 0.0,
        scale=module.scaling, is_causal=s > 1 and mask is None, **kwargs,
    )
    return y.reshape(y.shape[0], -1, s, v.shape[-1]).transpose(1, 2).contiguous()


class GPT2Attention(nn.Module):
    """GPT-2's attention: one Conv1D to q, k, v; SDPA; a Conv1D projection; residual dropout."""

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.hidden, self.head_dim = cfg.hidden_size, cfg.dim
        self.scaling, self.dropout = cfg.dim**-0.5, cfg.attn_dropout
        self.c_attn = Conv1D(3 * cfg.hidden_size, cfg.hidden_size)
        self.c_proj = Conv1D(cfg.hidden_size, cfg.hidden_size)
        self.resid_dropout = nn.Dropout(cfg.resid_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.c_attn(x).split(self.hidden, dim=2)
        shape = (*k.shape[:-1], -1, self.head_dim)
        k, v = k.view(shape).transpose(1, 2), v.view(shape).transpose(1, 2)
        q = q.view(shape).transpose(1, 2)
        y = _sdpa(self, q, k, v, None, 1)
        return self.resid_dropout(self.c_proj(y.reshape(*y.shape[:-2], -1).contiguous()))


class GPT2Block(nn.Module):
    """x + attn(ln_1(x)), then x + mlp(ln_2(x)); the MLP is Conv1D, gelu_new, Conv1D, dropout."""

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.attn = GPT2Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.c_fc = Conv1D(cfg.intermediate_size, cfg.hidden_size)
        self.c_proj = Conv1D(cfg.hidden_size, cfg.intermediate_size)
        self.dropout = nn.Dropout(cfg.resid_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attn(self.ln_1(x)) + x
        return x + self.dropout(self.c_proj(gelu_new(self.c_fc(self.ln_2(x)))))


class LlamaAttention(nn.Module):
    """Grouped-query attention with rotary positions (q/k/v biases for Qwen2)."""

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.dim
        self.head_dim, self.groups = d, cfg.num_heads // cfg.kv_heads
        self.scaling, self.dropout = d**-0.5, cfg.attn_dropout
        self.q_proj = nn.Linear(h, cfg.num_heads * d, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(h, cfg.kv_heads * d, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(h, cfg.kv_heads * d, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=cfg.o_bias)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                mask: torch.Tensor | None) -> torch.Tensor:
        shape = (*x.shape[:-1], -1, self.head_dim)
        q = self.q_proj(x).view(shape).transpose(1, 2)
        k = self.k_proj(x).view(shape).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        cos, sin = rope[0].unsqueeze(1), rope[1].unsqueeze(1)
        q, k = (q * cos) + (_rotate_half(q) * sin), (k * cos) + (_rotate_half(k) * sin)
        y = _sdpa(self, q, k, v, mask, self.groups)
        return self.o_proj(y.reshape(*x.shape[:-1], -1).contiguous())


class LlamaBlock(nn.Module):
    """x + attn(norm(x)), then x + down(silu(gate(norm(x))) * up(norm(x)))."""

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.input_layernorm = RMSNorm(h, cfg.norm_eps)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = RMSNorm(h, cfg.norm_eps)
        self.gate_proj = nn.Linear(h, i, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(h, i, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(i, h, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """`position_ids` is unused, but held as Transformers holds it (a checkpoint keeps it alive)."""
        x = x + self.self_attn(self.input_layernorm(x), rope, mask)
        y = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))


# ---------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------


class CausalLM(nn.Module):
    """A released causal LM's architecture (`ArchConfig`): token ids (batch, seq) in, logits out.

    `blocks` run through `self.block_wrapper(block, x)` when it is set (see the module docstring).
    """

    block_wrapper: BlockWrapper | None = None

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        if not isinstance(cfg, ArchConfig):
            raise TypeError(f"cfg must be an ArchConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.hidden_size, cfg.pad_token_id)
        if cfg.llama_like:
            self.blocks = nn.ModuleList(LlamaBlock(cfg) for _ in range(cfg.num_layers))
            self.norm: nn.Module = RMSNorm(cfg.hidden_size, cfg.norm_eps)
            self.rotary = Rotary(cfg)
        else:
            self.pos = nn.Embedding(cfg.max_positions, cfg.hidden_size)
            self.drop = nn.Dropout(cfg.embd_dropout)
            self.blocks = nn.ModuleList(GPT2Block(cfg) for _ in range(cfg.num_layers))
            self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        if cfg.tie_embeddings:
            self.head.weight = self.tok.weight

    def run_blocks(self, x: torch.Tensor, **extra: object) -> torch.Tensor:
        """Each block in turn, through `block_wrapper` if set; `extra` goes to every block."""
        for block in self.blocks:
            step: Callable[..., torch.Tensor] = functools.partial(block, **extra) if extra else block
            x = step(x) if self.block_wrapper is None else self.block_wrapper(step, x)
        return x

    def _mask(self, b: int, s: int, device: torch.device) -> torch.Tensor | None:
        """Mistral's sliding-window mask, made when the sequence reaches the window (else None)."""
        w = self.cfg.sliding_window
        if w is None or s < w or self.cfg.family == "qwen2":
            return None
        q = torch.arange(s, device=device)[None, None, :, None]
        kv = torch.arange(s, device=device)[None, None, None, :]
        keep = q.new_ones((), dtype=torch.bool)
        keep = keep & (kv > q - w).to(keep.device)
        keep = keep & (kv <= q).to(keep.device)
        return keep.expand(b, -1, s, s)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Map token ids (batch, seq) to logits (batch, seq, vocab)."""
        if idx.dim() != 2 or idx.size(1) > self.cfg.max_positions:
            raise ValueError(f"idx must be (batch, seq) with seq <= {self.cfg.max_positions}, got "
                             f"{tuple(idx.shape)}")
        b, s = idx.shape
        if self.cfg.llama_like:
            x = self.tok(idx)
            position_ids = (torch.arange(s, device=x.device) + 0).unsqueeze(0)
            mask = self._mask(b, s, x.device)
            x = self.run_blocks(x, rope=self.rotary(x, position_ids), mask=mask, position_ids=position_ids)
        else:
            idx = idx.view(-1, s)
            x = self.tok(idx)
            position_ids = (torch.arange(s, device=x.device) + 0).unsqueeze(0)
            x = self.drop(x + self.pos(position_ids).to(x.device))
            x = self.run_blocks(x)
        x = self.norm(x) if self.cfg.llama_like else self.norm(x).view(b, s, -1)
        return self.head(x[:, slice(0, None), :])


def released(name: str, seq_len: int | None = None) -> tuple[Callable[[], nn.Module], BatchSpec, ArchConfig]:
    """(factory, batch spec, config) of a released model in `RELEASED`, for sequences of `seq_len` tokens.

    Args:
        name: a key of `RELEASED` (e.g. "gpt2-small", "llama-3.2-1b").
        seq_len: tokens per sequence; defaults to the release's positions (GPT-2: 1,024; capped at
            4,096 for the long-context releases, a common fine-tuning length).

    Returns:
        A zero-argument factory building `CausalLM(cfg)`, the `BatchSpec` and the config. The
        parameter count never depends on `seq_len`.

    Raises:
        ValueError: for an unknown name, or a `seq_len` beyond what the release was built for
            (GPT-2's learned position table has 1,024 rows).
    """
    choice("name", name, tuple(RELEASED))
    cfg = RELEASED[name]
    length = min(cfg.max_positions, 4096) if seq_len is None else positive_int("seq_len", seq_len)
    if length > cfg.max_positions:
        what = ("its learned position table has" if cfg.family == "gpt2" else "it was released for")
        raise ValueError(f"seq_len={length} is too long for {name}: {what} {cfg.max_positions} positions; "
                         f"allowed: 1 to {cfg.max_positions}")
    return functools.partial(CausalLM, cfg), BatchSpec.lm(length, cfg.vocab_size), cfg


def block_activation_bytes(cfg: ArchConfig | GPTConfig, *, seq_len: int = 256, precision: str = "fp32",
                           target: str = "cuda") -> float:
    """Bytes one block keeps for backward, per token, measured on the meta device.

    Profiles copies of the model with one and two blocks at micro-batches of 1 and 2 sequences
    of `seq_len` tokens (`helpers.meta_profile.Profiler`, no checkpointing, one micro-step) and
    returns the activations at the end of the forward pass that grow with both: (2 blocks - 1
    block) at 2 sequences less the same at 1 sequence, divided by `seq_len`. What does not grow
    with the tokens (autocast's bf16 copies of the weights) drops out. `cfg` is an `ArchConfig`
    (`CausalLM`) or the project's `helpers.models.GPTConfig` (`GPT`, its position table sized to
    `seq_len`). Under "bf16" the precision is autocast's; `target` picks the attention kernel.
    """
    positive_int("seq_len", seq_len)
    if isinstance(cfg, ArchConfig):
        if seq_len > cfg.max_positions:
            raise ValueError(f"seq_len={seq_len} is beyond the config's {cfg.max_positions} positions")
        models = [functools.partial(CausalLM, dataclasses.replace(cfg, num_layers=n)) for n in (1, 2)]
    elif isinstance(cfg, GPTConfig):
        models = [functools.partial(GPT, dataclasses.replace(cfg, n_layers=n, seq_len=seq_len))
                  for n in (1, 2)]
    else:
        raise TypeError(f"cfg must be an ArchConfig or a GPTConfig, got {type(cfg).__name__}")
    ends = {}
    for n, build in enumerate(models, start=1):
        prof = Profiler(build, BatchSpec.lm(seq_len, cfg.vocab_size), precision=precision, target=target)
        for b in (1, 2):
            ends[n, b] = prof.step(b, accumulation_steps=1).forward_end_breakdown["activations"]
    return ((ends[2, 2] - ends[1, 2]) - (ends[2, 1] - ends[1, 1])) / seq_len
