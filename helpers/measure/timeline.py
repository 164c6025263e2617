"""Live bytes by category after every op, from storage lifetimes (core, all lessons).

`helpers.measure.tracker.MemoryTracker` keeps one `_Record` per storage (its size, the op it was born
at, the op it died at, its role or phase); `build_timeline` turns those records into a
`Timeline`: live bytes per category (`CATEGORIES`) after each op, a pure function.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from helpers.core.device import TENSOR_TRACKER

__all__ = ["CATEGORIES", "Timeline", "build_timeline"]

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "other")


@dataclass
class Timeline:
    """Live bytes by category after every op of a tracked region."""

    ops: list[str]
    phases: list[str]
    series: dict[str, list[int]]
    marks: list[tuple[int, str]] = field(default_factory=list)
    method: str = TENSOR_TRACKER
    inside_kernels: list[int] = field(default_factory=list)  # of "other": bytes allocated inside kernels

    @property
    def total(self) -> list[int]:
        """Live bytes after each op, all categories together."""
        return [sum(vals) for vals in zip(*self.series.values(), strict=True)]

    @property
    def peak_index(self) -> int:
        """Index of the first op at which live memory was largest."""
        total = self.total
        return max(range(len(total)), key=total.__getitem__)

    def at(self, index: int) -> dict[str, int]:
        """Breakdown by category after op `index`."""
        return {name: values[index] for name, values in self.series.items()}

    def inside_at(self, index: int) -> int:
        """Bytes of "other" after op `index` that a kernel allocated inside itself (0 if unknown)."""
        return self.inside_kernels[index] if self.inside_kernels else 0


@dataclass
class _Record:
    nbytes: int
    born: int
    died: float = math.inf
    role: str | None = None  # fixed category, or None to decide by phase
    phase: str = "forward"
    ptr: int = 0  # the storage's address when it was born
    born_nbytes: int = 0  # its size then (a storage resized in place grows later)
    born_ns: int = 0
    died_ns: float = math.inf
    release: float = math.inf  # op at which a `del predictions` loop drops it
    release_ns: float = math.inf
    inside: bool = False  # a kernel's own buffer (declared by `kernel_buffers`)

    def end(self, released: bool = False) -> float:
        """The op after which it is gone: when it died, or its release point if earlier."""
        return min(self.died, self.release) if released else self.died


def _category(rec: _Record) -> str:
    if rec.role is not None:
        return rec.role
    return "activations" if rec.phase in ("forward", "recompute") else "other"


def build_timeline(
    records: Iterable[_Record], ops: list[str], phases: list[str], marks: list[tuple[int, str]], *,
    released: bool = False,
) -> Timeline:
    """Live bytes by category after each of `ops`, from storage lifetimes (a pure function).

    With `released`, a record dies at its release point when that comes first (`_Record.end`).
    """
    n = len(ops)
    diffs = {name: [0] * (n + 1) for name in (*CATEGORIES, "inside")}
    for rec in records:
        if rec.nbytes == 0:
            continue
        died = rec.end(released)
        end = n if died == math.inf else int(died) + 1
        for name in (_category(rec), "inside") if rec.inside else (_category(rec),):
            diffs[name][rec.born] += rec.nbytes
            diffs[name][min(end, n)] -= rec.nbytes
    series = {name: list(itertools.accumulate(d[:n])) for name, d in diffs.items()}
    inside = series.pop("inside")
    return Timeline(list(ops), list(phases), series, list(marks), inside_kernels=inside)
