"""helpers.core.units: sizes and FLOP counts in one convention, at every unit's edge."""

from __future__ import annotations

import pytest

from helpers.core.units import format_bytes, format_flops


@pytest.mark.parametrize(("n", "text"), [
    (0, "0 B"), (512, "512 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (3.2 * 2**20, "3.2 MiB"),
    (2**30 - 1, "1024.0 MiB"), (2**30, "1.0 GiB"), (24 * 2**30, "24.0 GiB"), (-1536, "-1.5 KiB"),
])
def test_format_bytes_uses_binary_units(n: float, text: str) -> None:
    assert format_bytes(n) == text


@pytest.mark.parametrize(("n", "text"), [
    (999, "999 FLOP"), (1000, "1.00 kFLOP"), (469_762_048, "469.76 MFLOP"), (2.5e9, "2.50 GFLOP"),
    (1e15, "1.00 PFLOP"), (-2.1e6, "-2.10 MFLOP"),
])
def test_format_flops_uses_decimal_units(n: float, text: str) -> None:
    assert format_flops(n) == text
