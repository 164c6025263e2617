"""Small Transformers causal LMs built in code, and the batches they train on (instrument, lesson 10).

Every model is built from a config written in code (random weights, nothing downloaded).
Needs the `frameworks` extra; Transformers is imported only when a function is called.

- Models: `causal_lm_config(kind, ...)`, `causal_lm(kind, ...)` for `KINDS` (Llama, GPT-2),
  with dropout and the KV cache off; `dropout_settings(model)` reads what the config holds.
- Data: `training_rows(samples)` (lesson 05's variable-length sequences as Trainer rows),
  `collate(rows)` (pad each micro-batch to its longest row, label padding -100),
  `micro_batches(rows, b)`, `predicted_tokens(batches)` (labels the shifted loss counts).

`helpers.frameworks.hf` runs them against the lessons' loops.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from helpers.core.training import IGNORE_INDEX
from helpers.core.validate import bool_arg, choice, int_in_range, positive_int
from helpers.frameworks.installed import offline, silence_logs

__all__ = [
    "DROPOUT_FIELDS", "KINDS", "causal_lm", "causal_lm_config", "collate", "micro_batches",
    "predicted_tokens", "training_rows",
]

KINDS = ("llama", "gpt2")
DROPOUT_FIELDS = {"llama": ("attention_dropout",), "gpt2": ("resid_pdrop", "embd_pdrop", "attn_pdrop")}
PAD_ID = 0


# -- models ------------------------------------------------------------------------------------
def causal_lm_config(kind: str = "llama", *, vocab_size: int = 256, hidden: int = 64, layers: int = 2,
                     heads: int = 4, max_len: int = 64) -> object:
    """A small Transformers config of `kind` ("llama" or "gpt2"): dropout 0, no KV cache.

    Llama gets grouped-query attention (half as many KV heads) and an MLP of 2 x
    `hidden`; GPT-2 ties its input embedding and its head, as the released model does.
    Token ids 0 and 1 serve as bos/eos, so they lie inside a small vocabulary.
    """
    choice("kind", kind, KINDS)
    for name, value in dict(vocab_size=vocab_size, hidden=hidden, layers=layers, heads=heads,
                            max_len=max_len).items():
        positive_int(name, value)
    if hidden % heads:
        raise ValueError(f"hidden={hidden} must be divisible by heads={heads}")
    offline()
    import transformers

    silence_logs()  # config notices go to stderr through Transformers' logger
    if kind == "llama":
        return transformers.LlamaConfig(
            vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
            num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
            max_position_embeddings=max_len, attention_dropout=0.0, use_cache=False,
            bos_token_id=0, eos_token_id=1, pad_token_id=PAD_ID, tie_word_embeddings=False)
    return transformers.GPT2Config(
        vocab_size=vocab_size, n_positions=max_len, n_embd=hidden, n_layer=layers, n_head=heads,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, summary_first_dropout=0.0, use_cache=False,
        bos_token_id=0, eos_token_id=1, pad_token_id=PAD_ID)


def causal_lm(kind: str = "llama", *, seed: int = 0, device: torch.device | str = "cpu",
              **sizes: int) -> nn.Module:
    """A `kind` causal LM from `causal_lm_config(kind, **sizes)`, weights drawn from `seed`.

    Nothing is loaded from a hub. The global random state is left as it was.

    Args:
        kind: "llama" (`LlamaForCausalLM`) or "gpt2" (`GPT2LMHeadModel`).
        seed: the seed of its weights.
        device: where it goes.
        **sizes: passed to `causal_lm_config`.

    Returns:
        The model, in train mode, in float32.
    """
    import transformers

    cfg = causal_lm_config(kind, **sizes)
    cls = transformers.LlamaForCausalLM if kind == "llama" else transformers.GPT2LMHeadModel
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(cfg)
    return model.to(device=device, dtype=torch.float32).train()


# -- data --------------------------------------------------------------------------------------
def training_rows(samples: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    """Lesson 05's (input ids, labels) samples as Trainer rows `{"input_ids": ids}`.

    A causal LM in Transformers takes `labels=input_ids` and shifts them inside, so
    only the input ids are kept; `collate` builds the labels.

    Args:
        samples: (input ids, labels) pairs.

    Returns:
        The rows.

    Raises:
        ValueError: if `samples` is empty.
    """
    if not samples:
        raise ValueError("samples is empty; give at least one (input ids, labels) pair")
    return [{"input_ids": ids} for ids, _ in samples]


def collate(rows: Sequence[dict[str, torch.Tensor]], *, mask_first: bool = False) -> dict[str, torch.Tensor]:
    """Pad `rows` on the right to the longest one: input ids, attention mask and labels.

    Args:
        rows: `{"input_ids": ids}` rows.
        mask_first: also set each row's first label to -100: no position predicts it, so the
            loss is unchanged, but a count over the labels then equals the count the shifted
            loss uses.

    Returns:
        {"input_ids", "attention_mask", "labels"}; labels are the input ids with
        `IGNORE_INDEX` (-100) at padding.

    Raises:
        ValueError: if `rows` is empty.
    """
    if not rows:
        raise ValueError("rows is empty; give at least one {'input_ids': ...} row")
    longest = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), longest), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(rows), longest), dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[i, :n], mask[i, :n] = r["input_ids"], 1
    labels = ids.masked_fill(mask == 0, IGNORE_INDEX)
    if bool_arg("mask_first", mask_first):
        labels[:, 0] = IGNORE_INDEX
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def micro_batches(
    rows: Sequence[dict[str, torch.Tensor]], micro_batch: int, *, device: torch.device | str = "cpu",
    mask_first: bool = False,
) -> list[dict[str, torch.Tensor]]:
    """Consecutive micro-batches of `micro_batch` rows, each collated on its own, on `device`.

    Args:
        rows: `{"input_ids": ids}` rows.
        micro_batch: rows per micro-batch (1 to len(rows)).
        device: where the tensors go.
        mask_first: passed to `collate`.

    Returns:
        The collated micro-batches.
    """
    int_in_range("micro_batch", micro_batch, 1, len(rows))
    out = []
    for i in range(0, len(rows), micro_batch):
        batch = collate(rows[i:i + micro_batch], mask_first=mask_first)
        out.append({k: v.to(device) for k, v in batch.items()})
    return out


def predicted_tokens(batches: Sequence[dict[str, torch.Tensor]]) -> int:
    """Label positions a causal LM's shifted loss predicts, over every micro-batch of a group.

    Args:
        batches: the group's collated micro-batches.

    Returns:
        The count.
    """
    return sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in batches)
