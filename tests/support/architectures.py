"""Small `ArchConfig`s the tests build, one per family.

- `SMALL`: the configs held against Transformers (tests/models/test_architectures.py) and the
  configs' own checks (tests/models/test_architecture_config.py).
- `TINY`: configs whose peak moves between ops, for the preset profiles, the peak envelope and the
  plan's report (tests/plan/).
"""

from __future__ import annotations

from helpers.models.architecture_config import ArchConfig

_ROPE3 = (("factor", 8.0), ("high_freq_factor", 4.0), ("low_freq_factor", 1.0),
          ("original_max_position_embeddings", 64), ("rope_type", "llama3"))
# One small config per family: grouped-query attention (llama, mistral, qwen2), Llama 3's rope bands,
# Mistral's sliding-window mask (the 32-token batches reach its 16-token window), Qwen2's q/k/v biases
# and tied head, GPT-2's tied head, Conv1D layers and dropout 0.1.
SMALL = {
    "llama": ArchConfig("llama", 96, 64, 160, 2, 4, 128, num_kv_heads=2, rope_theta=500000.0,
                        rope_scaling=_ROPE3),
    "mistral": ArchConfig("mistral", 96, 64, 160, 2, 4, 128, num_kv_heads=1, sliding_window=16),
    "qwen2": ArchConfig("qwen2", 96, 64, 160, 2, 4, 128, num_kv_heads=2, qkv_bias=True, tie_embeddings=True,
                        norm_eps=1e-6),
    "gpt2": ArchConfig("gpt2", 96, 64, 256, 2, 4, 64, tie_embeddings=True, qkv_bias=True, o_bias=True,
                       mlp_bias=True, embd_dropout=0.1, attn_dropout=0.1, resid_dropout=0.1),
}

# Small configs whose peak moves between ops as B and the depth grow, as GPT-2 small's does at 64
# tokens (a large vocabulary next to small blocks): lines fitted at B = 1, 2, 8 of the copies planned
# the 4-block models 9% to 20% below their full profiles at B = 16, and 38% to 69% below at B = 512.
TINY = {
    "gpt2": ArchConfig("gpt2", 4096, 64, 256, 4, 4, 64, tie_embeddings=True, embd_dropout=0.1,
                       attn_dropout=0.1, resid_dropout=0.1),
    "llama": ArchConfig("llama", 4096, 64, 128, 4, 4, 64, num_kv_heads=2, tie_embeddings=True),
    "mistral": ArchConfig("mistral", 4096, 64, 128, 4, 4, 64, num_kv_heads=1, sliding_window=4),
    "qwen2": ArchConfig("qwen2", 4096, 64, 128, 4, 4, 64, num_kv_heads=2, qkv_bias=True, tie_embeddings=True),
}
