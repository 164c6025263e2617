"""Execute every lesson notebook and report its wall time and peak memory.

Usage: python scripts/bench.py [--cells] [--images DIR] [--out bench.json] [NOTEBOOK ...]

Each notebook runs in a fresh kernel, in its own subprocess, so that the peak
resident memory (max RSS of the kernel process) belongs to that notebook alone.
This is a benchmark, not a test: it prints and saves numbers and fails only if
a notebook fails to execute. `--cells` also prints the slowest cells;
`--images DIR` saves every PNG the notebooks displayed (reference figures).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 60.0


def save_images(nb, stem: str, folder: Path) -> int:  # noqa: ANN001
    """Write each PNG output of the executed notebook to folder/<stem>_cellNN[_k].png."""
    import base64

    folder.mkdir(parents=True, exist_ok=True)
    count = 0
    for i, cell in enumerate(nb.cells):
        pngs = [o["data"]["image/png"] for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
        for k, png in enumerate(pngs):
            suffix = f"_{k}" if len(pngs) > 1 else ""
            (folder / f"{stem}_cell{i:02d}{suffix}.png").write_bytes(base64.b64decode(png))
            count += 1
    return count


def run_one(path: Path, cells: bool, images: Path | None = None) -> dict:
    """Execute one notebook (in this process) and return its timings."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    per_cell = []
    for i, cell in enumerate(nb.cells):
        ex = cell.get("metadata", {}).get("execution", {})
        if cell.cell_type == "code" and "iopub.execute_input" in ex and "shell.execute_reply" in ex:
            from datetime import datetime

            t0 = datetime.fromisoformat(ex["iopub.execute_input"].replace("Z", "+00:00"))
            t1 = datetime.fromisoformat(ex["shell.execute_reply"].replace("Z", "+00:00"))
            per_cell.append((i, (t1 - t0).total_seconds(), cell.source.splitlines()[0][:60]))
    # ru_maxrss is KiB on Linux: the largest child we waited for, i.e. the kernel.
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    result = {"notebook": path.name, "seconds": round(seconds, 1), "peak_rss_mib": round(peak_kib / 1024)}
    if images is not None:
        result["images"] = save_images(nb, path.stem, images)
    if cells:
        result["slowest_cells"] = sorted(per_cell, key=lambda c: -c[1])[:5]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    parser.add_argument("--out", type=Path, default=ROOT / "bench.json")
    parser.add_argument("--cells", action="store_true", help="also list the slowest cells")
    parser.add_argument("--images", type=Path, help="save displayed PNGs into this folder")
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # internal: child mode
    args = parser.parse_args()
    if args.one:
        images = args.images.resolve() if args.images else None
        print(json.dumps(run_one(args.one, args.cells, images)))
        return 0

    notebooks = args.notebooks or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    env = {**os.environ, "MPLBACKEND": "Agg"}
    results, failed = [], []
    print(f"{'notebook':<40}{'seconds':>9}{'peak RSS':>11}")
    for nb in notebooks:
        cmd = [sys.executable, __file__, "--one", str(nb.resolve())] + (["--cells"] if args.cells else [])
        if args.images:
            cmd += ["--images", str(args.images.resolve())]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            failed.append(nb.name)
            print(f"{nb.name:<40}   FAILED\n{proc.stderr[-2000:]}")
            continue
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        results.append(res)
        flag = "" if res["seconds"] <= TARGET_S else f"  (over the {TARGET_S:.0f} s target)"
        print(f"{res['notebook']:<40}{res['seconds']:>8.1f}s{res['peak_rss_mib']:>7} MiB{flag}")
        for i, sec, src in res.get("slowest_cells", []):
            print(f"    cell {i:>3}: {sec:6.1f}s  {src}")
    summary = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
        "scale": os.environ.get("LESSONS_SCALE", "default (small on CPU, full on CUDA)"),
        "device": os.environ.get("LESSONS_DEVICE", "auto"),
        "results": results,
        "failed": failed,
    }
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"saved {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
