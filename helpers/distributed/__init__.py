"""Several processes: the rules workers keep, torchrun and the worker pool, DDP and FSDP2 measured.

Imports: core, models, techniques. `helpers.distributed.<name>` still reaches the DDP
instruments (`helpers.distributed.ddp`), the public path lessons and users import.
"""

from __future__ import annotations

import importlib

_DDP_NAMES = frozenset({
    "AllReduceCounter", "BatchSizes", "DDPGrad", "bn_model", "check_batch_sizes", "count_allreduces",
    "ddp_accumulated_grad", "lesson_data", "replica_model", "mse_loss", "rank_shards",
})
_SUBMODULES = ("ddp", "fsdp", "launcher", "processes", "torchrun")


def __getattr__(name: str) -> object:
    """`helpers.distributed.<DDP name>` loads `helpers.distributed.ddp` on first use (workers that
    import only `processes` or `torchrun` do not pay for it)."""
    if name in _DDP_NAMES:
        return getattr(importlib.import_module("helpers.distributed.ddp"), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"helpers.distributed.{name}")
    raise AttributeError(f"module 'helpers.distributed' has no attribute {name!r}; "
                         f"it offers {sorted(_DDP_NAMES)} and the modules {list(_SUBMODULES)}")


def __dir__() -> list[str]:
    return sorted(_DDP_NAMES | set(_SUBMODULES) | set(globals()))
