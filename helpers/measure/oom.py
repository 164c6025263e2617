"""Read a CUDA out-of-memory message and say which memory ran out (instrument, lesson 00).

When the caching allocator cannot find a block it raises `torch.cuda.OutOfMemoryError`
whose message carries the numbers that decide what to do next. torch 2.1 and later print::

    CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.54 GiB
    of which 1.06 GiB is free. Including non-PyTorch memory, this process has 22.47 GiB memory
    in use. Of the allocated memory 19.80 GiB is allocated by PyTorch, and 2.04 GiB is reserved
    by PyTorch but unallocated. If reserved but unallocated memory is large try setting
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation. ...

(other processes on the GPU appear as "Process 1234 has 3.00 GiB memory in use."; a cap set
with `torch.cuda.set_per_process_memory_fraction` as "18.00 GiB allowed;"). torch 2.0 and
earlier printed "Tried to allocate 2.00 GiB (GPU 0; 23.54 GiB total capacity; 19.80 GiB already
allocated; 1.06 GiB free; 21.84 GiB reserved in total by PyTorch)". Both are read here.

.. warning::
    The process list comes from NVML, which names each process by the PID it has on the host;
    torch calls the entry whose PID equals `os.getpid()` "this process". Inside a container with
    its own PID namespace the two differ, so your own job is listed as "Process N" and the message
    has no "this process" part. `read_oom_message` then takes the one listed process that holds at
    least what PyTorch reserved here for this process (`OOMReport.own_pid`) and says so, instead of
    telling you to stop it.

- `read_oom_message(text)` -> `OOMReport`: every number of the message, in bytes;
- `OOMReport.diagnosis()`: which part of the card is full, in the order of the course's
  decision rule (`helpers.planner.DECISION_RULE`): a request larger than the card, memory
  outside PyTorch (the CUDA context, other processes), fragmentation (reserved but not
  allocated), or tensors (allocated by PyTorch: profile which ones, then apply the rule).
- `ALLOCATOR_SETTINGS`: the caching allocator's environment variables and the options the
  diagnosis names, as the installed torch 2.13 reads them (see its NOTE).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from helpers.core.validate import ArgTypeError

__all__ = ["ALLOCATOR_SETTINGS", "OOMReport", "format_size", "parse_size", "read_oom_message"]

_UNITS = {"bytes": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_SIZE = r"([0-9]+(?:\.[0-9]+)?) (bytes|B|KiB|MiB|GiB|TiB)"
# A share of the card above which a part counts as "large" in the diagnosis.
LARGE_SHARE = 0.10

# NOTE [allocator settings]: read from the installed torch 2.13 (c10/cuda/CUDAAllocatorConfig.h and
# c10/core/AllocatorConfig.h in its include/ folder; the variable names in libc10.so): the caching
# allocator takes its options from the first of PYTORCH_CUDA_ALLOC_CONF, (ROCm builds:
# PYTORCH_HIP_ALLOC_CONF,) PYTORCH_ALLOC_CONF that is set, so the device-generic name applies when
# the CUDA one is unset. PYTORCH_ALLOC_CONF exists since torch 2.8; 2.8 to 2.11 warned that
# PYTORCH_CUDA_ALLOC_CONF is deprecated, 2.13 no longer does; in 2.9.1 its expandable_segments was
# ignored on CUDA (pytorch/pytorch#183387, fixed by 2.11). garbage_collection_threshold acts only
# under a per-process cap (`torch.cuda.set_per_process_memory_fraction`): the allocator runs it
# only when a cap is set. Both max_split_size_mb and garbage_collection_threshold are ignored under
# backend:cudaMallocAsync.
ALLOCATOR_SETTINGS: dict[str, str] = {
    "PYTORCH_ALLOC_CONF": "the device-generic variable (torch 2.8 and later); read when "
                          "PYTORCH_CUDA_ALLOC_CONF is not set",
    "PYTORCH_CUDA_ALLOC_CONF": "the CUDA name, still read first by torch 2.13 (and the only one before 2.8)",
    "expandable_segments:True": "segments that grow in place instead of new fixed blocks: the usual "
                                "fix for fragmentation",
    "max_split_size_mb:N": "never split a cached block larger than N MB for a smaller request, so "
                           "large blocks stay whole for large tensors",
    "garbage_collection_threshold:F": "under a per-process cap, free old unused cached blocks once "
                                      "usage passes the fraction F of the cap, before the costly "
                                      "free-everything-and-retry",
}


def parse_size(text: str) -> int:
    """Bytes of a size as the CUDA allocator prints it: "2.00 GiB", "512.00 MiB", "20 bytes".

    Args:
        text: the size.

    Returns:
        The bytes.

    Raises:
        ValueError: if `text` is not such a size.
    """
    m = re.fullmatch(r"\s*" + _SIZE + r"\s*", text)
    if m is None:
        raise ValueError(f"cannot read {text!r} as a size; expected e.g. '2.00 GiB' or '20 bytes'")
    return round(float(m.group(1)) * _UNITS[m.group(2)])


def format_size(n: float) -> str:
    """Bytes in the allocator's own style: "2.00 GiB", "1.50 MiB", "512 bytes"."""
    for unit in ("GiB", "MiB", "KiB"):
        if abs(n) >= _UNITS[unit]:
            return f"{n / _UNITS[unit]:.2f} {unit}"
    return f"{int(n)} bytes"


@dataclass(frozen=True)
class OOMReport:
    """The numbers of one CUDA out-of-memory message, in bytes (None where the message has none).

    - `requested`: the allocation that failed;
    - `total`, `free`: the GPU's capacity and what the driver had left;
    - `process_in_use`: all this process holds, PyTorch's and the CUDA context's
      (torch >= 2.1 only);
    - `other_processes`: memory other processes hold on the same GPU, summed;
    - `allocated`: held by live tensors; `reserved_unallocated`: cached by the allocator
      but in no tensor (where fragmentation shows);
    - `allowed`: a per-process cap (`set_per_process_memory_fraction`), if one was set;
    - `style`: "torch>=2.1" or "torch<2.1", the message format that was read;
    - `processes`: the (PID, bytes) of every "Process N has ..." entry, as NVML listed them;
    - `own_pid`: set when the message names no process "this process" (a container: NVML's PID
      is not `os.getpid()`) and a listed process holds at least PyTorch's reserved memory: the
      PID read as this process (its bytes are `process_in_use`, not `other_processes`);
    - `own_pid_candidates`: every listed PID large enough to be this process; more than one means
      the message cannot tell which is yours.
    """

    requested: int
    total: int
    free: int
    allocated: int
    reserved_unallocated: int
    process_in_use: int | None = None
    other_processes: int = 0
    allowed: int | None = None
    style: str = "torch>=2.1"
    processes: tuple[tuple[int, int], ...] = ()
    own_pid: int | None = None
    own_pid_candidates: tuple[int, ...] = ()

    @property
    def reserved(self) -> int:
        """What the caching allocator holds: allocated plus cached-but-unallocated."""
        return self.allocated + self.reserved_unallocated

    @property
    def outside_pytorch(self) -> int | None:
        """This process's memory the allocator does not hold (the CUDA context, libraries)."""
        if self.process_in_use is None:
            return None
        return max(0, self.process_in_use - self.reserved)

    @property
    def capacity(self) -> int:
        """What this process may use: the cap when one is set, else the card."""
        return self.allowed if self.allowed is not None else self.total

    def rows(self) -> list[tuple[str, str]]:
        """(what, how much) rows for a table, largest parts first."""
        rows = [("the allocation that failed", format_size(self.requested)),
                ("GPU capacity", format_size(self.total))]
        if self.allowed is not None:
            rows.append(("this process's cap", format_size(self.allowed)))
        rows += [("free on the GPU when it failed", format_size(self.free)),
                 ("allocated by PyTorch (live tensors)", format_size(self.allocated)),
                 ("reserved but unallocated (cached)", format_size(self.reserved_unallocated))]
        if self.own_pid is not None and self.process_in_use is not None:
            rows.append((f"process {self.own_pid}, read as this process (a container's PID)",
                         format_size(self.process_in_use)))
        if self.outside_pytorch is not None:
            rows.append(("this process outside PyTorch (CUDA context, libraries)",
                         format_size(self.outside_pytorch)))
        if self.other_processes:
            rows.append(("other processes on this GPU", format_size(self.other_processes)))
        return rows

    def diagnosis(self) -> list[str]:
        """What ran out, and the first thing to try, most decisive first (one line each)."""
        out = []
        cap = self.capacity
        if self.requested > cap:
            out.append(f"The one allocation ({format_size(self.requested)}) is larger than everything "
                       f"this process may use ({format_size(cap)}): no freeing helps. Shrink the tensor (a "
                       "smaller micro-batch or sequence, chunked cross-entropy for a large vocabulary) or "
                       "shard it.")
        if self.own_pid is not None:
            out.append(self._container_line())
        if self.other_processes >= LARGE_SHARE * self.total:
            if len(self.own_pid_candidates) > 1:
                out.append(f"Other processes may hold {format_size(self.other_processes)} of this GPU: "
                           "find out which listed process is yours before you stop any.")
            else:
                out.append(f"Other processes hold {format_size(self.other_processes)} of this GPU: stop "
                           "them (or pick another GPU) before tuning your job.")
        outside = self.outside_pytorch or 0
        if outside >= LARGE_SHARE * self.total:
            out.append(f"{format_size(outside)} of this process is outside PyTorch's allocator (the CUDA "
                       "context, NCCL, other libraries): budget for it, it is not yours to plan with.")
        unalloc = self.reserved_unallocated
        if unalloc >= LARGE_SHARE * cap or (unalloc >= self.requested and unalloc >= 0.01 * cap):
            out.append(f"{format_size(unalloc)} is cached but in no tensor (the allocator already "
                       "released what it could before it raised): fragmentation. Before Python starts, set "
                       "PYTORCH_ALLOC_CONF=expandable_segments:True (torch 2.8 and later; "
                       "PYTORCH_CUDA_ALLOC_CONF, the older name, is read first when both are set). "
                       "Otherwise max_split_size_mb:N keeps cached blocks above N MB whole for large "
                       "tensors. Keep tensor sizes steady between steps.")
        if not out or self.allocated >= 0.5 * cap:
            out.append(f"Live tensors hold {format_size(self.allocated)} of {format_size(cap)} at the "
                       f"moment of the error. That is not the peak the step needs: it needs at least "
                       f"{format_size(self.allocated + self.requested)} there, and more later if the error "
                       "came before the step's peak (during the forward, say). Measure the peak "
                       "(torch.cuda.max_memory_allocated at a smaller micro-batch, or python -m "
                       "helpers.plan), see which part it is (weights + gradients + optimizer state, or "
                       "activations) and apply the decision rule: a floor that does not fit needs "
                       "sharding, offloading or smaller state; activations need a smaller micro-batch "
                       "with accumulation, then checkpointing.")
        return out

    def _container_line(self) -> str:
        """The diagnosis line for a message that names no process as "this process"."""
        own = format_size(self.process_in_use or 0)
        if len(self.own_pid_candidates) > 1:
            pids = ", ".join(str(p) for p in self.own_pid_candidates)
            return (f"No listed process is called \"this process\": in a container NVML names processes "
                    f"by their host PID, not os.getpid(). Processes {pids} each hold at least the "
                    f"{format_size(self.reserved)} PyTorch reserved here, so any of them may be this job; "
                    f"this page reads the smallest, {self.own_pid} ({own}), as yours. Check on the host "
                    "(nvidia-smi) before you stop one.")
        return (f"No listed process is called \"this process\": in a container NVML names processes by "
                f"their host PID, not os.getpid(). Process {self.own_pid} ({own}) is the only one holding "
                f"at least the {format_size(self.reserved)} PyTorch reserved here, so it is read as this "
                "job: do not stop it.")


_NEW = re.compile(
    r"Tried to allocate " + _SIZE + r"\. GPU (\d+) has a total capacity of " + _SIZE
    + r" of which " + _SIZE + r" is free\.")
_OLD = re.compile(
    r"Tried to allocate " + _SIZE + r" \(GPU (\d+); " + _SIZE + r" total capacity; " + _SIZE
    + r" already allocated; " + _SIZE + r" free; (?:" + _SIZE + r" allowed; )?" + _SIZE
    + r" reserved in total by PyTorch\)")


def _size(groups: tuple[str | None, ...], i: int) -> int:
    return round(float(groups[i]) * _UNITS[groups[i + 1]])


def read_oom_message(text: str) -> OOMReport:
    """Read the numbers of a CUDA out-of-memory message (torch 2.1+ or the older format).

    Args:
        text: the message, e.g. `str(err)` of a `torch.cuda.OutOfMemoryError`, or pasted from a
            log (line breaks are fine).

    Returns:
        OOMReport: every size in bytes, and `diagnosis()` for what to do first.

    Raises:
        ValueError: when `text` is not a CUDA out-of-memory message.
    """
    if not isinstance(text, str):
        raise ArgTypeError(f"text must be the message as a str, got {type(text).__name__}")
    flat = " ".join(text.split())
    m = _NEW.search(flat)
    if m is not None:
        g = m.groups()
        requested, total, free = _size(g, 0), _size(g, 3), _size(g, 5)
        own = re.search(r"this process has " + _SIZE + r" memory in use", flat)
        processes = tuple((int(pid), round(float(a) * _UNITS[u])) for pid, a, u in
                          re.findall(r"Process (\d+) has " + _SIZE + r" memory in use", flat))
        allowed = re.search(_SIZE + r" allowed;", flat)
        alloc = re.search(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch", flat)
        unalloc = re.search(_SIZE + r" is reserved by PyTorch but unallocated", flat)
        if alloc is None or unalloc is None:
            raise ValueError("the message has no 'Of the allocated memory ... reserved by PyTorch but "
                             f"unallocated' part; got: {flat[:200]!r}")
        allocated, unallocated = _size(alloc.groups(), 0), _size(unalloc.groups(), 0)
        in_use = None if own is None else _size(own.groups(), 0)
        own_pid, candidates = None, ()
        if own is None:  # a container: this process may be listed under its host PID
            candidates = tuple(pid for pid, used in sorted(processes, key=lambda e: e[1])
                               if used >= allocated + unallocated)
            if candidates:
                own_pid = candidates[0]
                in_use = dict(processes)[own_pid]
        others = sum(used for pid, used in processes if pid != own_pid)
        return OOMReport(
            requested, total, free, allocated, unallocated, process_in_use=in_use, other_processes=others,
            allowed=None if allowed is None else _size(allowed.groups(), 0), style="torch>=2.1",
            processes=processes, own_pid=own_pid, own_pid_candidates=candidates)
    m = _OLD.search(flat)
    if m is not None:
        g = m.groups()
        allocated, reserved = _size(g, 5), _size(g, 11)
        allowed = None if g[9] is None else _size(g, 9)
        return OOMReport(_size(g, 0), _size(g, 3), _size(g, 7), allocated, max(0, reserved - allocated),
                         allowed=allowed, style="torch<2.1")
    raise ValueError("this is not a CUDA out-of-memory message: it has no 'Tried to allocate X. GPU n has "
                     f"a total capacity of ...' part; got: {flat[:200]!r}")
