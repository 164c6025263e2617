"""`make gpu` phase (e): the meta plan beside torch.cuda.max_memory_allocated of a real bf16 step (issue 23).

Two preset architectures (GPT-2 small: tied, learned positions; Qwen2.5-0.5B: grouped-query attention,
tied, a 152k vocabulary) are built from their configs with random weights on the GPU and trained with
the explainer's loop (K micro-steps, `predictions` alive until reassigned, then Adam's step) under bf16
autocast over fp32 weights, at three (B, K) sizes. Each real peak is printed beside the plan for the
same configuration (a meta profile for this card's compute capability) and the margin the plan needed.
It fails when a real peak is above the plan by more than the default CUDA margin (10%).

Usage: python scripts/plan_vs_cuda.py [OUT_DIR]   (needs a CUDA GPU; written for it, not run on CPU)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from helpers.core.data import BatchSpec
from helpers.meta.profiler import Profiler
from helpers.plan.presets import DEFAULT_CUDA_MARGIN, preset_spec

CASES = {"gpt2-small": 512, "qwen2.5-0.5b": 1024}
SIZES = ((1, 2), (2, 2), (4, 1))  # (B, K)


def real_peak(build, spec: BatchSpec, b: int, k: int) -> int:  # noqa: ANN001
    """torch.cuda.max_memory_allocated of one update of the explainer's loop (Adam state made first)."""
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
    for x, y in batches:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            predictions = model(x)
            loss = spec.loss(predictions, y)
        (loss / k).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del model, opt, batches, predictions, loss
    return peak


def main(out: Path) -> int:
    """Print and save each case's plan, real peak and margin; 1 if a real peak is over plan + 10%."""
    if not torch.cuda.is_available():
        print("plan_vs_cuda: no CUDA GPU here; nothing to check")
        return 0
    major, minor = torch.cuda.get_device_capability()
    capability = 10 * major + minor
    rows, worst = [], -1.0
    for name, seq in CASES.items():
        build, spec, _ = preset_spec(name, seq)
        meta = Profiler(build, spec, "adam", target="cuda", precision="bf16", capability=capability)
        for b, k in SIZES:
            plan = meta.step(b, accumulation_steps=k)
            real = real_peak(build, spec, b, k)
            margin = real / plan.peak_bytes - 1
            worst = max(worst, margin)
            rows.append({"model": name, "seq_len": seq, "B": b, "K": k, "plan_bytes": plan.peak_bytes,
                         "max_memory_allocated": real, "margin": margin, "kernels": list(plan.kernels)})
            print(f"{name:13s} seq {seq:5d} B={b} K={k}: plan {plan.peak_bytes / 2**30:7.3f} GiB, "
                  f"max_memory_allocated {real / 2**30:7.3f} GiB, real/plan - 1 = {margin:+.2%} "
                  f"(kernel {', '.join(plan.kernels)}, sm{capability})")
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan_vs_cuda.json").write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                                       "capability": capability, "rows": rows}, indent=1))
    print(f"largest real/plan - 1: {worst:+.2%} (the plan keeps {DEFAULT_CUDA_MARGIN:.0%} of the budget "
          "free)")
    return 0 if worst <= DEFAULT_CUDA_MARGIN else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "gpu-run")))
