"""Released causal LMs' architectures as configs: `ArchConfig`, `RELEASED`, their exact parameter counts.

The published `config.json` of each release, the fields that shape memory, written in code
(nothing is downloaded). `helpers.models.architectures.CausalLM` builds them.

- `ArchConfig`, `FAMILIES`, `RELEASED`, `PUBLISHED_PARAMETERS`, `param_count(cfg)` (closed form).
"""

from __future__ import annotations

from dataclasses import dataclass

from helpers.core.validate import choice, number_in_range, positive_int, positive_number

__all__ = ["FAMILIES", "PUBLISHED_PARAMETERS", "RELEASED", "ArchConfig", "param_count"]

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
    """The parameters of `CausalLM(cfg)`, counted from the config alone (each tied tensor once).

    Args:
        cfg: the architecture's config.

    Returns:
        The parameter count.
    """
    h, d, kv, i = cfg.hidden_size, cfg.dim, cfg.kv_heads, cfg.intermediate_size
    q_out, kv_out = cfg.num_heads * d, kv * d
    # GPT-2's layers always carry biases (its Conv1D); the bias flags are the Llama family's
    qkv_bias, o_bias, mlp_bias = ((cfg.qkv_bias, cfg.o_bias, cfg.mlp_bias) if cfg.llama_like
                                  else (True, True, True))
    attn = h * (q_out + 2 * kv_out) + q_out * h + qkv_bias * (q_out + 2 * kv_out) + o_bias * h
    if cfg.llama_like:
        mlp, norms = 3 * h * i + mlp_bias * (2 * i + h), 2 * h
        extra = h  # the final RMSNorm
    else:
        mlp, norms = 2 * h * i + mlp_bias * (i + h), 4 * h
        extra = cfg.max_positions * h + 2 * h  # learned positions, final LayerNorm
    embeddings = cfg.vocab_size * h * (1 if cfg.tie_embeddings else 2)
    return cfg.num_layers * (attn + mlp + norms) + extra + embeddings
