"""The layers of the released architectures, op for op as Transformers writes them.

GPT-2's `Conv1D`, `gelu_new`, attention and block; the Llama family's `RMSNorm` (fp32 upcast),
rotary positions, grouped-query attention (`enable_gqa` without a mask, else `repeat_kv` copies,
as Transformers' `sdpa_attention_forward` does) and SwiGLU block. `helpers.models.architectures.CausalLM`
puts them together.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from helpers.models.architecture_config import ArchConfig

__all__ = ["Conv1D", "GPT2Attention", "GPT2Block", "LlamaAttention", "LlamaBlock", "RMSNorm", "Rotary",
           "gelu_new"]



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
