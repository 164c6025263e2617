"""The CPU allocator's own record of a run, matched to the tracker's storages (core: lessons 01, 06, 09).

A dispatch-level tracker (`helpers.measure.tracker.MemoryTracker`, saved-tensor hooks, torch's
MemTracker) sees every storage an op returns, but not a buffer that a kernel allocates
inside itself and frees before it returns: the CPU flash-attention backward's own work
buffers, for example. The CPU allocator sees those too. With `profile_memory=True`,
PyTorch's profiler records each allocation and free the allocator makes: its address,
its size and its time (`time.time_ns()`'s clock).

- `AllocatorRecord`: a context manager that takes that record for its region. The
  profiler runs with memory events only (no op events), so it costs little.
- `allocator_timeline(tracker, events)`: live bytes after every allocator event, split
  into the tracker's categories, with a separate count of what kernels allocated inside
  themselves (`Timeline.inside_kernels`).

NOTE [Matching the allocator to the tracker]
--------------------------------------------
The tracker keeps, for each storage, its address and the time it first saw it, and for
each op its time window. An allocation is a tracked storage when its address and size
are that storage's and it is the latest such allocation before the tracker saw the
storage (the block is alive then, so no other block had that address). Every other
allocation is "other": "inside kernels" when it falls inside an op's window (a buffer
of that kernel, freed or not by the time the op returns), untracked otherwise. Storages
that existed before the region (the model's state) are known to the tracker; their
frees, which the allocator does not report for blocks allocated before profiling
started, come from the tracker's finalizers. A tracked storage with no matching
allocation (no record was taken) keeps its tracker lifetime, so without a record the
timeline is the tracker's own.

Two things the profiler prints are kept off stderr, where a notebook cell must stay
clean: Kineto's "profiler_start/stop" lines for this record's own start and stop
(`KINETO_LOG_LEVEL` is set to 6 unless you set it, and the lines are filtered in case
Kineto was started before) and c10's line about freeing a block "of unknown size" (one
that was allocated before profiling started: the model's state, for instance). The
region's stderr is held in a file and passed on without those lines; nothing else is
held back.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import math
import os
import sys
import tempfile
from collections.abc import Iterator

from helpers.core.device import CPU_TRACKER
from helpers.measure.timeline import CATEGORIES, Timeline, _category, _Record
from helpers.measure.tracker import MemoryTracker

__all__ = ["AllocatorRecord", "allocator_timeline"]

_UNKNOWN_FREE = b"Memory block of unknown size was allocated before the profiling started"
_KINETO_START_STOP = (b"] profiler_start", b"] profiler_stop")  # Kineto's lines for our own start and stop


def _ours(line: bytes) -> bool:
    """A line the record itself makes c10 or Kineto print (nothing else is held back)."""
    kineto = b"ActivityProfiler" in line and line.rstrip().endswith(_KINETO_START_STOP)
    return kineto or _UNKNOWN_FREE in line


@contextlib.contextmanager
def _without_unknown_free_lines() -> Iterator[None]:
    """Send file descriptor 2 to a temporary file, then pass on all but the record's own lines (`_ours`)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no usable stderr: nothing to keep clean
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines = tmp.read().splitlines(keepends=True)
            kept = b"".join(line for line in lines if not _ours(line))
            if kept:
                os.write(2, kept)


def _start_profiler() -> None:
    """Start PyTorch's profiler with memory events only (raises if this torch cannot)."""
    import torch  # noqa: F401  (the profiler needs torch loaded before KINETO_LOG_LEVEL is read)
    from torch._C._profiler import RecordScope
    from torch.autograd import _enable_profiler, _prepare_profiler
    from torch.autograd.profiler import profile

    os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # Kineto's start/stop lines off stderr
    wrapper = profile(use_kineto=True, profile_memory=True)  # its config and CPU activity
    config = wrapper.config()
    _prepare_profiler(config, wrapper.kineto_activities)
    # Only user scopes record op events; memory events are recorded whatever the scopes.
    _enable_profiler(config, wrapper.kineto_activities, {RecordScope.USER_SCOPE})


def _profiler_running() -> bool:
    try:
        import torch

        return bool(torch._C._autograd._profiler_enabled())
    except AttributeError:  # an older torch without the query: assume none
        return False


def _cpu_events(result: object) -> list[tuple[int, int, int]]:
    """(time ns, address, bytes; negative for a free) of every CPU allocator event, in time order."""
    import torch
    from torch._C._profiler import _ExtraFields_Allocation

    check_device = torch.cuda.is_initialized()  # only then can another device's events be there
    events, todo = [], list(result.experimental_event_tree())
    while todo:
        node = todo.pop()
        fields = node.extra_fields
        if type(fields) is _ExtraFields_Allocation:
            if not check_device or fields.device.type == "cpu":
                events.append((node.start_time_ns, fields.ptr, fields.alloc_size))
        else:  # an op or user scope: allocations may sit below it
            todo.extend(node.children)
    events.sort(key=lambda e: e[0])
    return events


class AllocatorRecord:
    """Record every CPU allocator allocation and free made inside the `with` block.

    After the block, `events` holds (time ns, address, bytes) tuples, a free with negative
    bytes, and `recorded` is True. If this torch cannot take the record (another profiler
    is running, or its private profiler API differs), `recorded` is False, `reason` says
    why, and `events` is empty: `allocator_timeline` then gives the tracker's own figures.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.events: list[tuple[int, int, int]] = []
        self.recorded = False
        self.reason = "" if enabled else "not enabled"
        self._quiet: contextlib.AbstractContextManager | None = None

    def __enter__(self) -> AllocatorRecord:
        if not self.enabled:
            return self
        if _profiler_running():
            self.reason = "another profiler is running, so the CPU allocator's record was not taken"
            return self
        self._quiet = _without_unknown_free_lines()
        self._quiet.__enter__()
        try:
            _start_profiler()
        except (ImportError, AttributeError, TypeError, RuntimeError) as err:
            self.reason = f"the CPU allocator's record is unavailable ({type(err).__name__}: {err})"
            self._quiet.__exit__(None, None, None)
            self._quiet = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._quiet is None:
            return
        try:
            from torch.autograd import _disable_profiler

            result = _disable_profiler()
        finally:
            self._quiet.__exit__(None, None, None)
            self._quiet = None
        try:
            self.events = _cpu_events(result)
        except (AttributeError, TypeError, RuntimeError) as err:  # a torch whose event tree differs
            self.reason = f"the CPU allocator's record could not be read ({type(err).__name__}: {err})"
            return
        self.recorded = True


def _match(records: list[_Record], events: list[tuple[int, int, int]]) -> dict[int, _Record]:
    """Allocation event index -> the tracked storage it made (see NOTE [Matching ...])."""
    by_ptr: dict[int, list[int]] = {}
    for i, (_, ptr, size) in enumerate(events):
        if size > 0:
            by_ptr.setdefault(ptr, []).append(i)
    owner: dict[int, _Record] = {}
    for rec in records:
        candidates = by_ptr.get(rec.ptr, [])
        # the latest allocation at this address before the tracker saw the storage
        j = bisect.bisect_right(candidates, rec.born_ns, key=lambda i: events[i][0]) - 1
        if j >= 0 and events[candidates[j]][2] == rec.born_nbytes and candidates[j] not in owner:
            owner[candidates[j]] = rec
    return owner


def allocator_timeline(
    tracker: MemoryTracker, events: list[tuple[int, int, int]], *, released: bool = False
) -> Timeline:
    """Live bytes after every CPU allocator event of a tracked region, by the tracker's categories.

    Args:
        tracker: the `MemoryTracker` that watched the region (after it exited).
        events: the `AllocatorRecord.events` of the same region.
        released: let the storages that `MemoryTracker.could_release` marked die at their
            release point (the loop with `del predictions`), as `tracker.timeline` does.

    Returns:
        A `Timeline` with one sample per event and one after each op (and one at the
        start), whose `ops` and
        `phases` are those of the op running (or last run) at that moment, whose marks
        point at the last sample before each mark, and whose `inside_kernels` counts the
        bytes of "other" that kernels allocated inside themselves. The allocator's live
        bytes, plus the model state that existed before, is `Timeline.total`.
    """
    records = [r for r in tracker.records if r.nbytes > 0 and not r.inside]
    before = [r for r in records if r.born == 0]
    made = [r for r in records if r.born > 0]
    owner = _match(made, events)
    owned = {id(r) for r in owner.values()}
    windows = tracker.windows
    starts = [w[0] for w in windows]
    base = dict.fromkeys((*CATEGORIES, "inside"), 0)
    for rec in before:
        base[_category(rec)] += rec.nbytes
    # (time, order, category, bytes, inside) changes; order keeps the allocator's sequence on ties
    changes: list[tuple[float, int, str, int, bool]] = []
    for rec in before:
        if rec.died_ns != math.inf:
            changes.append((rec.died_ns, len(changes), _category(rec), -rec.nbytes, False))
    open_blocks: dict[int, tuple[str, int, bool, _Record | None]] = {}
    for i, (t, ptr, size) in enumerate(events):
        if size > 0:
            rec = owner.get(i)
            j = bisect.bisect_right(starts, t) - 1
            inside = rec is None and j > 0 and t <= windows[j][1]
            cat = _category(rec) if rec is not None else "other"
            open_blocks[ptr] = (cat, size, inside, rec)
            changes.append((t, len(changes), cat, size, inside))
        elif ptr in open_blocks:  # a free of a block from before the region is the tracker's to count
            cat, n, inside, rec = open_blocks.pop(ptr)
            when = min(t, rec.release_ns) if released and rec is not None else t
            changes.append((when, len(changes), cat, -n, inside))
    for cat, n, inside, rec in open_blocks.values():  # still alive after the region
        if released and rec is not None and rec.release_ns != math.inf:
            changes.append((rec.release_ns, len(changes), cat, -n, inside))
    for rec in made:
        if id(rec) not in owned:  # no allocation matched: keep the tracker's lifetime
            changes.append((rec.born_ns, len(changes), _category(rec), rec.nbytes, False))
            end = min(rec.died_ns, rec.release_ns) if released else rec.died_ns
            if end != math.inf:
                changes.append((end, len(changes), _category(rec), -rec.nbytes, False))
    for _, t1 in windows[1:]:  # a sample after every op, so that a phase that allocates nothing has one
        changes.append((t1, len(changes), "other", 0, False))
    changes.sort(key=lambda c: (c[0], c[1]))
    return _samples(tracker, changes, base)


def _samples(tracker: MemoryTracker, changes: list[tuple[float, int, str, int, bool]],
             base: dict[str, int]) -> Timeline:
    """One sample at the start and after each change: running sums per category (C-speed accumulate)."""
    starts = [w[0] for w in tracker.windows]
    times = [tracker.windows[0][0], *(c[0] for c in changes)]
    series = {
        name: list(itertools.accumulate(
            (c[3] if (c[4] if name == "inside" else c[2] == name) else 0 for c in changes), initial=start))
        for name, start in base.items()
    }
    index = [max(0, bisect.bisect_right(starts, t) - 1) for t in times]
    ops, phases = [tracker.ops[j] for j in index], [tracker.phases[j] for j in index]
    ops[0], phases[0] = tracker.ops[0], tracker.phases[0]
    marks = [(max(0, bisect.bisect_right(times, t) - 1), label)
             for t, (_, label) in zip(tracker.mark_ns, tracker.marks, strict=True)]
    inside_kernels = series.pop("inside")
    return Timeline(ops, phases, series, marks, method=CPU_TRACKER, inside_kernels=inside_kernels)
