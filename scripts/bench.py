"""Execute every lesson notebook and report its wall time and peak memory.

Usage: python scripts/bench.py [--cells] [--images DIR] [--executed DIR] [--out bench.json]
                               [--jobs N] [--keep-going] [--no-widgets] [--widgets-only]
                               [--no-overhead] [NOTEBOOK ...]

Each notebook runs in a fresh kernel, in its own subprocess, so that the peak
resident memory (max RSS of the kernel process) belongs to that notebook alone.
This is a benchmark, not a test: it prints and saves numbers and fails only if
a notebook fails to execute. `--cells` also prints the slowest cells;
`--images DIR` saves every PNG the notebooks displayed (reference figures);
`--executed DIR` saves each executed notebook, a failed one too (up to its
failing cell, with the traceback; with `--keep-going`, every cell, each failure
listed). The JSON is rewritten after each notebook, so
a run cut short keeps what finished. `--jobs N` runs N notebooks at a time (for
a machine with many cores, e.g. `make gpu`); its seconds then include the
others' load, so the default, 1, is the one to compare with the 60 s target.

After the notebooks it times every lesson widget (each lesson module's
`widget_latency_cases`, in helpers/lessons/, found by `scripts/widget_latency.py`'s
`discover_widget_cases`): one warm-up call, then a timed call per case, in a fresh subprocess, at the lessons'
device and scale. It prints them slowest first and saves them under "widgets".
`--no-widgets` skips that step; `--widgets-only` runs only that step. A widget
that raises is reported as FAILED but does not change the exit status.

Last it times `helpers.memory.measure_step` against a plain step (lesson 06's model,
micro-batch 8, one Adam update of the explainer's loop), interleaved, in a fresh
subprocess, and prints and saves the ratio of the medians under "measure_step_overhead"
(the tracker and the CPU allocator's record together; the target is at most 3x).
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
from concurrent.futures import ThreadPoolExecutor, as_completed
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


def run_one(path: Path, cells: bool, images: Path | None = None, executed: Path | None = None,
            keep_going: bool = False) -> dict:
    """Execute one notebook (in this process) and return its timings; `executed`: save it there.

    `keep_going` runs every cell even after one fails, and reports each failed cell.
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=keep_going,
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    raised = None
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as exc:  # keep what ran and the traceback
        raised = exc
    seconds = time.perf_counter() - start
    failed_cells = [{"cell": i, "ename": o.get("ename", ""), "evalue": str(o.get("evalue", ""))[-600:]}
                    for i, c in enumerate(nb.cells) for o in c.get("outputs", [])
                    if o.get("output_type") == "error"]
    error = dict(failed_cells[0]) if failed_cells else None  # the first failure; with keep_going, all listed
    if raised is not None:  # its full message (a timeout or a dead kernel leaves no error output)
        error = {"cell": error["cell"] if error else None,
                 "ename": getattr(raised, "ename", type(raised).__name__),
                 "evalue": str(getattr(raised, "evalue", raised))[-1500:]}
    if error is not None:
        error["all_failed_cells"] = failed_cells
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
    if error is not None:
        result["error"] = error
    if images is not None:
        result["images"] = save_images(nb, path.stem, images)
    if executed is not None:
        executed.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, executed / path.name)
    if cells:
        result["slowest_cells"] = sorted(per_cell, key=lambda c: -c[1])[:5]
    return result


def run_widgets() -> dict:
    """Time every widget case (in this process) at the lessons' device and scale."""
    from widget_latency import LIMIT_S, latency_table, time_all_cases

    from helpers.core.device import lesson_scale, pick_device

    device = pick_device()
    scale = lesson_scale(device)
    timings = time_all_cases(scale, device, progress=lambda m: print(f"  timing {m} ...", file=sys.stderr,
                                                                     flush=True))
    timed = sorted((t for t in timings if t.seconds is not None), key=lambda t: -t.seconds)
    return {
        "device": str(device),
        "scale": scale,
        "limit_s": LIMIT_S,
        "table": latency_table(timings),
        "cases": [{"case": t.name, "seconds": None if t.seconds is None else round(t.seconds, 3),
                   "error": t.error} for t in timings],
        "slowest": {"case": timed[0].name, "seconds": round(timed[0].seconds, 3)} if timed else None,
        "failed": [t.name for t in timings if t.seconds is None],
    }


OVERHEAD_TARGET = 3.0


def measure_step_overhead(repeats: int = 20) -> dict:
    """Median seconds of a plain step and of `measure_step` of it, interleaved, and their ratio."""
    import statistics

    import torch

    from helpers.core.data import token_batch
    from helpers.lessons.lesson06 import lesson_model
    from helpers.measure.memory import measure_step
    from helpers.techniques.phases import accumulate_update

    model = lesson_model("small", "cpu")
    cfg = model.cfg
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = [token_batch(8, cfg.seq_len, cfg.vocab_size, seed=0)]

    def step() -> None:
        accumulate_update(model, opt, batches)

    runs = {"plain": step, "measure_step": lambda: measure_step(step, model=model, optimizer=opt)}
    for fn in runs.values():
        fn()  # warm-up: Adam's state, the profiler's first start
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(ts) for name, ts in times.items()}
    return {"model": "lesson 06's model (small), micro-batch 8, Adam", "repeats": repeats,
            "plain_s": round(median["plain"], 4), "measure_step_s": round(median["measure_step"], 4),
            "ratio": round(median["measure_step"] / median["plain"], 2), "target": OVERHEAD_TARGET}


def bench_overhead(env: dict[str, str]) -> dict:
    """Run `measure_step_overhead` in a fresh subprocess and print its line."""
    proc = subprocess.run([sys.executable, __file__, "--overhead-child"], stdout=subprocess.PIPE, text=True,
                          env=env, cwd=ROOT)
    if proc.returncode != 0:
        print(f"\nmeasure_step overhead: FAILED (exit status {proc.returncode}; its error is above)")
        return {"error": f"exit status {proc.returncode}"}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    flag = "" if result["ratio"] <= OVERHEAD_TARGET else f"  (over the {OVERHEAD_TARGET:g}x target)"
    print(f"\nmeasure_step overhead: {result['ratio']:.1f}x a plain step (lesson 06's model, B=8; medians "
          f"{1000 * result['measure_step_s']:.0f} ms vs {1000 * result['plain_s']:.0f} ms){flag}")
    return result


def bench_widgets(env: dict[str, str]) -> dict:
    """Run `run_widgets` in a fresh subprocess, print its table and return its summary."""
    print("\nwidgets: one slider move each (a warm-up call, then a timed call)")
    sys.stdout.flush()
    proc = subprocess.run([sys.executable, __file__, "--widgets-child"], stdout=subprocess.PIPE, text=True,
                          env=env, cwd=ROOT)  # its progress and errors go straight to stderr
    if proc.returncode != 0:
        print(f"   FAILED (exit status {proc.returncode}; its error is above)")
        return {"error": f"exit status {proc.returncode}"}
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"(device {summary['device']}, scale {summary['scale']}; the target is <= {summary['limit_s']:g} s "
          f"per move at the small scale on an idle CPU: a figure, not a test; tests/test_widgets.py only "
          f"checks that every move answers)")
    print(summary["table"])
    return summary


def run_child(nb: Path, args: argparse.Namespace, env: dict[str, str]) -> tuple[Path, dict | None, str]:
    """Execute one notebook in a fresh subprocess; return (path, its result or None, stderr's tail)."""
    cmd = [sys.executable, __file__, "--one", str(nb.resolve())] + (["--cells"] if args.cells else [])
    cmd += ["--keep-going"] if args.keep_going else []
    for flag, folder in (("--images", args.images), ("--executed", args.executed)):
        if folder:
            cmd += [flag, str(folder.resolve())]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = proc.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        result = None
    return nb, result, proc.stderr[-2000:] if proc.returncode != 0 else ""


def report(run: tuple[Path, dict | None, str], summary: dict) -> None:
    """Print one notebook's line (and its slowest cells, or its error) and add it to `summary`."""
    nb, res, stderr = run
    if res is None or "error" in res:
        summary["failed"].append(nb.name)
        if res is None:
            print(f"{nb.name:<40}   FAILED\n{stderr}")
            return
        err = res["error"]
        print(f"{nb.name:<40}   FAILED at cell {err['cell']} after {res['seconds']:.1f}s: "
              f"{err['ename']}: {err['evalue'][-600:]}")
        for more in err.get("all_failed_cells", [])[1:]:
            print(f"    and cell {more['cell']}: {more['ename']}: {more['evalue'][-400:]}")
    else:
        flag = "" if res["seconds"] <= TARGET_S else f"  (over the {TARGET_S:.0f} s target)"
        print(f"{res['notebook']:<40}{res['seconds']:>8.1f}s{res['peak_rss_mib']:>7} MiB{flag}")
    summary["results"].append(res)
    summary["results"].sort(key=lambda r: r["notebook"])
    for i, sec, src in res.get("slowest_cells", []):
        print(f"    cell {i:>3}: {sec:6.1f}s  {src}")
    sys.stdout.flush()


def save(summary: dict, out: Path) -> None:
    """Write `summary` as JSON (after each notebook, so a run cut short keeps what finished)."""
    out.write_text(json.dumps(summary, indent=2) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    parser.add_argument("--out", type=Path, default=ROOT / "bench.json")
    parser.add_argument("--cells", action="store_true", help="also list the slowest cells")
    parser.add_argument("--images", type=Path, help="save displayed PNGs into this folder")
    parser.add_argument("--executed", type=Path, help="save each executed notebook (with outputs) here")
    parser.add_argument("--jobs", type=int, default=1, help="notebooks run at a time (default 1)")
    parser.add_argument("--keep-going", action="store_true",
                        help="run every cell even after one fails, and list each failed cell")
    parser.add_argument("--no-widgets", action="store_true", help="do not time the lesson widgets")
    parser.add_argument("--widgets-only", action="store_true", help="only time the lesson widgets")
    parser.add_argument("--no-overhead", action="store_true",
                        help="do not time measure_step against a plain step (a CPU figure)")
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # internal: child mode
    parser.add_argument("--widgets-child", action="store_true", help=argparse.SUPPRESS)  # internal
    parser.add_argument("--overhead-child", action="store_true", help=argparse.SUPPRESS)  # internal
    args = parser.parse_args()
    if args.no_widgets and args.widgets_only:
        parser.error("--no-widgets and --widgets-only contradict each other")
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    if args.widgets_child:
        sys.path.insert(0, str(ROOT))
        print(json.dumps(run_widgets()))
        return 0
    if args.overhead_child:
        sys.path.insert(0, str(ROOT))
        print(json.dumps(measure_step_overhead()))
        return 0
    if args.one:
        images = args.images.resolve() if args.images else None
        executed = args.executed.resolve() if args.executed else None
        result = run_one(args.one, args.cells, images, executed, args.keep_going)
        print(json.dumps(result))
        return 1 if "error" in result else 0

    notebooks = [] if args.widgets_only else (
        args.notebooks or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")))
    env = {**os.environ, "MPLBACKEND": "Agg"}
    summary = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
        "scale": os.environ.get("LESSONS_SCALE", "default (small on CPU, full on CUDA)"),
        "device": os.environ.get("LESSONS_DEVICE", "auto"),
        "jobs": args.jobs,
        "results": [],
        "failed": [],
    }
    if notebooks:
        at_a_time = f"  ({args.jobs} at a time)" if args.jobs > 1 else ""
        print(f"{'notebook':<40}{'seconds':>9}{'peak RSS':>11}{at_a_time}")
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        runs = [pool.submit(run_child, nb, args, env) for nb in notebooks]
        for done in as_completed(runs):
            report(done.result(), summary)
            save(summary, args.out)
    widgets = None if args.no_widgets else bench_widgets(env)
    overhead = None if args.widgets_only or args.no_overhead else bench_overhead(env)
    if widgets is not None:
        summary["widgets"] = widgets
    if overhead is not None:
        summary["measure_step_overhead"] = overhead
    save(summary, args.out)
    print(f"saved {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
