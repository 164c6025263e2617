"""helpers.ledger.claim_checks (lesson 08): the ledger's checks measure the claim itself.

C11's extra FLOPs are held against one block's forward counted by hand.
"""

from __future__ import annotations

import pytest
import torch

from helpers.ledger import claim_lab


def test_c11_asserts_at_most_one_forward_of_the_checkpointed_blocks() -> None:
    """C11 checks the claim itself (extra FLOPs within one forward of the blocks), not a step ratio.

    A model whose step is dominated by its output layer (a large vocabulary, one block) spends a
    small share of the step on the recompute: the old proxy (1.05 <= ckpt / plain <= 1.40) failed it,
    though the claim holds.
    """
    from helpers.core.training import lm_loss
    from helpers.ledger.claims import CLAIMS
    from helpers.models.gpt import GPTConfig, seeded_gpt
    from helpers.techniques import checkpointing, costs

    (c11,) = [c for c in CLAIMS if c.id == "C11"]
    lab = claim_lab.Lab(torch.device("cpu"), scale="tiny")
    wide = seeded_gpt(GPTConfig(vocab_size=4096, seq_len=16, d_model=16, n_heads=2, n_layers=1, dropout=0.0),
                      "cpu")
    lab.cache["lesson_model 02"] = wide  # stands in for lesson 02's model
    ev = c11.run(lab)
    idx, tgt = lab.lesson_tokens("02", 4)  # lesson 02's micro-batch at "tiny"
    plain = costs.count_flops(lambda: lm_loss(wide(idx), tgt).backward())
    wide.block_wrapper = checkpointing.make_block_wrapper("full")
    ckpt = costs.count_flops(lambda: lm_loss(wide(idx), tgt).backward())
    wide.block_wrapper = None
    s, h = 16, 16
    region = 4 * s * h * (24 * h + 4 * s)  # one block's forward, counted by hand: 24bsh^2 + 4bs^2h
    assert ev.passed and ev.value == pytest.approx((ckpt - plain) / region)
    assert 0 < ev.value <= 1
    assert ckpt / plain < 1.05  # the old proxy would have failed a true claim here
    assert ev.unit == "forwards of the checkpointed blocks" and "lesson 02's model" in ev.detail
