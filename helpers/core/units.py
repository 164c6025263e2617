"""Sizes and counts in human units, one convention for every printout (core).

- `format_bytes(n)`: binary units (KiB, MiB, GiB: `UNITS`), e.g. 3.2 MiB or 512 B.
- `format_flops(n)`: decimal FLOP units (`FLOP_UNITS`), e.g. 469.76 MFLOP.

No plotting here: the planner, the ledger and the commands print sizes without matplotlib.
"""

from __future__ import annotations

from collections.abc import Sequence

UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def format_bytes(n: float) -> str:
    """Human-readable bytes with binary units, e.g. 3.2 MiB or 512 B.

    Args:
        n: a number of bytes (negative gets a minus sign).

    Returns:
        The text.
    """
    return _in_units(n, UNITS, 1, "B")


FLOP_UNITS = [("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)]


def format_flops(n: float) -> str:
    """A FLOP count with decimal units, e.g. 0.47 GFLOP or 2.10 MFLOP (never "469,762,048").

    Args:
        n: the FLOP count (negative for a difference).

    Returns:
        The count with two decimals in the largest unit it reaches.
    """
    return _in_units(n, FLOP_UNITS, 2, "FLOP")


def _in_units(n: float, units: Sequence[tuple[str, float]], decimals: int, base: str) -> str:
    """`n` in the largest of `units` (largest first) it reaches, else as a whole number of `base`."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, size in units:
        if n >= size:
            return f"{sign}{n / size:.{decimals}f} {unit}"
    return f"{sign}{int(n)} {base}"
