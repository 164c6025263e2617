"""Several processes: the rules workers keep, torchrun and the worker pool, DDP and FSDP2 measured.

Imports: core, models, techniques. `helpers.distributed.<name>` still reaches the DDP
instruments (`helpers.distributed.ddp`), the public path lessons and users import.
"""

from __future__ import annotations

import importlib

_SUBMODULES = ("ddp", "fsdp", "launcher", "processes", "torchrun")


def _ddp() -> object:
    return importlib.import_module("helpers.distributed.ddp")


def __getattr__(name: str) -> object:
    """`helpers.distributed.<name>` for each name in `helpers.distributed.ddp.__all__`, loaded on
    first use (workers that import only `processes` or `torchrun` do not pay for ddp)."""
    if name in _SUBMODULES:
        return importlib.import_module(f"helpers.distributed.{name}")
    if not name.startswith("_") and name in (ddp := _ddp()).__all__:  # private probes load nothing
        return getattr(ddp, name)
    raise AttributeError(f"module 'helpers.distributed' has no attribute {name!r}; it offers "
                         f"helpers.distributed.ddp's public names and the modules {list(_SUBMODULES)}")


def __dir__() -> list[str]:
    return sorted({*_ddp().__all__, *_SUBMODULES, *globals()})
