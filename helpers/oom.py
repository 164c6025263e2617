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

- `read_oom_message(text)` -> `OOMReport`: every number of the message, in bytes;
- `OOMReport.diagnosis()`: which part of the card is full, in the order of the course's
  decision rule (`helpers.planner.DECISION_RULE`): a request larger than the card, memory
  outside PyTorch (the CUDA context, other processes), fragmentation (reserved but not
  allocated), or tensors (allocated by PyTorch: profile which ones, then apply the rule).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from helpers.validate import ArgTypeError

__all__ = ["OOMReport", "format_size", "parse_size", "read_oom_message"]

_UNITS = {"bytes": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_SIZE = r"([0-9]+(?:\.[0-9]+)?) (bytes|B|KiB|MiB|GiB|TiB)"
# A share of the card above which a part counts as "large" in the diagnosis.
LARGE_SHARE = 0.10


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
    - `style`: "torch>=2.1" or "torch<2.1", the message format that was read.
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
        if self.other_processes >= LARGE_SHARE * self.total:
            out.append(f"Other processes hold {format_size(self.other_processes)} of this GPU: stop them "
                       "(or pick another GPU) before tuning your job.")
        outside = self.outside_pytorch or 0
        if outside >= LARGE_SHARE * self.total:
            out.append(f"{format_size(outside)} of this process is outside PyTorch's allocator (the CUDA "
                       "context, NCCL, other libraries): budget for it, it is not yours to plan with.")
        unalloc = self.reserved_unallocated
        if unalloc >= LARGE_SHARE * cap or (unalloc >= self.requested and unalloc >= 0.01 * cap):
            out.append(f"{format_size(unalloc)} is cached but in no tensor (the allocator already "
                       "released what it could before it raised): fragmentation. Set "
                       "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before starting Python, and keep "
                       "tensor sizes steady between steps.")
        if not out or self.allocated >= 0.5 * cap:
            out.append(f"Live tensors hold {format_size(self.allocated)} of {format_size(cap)}: profile "
                       "which (weights + gradients + optimizer state, or activations) and apply the "
                       "decision rule: a floor that does not fit needs sharding, offloading or smaller "
                       "state; activations need a smaller micro-batch with accumulation, then "
                       "checkpointing.")
        return out


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
        others = sum(round(float(a) * _UNITS[u]) for a, u in
                     re.findall(r"Process \d+ has " + _SIZE + r" memory in use", flat))
        allowed = re.search(_SIZE + r" allowed;", flat)
        alloc = re.search(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch", flat)
        unalloc = re.search(_SIZE + r" is reserved by PyTorch but unallocated", flat)
        if alloc is None or unalloc is None:
            raise ValueError("the message has no 'Of the allocated memory ... reserved by PyTorch but "
                             f"unallocated' part; got: {flat[:200]!r}")
        return OOMReport(
            requested, total, free, _size(alloc.groups(), 0), _size(unalloc.groups(), 0),
            process_in_use=None if own is None else _size(own.groups(), 0), other_processes=others,
            allowed=None if allowed is None else _size(allowed.groups(), 0), style="torch>=2.1")
    m = _OLD.search(flat)
    if m is not None:
        g = m.groups()
        allocated, reserved = _size(g, 5), _size(g, 11)
        allowed = None if g[9] is None else _size(g, 9)
        return OOMReport(_size(g, 0), _size(g, 3), _size(g, 7), allocated, max(0, reserved - allocated),
                         allowed=allowed, style="torch<2.1")
    raise ValueError("this is not a CUDA out-of-memory message: it has no 'Tried to allocate X. GPU n has "
                     f"a total capacity of ...' part; got: {flat[:200]!r}")
