"""The plan beside real GPU steps: the calibration rows each GPU run commits, replayed on any machine.

A `make gpu` run measures real training steps on its card (`torch.cuda.max_memory_allocated`, the
caching allocator's own record) and writes them, with the plan it made for each, to one JSON file in
docs/calibration/. `load_rows` reads every file; `replay` plans a row's configuration with today's
planner (a meta profile for the row's compute capability, so it runs on a CPU); `replay_error` is
real / plan - 1 (positive: the real step was above the plan, the unsafe side); `status` is the line
`python -m helpers.plan --gpu X` prints about the card's calibration.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from helpers.core.validate import instance_arg

__all__ = ["CALIBRATION_DIR", "CalibrationRow", "load_rows", "replay", "replay_error", "status"]

CALIBRATION_DIR = Path(__file__).resolve().parents[2] / "docs" / "calibration"
GIB = 2**30


@dataclass(frozen=True)
class CalibrationRow:
    """One measured step on a GPU and the configuration it ran."""

    device: str
    capability: int  # 90 for sm_90
    torch: str
    date: str
    model: str
    precision: str
    checkpoint: str
    micro_batch: int
    accumulation_steps: int
    seq_len: int
    allocated_bytes: int  # max_memory_allocated of the real step
    rounding_bytes: int  # how precisely the record gives it (a figure kept to 3 decimals of a GiB: 0.5 MiB)
    plan_bytes_then: int  # the plan at the commit that measured it
    source: str

    @property
    def label(self) -> str:
        """A short name: model, precision, B x K, tokens."""
        return (f"{self.model} {self.precision} B={self.micro_batch} K={self.accumulation_steps} "
                f"seq {self.seq_len} ckpt {self.checkpoint}")


def _bytes(row: dict, name: str, gib_name: str) -> int:
    """A size from a row: `name` in bytes (what scripts/plan_vs_cuda.py writes) or `gib_name` in GiB (rows
    recovered from a printed record)."""
    return int(row[name]) if name in row else round(row[gib_name] * GIB)


def _row(run: dict, row: dict) -> CalibrationRow:
    major, minor = run["capability"]
    return CalibrationRow(
        device=run["device"], capability=10 * major + minor, torch=run["torch"], date=run["date"],
        model=row["model"], precision=row["precision"], checkpoint=row["checkpoint"],
        micro_batch=row["B"], accumulation_steps=row["K"], seq_len=row["seq_len"],
        allocated_bytes=_bytes(row, "max_memory_allocated_bytes", "max_memory_allocated_gib"),
        rounding_bytes=round(row.get("rounding_gib", 0.0) * GIB),
        plan_bytes_then=_bytes(row, "plan_bytes", "plan_gib_at_measuring_commit"), source=row["source"])


def load_rows(directory: Path | None = None) -> list[CalibrationRow]:
    """Every replayable row of every docs/calibration/*.json.

    Args:
        directory: the folder to read (default: the repository's docs/calibration/).

    Returns:
        The rows, file by file in name order; none when the folder is absent (as in a wheel install).
    """
    folder = CALIBRATION_DIR if directory is None else instance_arg("directory", directory, Path)
    rows: list[CalibrationRow] = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        record = json.loads(path.read_text())
        rows.extend(_row(record["run"], row) for row in record["rows"])
    return rows


def replay(row: CalibrationRow) -> int:
    """Today's plan of what the row's step allocates on its card, computed without a GPU.

    Args:
        row: a committed measurement (`load_rows`).

    Returns:
        Bytes: a meta profile of the row's preset and configuration for the row's compute capability,
        plus the cuBLAS workspaces the plan models (`cards.cublas_workspace_bytes`, with
        CUBLAS_WORKSPACE_CONFIG unset, as the runs measure).
    """
    from helpers.meta.profiler import Profiler
    from helpers.plan.cards import cublas_workspace_bytes
    from helpers.plan.presets import preset_spec

    instance_arg("row", row, CalibrationRow)
    build, spec, _ = preset_spec(row.model, row.seq_len)
    profiler = Profiler(build, spec, "adam", target="cuda", precision=row.precision,
                        capability=row.capability)
    tensors = profiler.step(row.micro_batch, checkpoint=row.checkpoint,
                            accumulation_steps=row.accumulation_steps).peak_bytes
    return tensors + cublas_workspace_bytes(row.capability, config="")


def replay_error(row: CalibrationRow, plan_bytes: int | None = None) -> float:
    """real / plan - 1 for the row (today's plan unless `plan_bytes` is given): above 0, the real step
    needed more than the plan said."""
    plan = replay(row) if plan_bytes is None else plan_bytes
    return row.allocated_bytes / plan - 1


def status(gpu: str, rows: list[CalibrationRow] | None = None) -> str:
    """One line: is the plan calibrated on this card, on which run, how many rows, the worst error of
    the plans those runs made (their recorded plans; `replay_error` gives today's)."""
    instance_arg("gpu", gpu, str)
    found = [r for r in (load_rows() if rows is None else rows)
             if gpu.upper().replace(" ", "") in r.device.upper().replace(" ", "")]
    if not found:
        return (f"{gpu}: not calibrated (no GPU run measured this card); the CUDA terms are modelled "
                "only, and the plan keeps its CUDA margin free")
    worst = max(found, key=lambda r: r.allocated_bytes / r.plan_bytes_then)
    err = worst.allocated_bytes / worst.plan_bytes_then - 1
    side = "real above the plan: the unsafe side" if err > 0 else "plan at or above real"
    runs = sorted({(r.device, r.torch, r.date) for r in found})
    return (f"calibrated on {', '.join(f'{d}, torch {t}, {day}' for d, t, day in runs)}: {len(found)} "
            f"row{'s' if len(found) != 1 else ''}, worst {err:+.1%} ({side}; {worst.label})")
