"""The measurements behind lesson 10's claims in the ledger (lesson 08): frameworks and the compiler.

Each `_c_*(lab)` returns `Evidence`; the frameworks (Transformers, Accelerate, Lightning) are
imported only when their check runs. `helpers.ledger.claims.CLAIMS` names them.
"""

from __future__ import annotations

import importlib

import torch

from helpers.core.data import regression_batch
from helpers.core.training import lm_loss
from helpers.ledger.claim_lab import Evidence, Lab
from helpers.ledger.claim_lab import gib as _gib
from helpers.models.nets import ResidualMLP
from helpers.techniques import accumulation as acc
from helpers.techniques import token_loss

_LM = dict(vocab_size=64, hidden=32, layers=2, heads=2, max_len=16)  # a tiny Llama, from a config


def _lm_rows(n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    hf_models = importlib.import_module("helpers.frameworks.hf_models")
    rows = token_loss.variable_length_sequences(n, _LM["max_len"], _LM["vocab_size"], spread=0.75, seed=seed)
    return hf_models.training_rows(rows)


def _c_hf_checkpointing(lab: Lab) -> Evidence:
    hf = importlib.import_module("helpers.frameworks.hf")
    hf_models = importlib.import_module("helpers.frameworks.hf_models")
    model = hf_models.causal_lm("llama", device=lab.device, **_LM)
    batch = hf_models.micro_batches(_lm_rows(4, 0), 4, device=lab.device)[0]
    plain, (_, g_plain) = hf.saved_bytes(model, batch), hf.loss_and_grad(model, batch)
    hf.enable_checkpointing(model, reentrant=False)
    kept, (_, g_ckpt) = hf.saved_bytes(model, batch), hf.loss_and_grad(model, batch)
    gap = ((g_ckpt - g_plain).abs().max() / g_plain.abs().max()).item()
    return Evidence(2 * kept <= plain and gap <= 1e-6, plain / kept, "x fewer saved bytes",
                    f"Llama with checkpointing on: {_gib(plain)} -> {_gib(kept)} kept for backward; "
                    f"gradients equal to {gap:.1e}")


def _c_trainer_accumulation(lab: Lab) -> Evidence:
    import tempfile

    hf = importlib.import_module("helpers.frameworks.hf")
    hf_models = importlib.import_module("helpers.frameworks.hf_models")
    rows = _lm_rows(8, 1)
    loop = hf_models.causal_lm("llama", device=lab.device, **_LM)
    start = hf.snapshot(loop)
    hf.group_token_step(loop, hf_models.micro_batches(rows, 2, device=lab.device))
    torch.optim.SGD(loop.parameters(), lr=0.5).step()
    with tempfile.TemporaryDirectory() as out:
        model = hf_models.causal_lm("llama", device=lab.device, **_LM)
        update = hf.trainer_update(model, rows, micro_batch=2, accumulation_steps=4, learning_rate=0.5,
                                   output_dir=out)
    diff = acc.compare_grads(hf.parameter_change(loop, start), update)
    return Evidence(diff.max_rel <= 1e-5, diff.max_rel, "max_rel",
                    "Trainer(gradient_accumulation_steps=4) vs the group-token-count loop, one update of 8 "
                    "padded sequences (clipping, decay, warmup, schedule and shuffling off)")


def _c_accelerate_accumulation(lab: Lab) -> Evidence:
    import copy

    accel = importlib.import_module("helpers.frameworks.accel")
    idx, tgt = lab.tokens(8, seed=4)
    micro = list(zip(idx.split(2), tgt.split(2), strict=True))
    loop, model = copy.deepcopy(lab.model), copy.deepcopy(lab.model)
    start = torch.cat([p.detach().flatten() for p in loop.parameters()])
    sgd = torch.optim.SGD(loop.parameters(), lr=0.5)
    for x, y in micro:  # lesson 03's loop: loss / K, one step after K micro-steps
        (lm_loss(loop(x), y) / len(micro)).backward()
    sgd.step()
    accelerator = accel.fresh_accelerator(len(micro), device=lab.device)
    prepared, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.5))
    syncs = accel.accumulate_run(accelerator, prepared, opt, micro, lm_loss)
    diff = acc.compare_grads(torch.cat([p.detach().flatten() for p in loop.parameters()]) - start,
                             torch.cat([p.detach().flatten() for p in model.parameters()]) - start)
    return Evidence(syncs == [False, False, False, True] and diff.max_rel <= 1e-5, sum(syncs),
                    "syncs in 4 micro-steps", f"accumulate() synced {syncs}; its update = the loss/K loop's "
                    f"to {diff.max_rel:.1e}")


def _c_lightning_accumulation(lab: Lab) -> Evidence:
    from helpers.frameworks.installed import caught_warnings

    pl_run = importlib.import_module("helpers.frameworks.lightning_run")
    x, y = regression_batch(16, 8, 2, seed=5, device=lab.device)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = ResidualMLP(8, 16, 1, 2).to(lab.device)
    module = pl_run.loop_module(net, torch.nn.functional.mse_loss, lr=0.1, lr_lambda=lambda u: 1 / (u + 1))
    trainer = pl_run.quiet_trainer(device=lab.device, max_steps=2, accumulate_grad_batches=4,
                                   gradient_clip_val=0.01)
    with caught_warnings():  # Lightning's notices about a CPU run and its own deprecations
        trainer.fit(module, loader)
    steps = pl_run.scheduler_of(trainer).last_epoch
    ok = len(module.clip_norms) == 2 and steps == 2 and module.clip_lrs == [0.1, 0.05]
    return Evidence(ok, len(module.clip_norms) / 2, "clips per update",
                    f"8 micro-batches, K = 4: {len(module.clip_norms)} clips, {steps} scheduler steps, "
                    f"learning rates {module.clip_lrs}")


def _c_compile_budget(lab: Lab) -> Evidence:
    comp = importlib.import_module("helpers.frameworks.compiled")
    with torch.random.fork_rng(devices=[]):  # lesson 03's residual MLP: a small graph compiles fast
        torch.manual_seed(0)
        model = ResidualMLP(8, 64, 2, 2).to(lab.device)
    gen = torch.Generator().manual_seed(6)
    h = torch.randn(32, 64, generator=gen).to(lab.device).requires_grad_()
    high, low = comp.compiled_point(model, h, 1.0), comp.compiled_point(model, h, 0.0)
    full = comp.eager_point(model, h, comp.full_checkpoint, "full checkpoint")
    ok = (low.saved_bytes * 4 <= high.saved_bytes and high.recompute_flops == 0
          and 0 < low.recompute_flops <= full.recompute_flops)
    return Evidence(ok, high.saved_bytes / low.saved_bytes, "x fewer saved bytes at budget 0",
                    f"compiled MLP blocks, activation_memory_budget 1.0 -> 0.0: {_gib(high.saved_bytes)} -> "
                    f"{_gib(low.saved_bytes)} saved, recompute 0 -> {low.recompute_flops / 1e6:.2f} MFLOPs "
                    f"(full checkpoint {full.recompute_flops / 1e6:.2f})")

