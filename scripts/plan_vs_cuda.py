"""`make gpu` phase (e): the meta plan beside real steps on this card, kept as a calibration file (issue 39).

Three preset architectures (GPT-2 small: tied, learned positions; Qwen2.5-0.5B and Llama-3.2-1B:
grouped-query attention) are built from their configs with random weights on the GPU and trained with
the explainer's loop (K micro-steps, `predictions` alive until reassigned, then Adam's step) in fp32
and under bf16 autocast over fp32 weights, plain and with every block checkpointed, at B = 1 and 4.
Each row keeps the configuration, `max_memory_allocated`, `max_memory_reserved`, `mem_get_info` at
the end of the step, and the plan for the same configuration (a meta profile for this card's compute
capability). The file goes to OUT_DIR/calibration-<card>-torch<version>-<date>.json, in the format of
docs/calibration/ (commit it there: `helpers.plan.calibration` replays it on every CPU run). The run
fails when a real step is above its plan (the unsafe side) or more than 5% below it.

Usage: python scripts/plan_vs_cuda.py [OUT_DIR]   (needs a CUDA GPU; on CPU it prints so and exits 0)
"""

from __future__ import annotations

import contextlib
import datetime
import json
import re
import sys
import time
from pathlib import Path

import torch

from helpers.core.data import BatchSpec
from helpers.meta.profiler import Profiler
from helpers.plan.cards import cublas_workspace_bytes
from helpers.plan.presets import preset_spec
from helpers.techniques.checkpointing import apply_ac

GIB = 2**30
CASES = (("gpt2-small", 512), ("gpt2-small", 1024), ("qwen2.5-0.5b", 1024), ("llama-3.2-1b", 512))
PRECISIONS, CHECKPOINTS, SIZES = ("fp32", "bf16"), ("none", "blocks"), ((1, 2), (4, 1))  # (B, K)
BUDGET_S = 180  # make gpu gives this phase 3 of its 8 minutes


def real_peak(build, spec: BatchSpec, b: int, k: int, precision: str, checkpoint: str) -> dict:  # noqa: ANN001
    """The caching allocator's record of one update of the explainer's loop (Adam state made first)."""
    torch.cuda.empty_cache()
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = build().train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-5)  # CUDA's default: foreach
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    batches = [spec.batch(b, "cuda", i) for i in range(k)]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    blocks = contextlib.nullcontext() if checkpoint == "none" else apply_ac(model, "full")  # as the Profiler
    with blocks:
        for x, y in batches:
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
                predictions = model(x)
                loss = spec.loss(predictions, y)
            (loss / k).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    record = {"max_memory_allocated_bytes": torch.cuda.max_memory_allocated(),
              "max_memory_reserved_bytes": torch.cuda.max_memory_reserved(),
              "mem_get_info_free_bytes_after_step": torch.cuda.mem_get_info()[0]}
    del model, opt, batches, predictions, loss
    return record


def main(out: Path) -> int:
    """Measure each case, print it beside its plan, write the calibration file; 1 if any row is above its
    plan or more than 5% below it."""
    if not torch.cuda.is_available():
        print("plan_vs_cuda: no CUDA GPU here; nothing to check")
        return 0
    major, minor = torch.cuda.get_device_capability()
    capability, started, rows, bad = 10 * major + minor, time.monotonic(), [], 0
    for name, seq in CASES:
        build, spec, _ = preset_spec(name, seq)
        for precision in PRECISIONS:
            meta = Profiler(build, spec, "adam", target="cuda", precision=precision, capability=capability)
            for checkpoint in CHECKPOINTS:
                for b, k in SIZES:
                    if time.monotonic() - started > BUDGET_S:
                        continue  # out of time: the rows so far are kept
                    plan = meta.step(b, checkpoint=checkpoint, accumulation_steps=k)
                    planned = plan.peak_bytes + cublas_workspace_bytes(capability)  # as plan_model adds
                    try:
                        real = real_peak(build, spec, b, k, precision, checkpoint)
                    except torch.cuda.OutOfMemoryError:
                        torch.cuda.empty_cache()
                        print(f"{name} {precision} {checkpoint} B={b} K={k}: OOM")
                        continue
                    error = real["max_memory_allocated_bytes"] / planned - 1
                    bad += not -0.05 <= error <= 0
                    rows.append({"model": name, "precision": precision, "checkpoint": checkpoint,
                                 "optimizer": "adam", "optimizer_impl": "default", "B": b, "K": k,
                                 "seq_len": seq, "attention_kernel": ", ".join(plan.kernels),
                                 **real, "plan_bytes": planned, "tensor_plan_bytes": plan.peak_bytes,
                                 "cuda_workspace_bytes": planned - plan.peak_bytes,
                                 "source": "scripts/plan_vs_cuda.py"})
                    alloc, reserved = real["max_memory_allocated_bytes"], real["max_memory_reserved_bytes"]
                    print(f"{name:13s} {precision} ckpt {checkpoint:6s} seq {seq:5d} B={b} K={k}: plan "
                          f"{planned / GIB:7.3f} GiB, allocated {alloc / GIB:7.3f} GiB, reserved "
                          f"{reserved / GIB:7.3f} GiB, real/plan - 1 = {error:+.2%}")
    props = torch.cuda.get_device_properties(0)
    day = datetime.date.today().isoformat()
    run = {"device": torch.cuda.get_device_name(), "capability": [major, minor],
           "total_memory_bytes": props.total_memory, "torch": torch.__version__, "cuda": torch.version.cuda,
           "python": sys.version.split()[0], "date": day, "script": "scripts/plan_vs_cuda.py"}
    card = re.sub(r"[^a-z0-9]+", "-", run["device"].lower()).strip("-")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"calibration-{card}-torch{torch.__version__.split('+')[0]}-{day}.json"
    path.write_text(json.dumps({"run": run, "rows": rows}, indent=1))
    spent = time.monotonic() - started
    print(f"{len(rows)} rows in {path} ({spent:.0f} s); {bad} outside [-5%, 0] of the plan")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "gpu-run")))
