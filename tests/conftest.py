"""Shared test fixtures: a fixed seed for every test, a deadline for distributed tests, the cuda skip,
the tiers' marker rule, forked worker pools, the CUDA allocator's block size, worker pools (real and
fake) and an optimizer-state count."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator

import pytest
import torch
from support.fixtures import hf, tiny_token_lm  # noqa: F401  (fixtures, shared with every test below)

from helpers.core.device import seed_everything
from helpers.core.scratch import private_tmpdir


@pytest.fixture(autouse=True)
def _seed() -> None:
    seed_everything(0)


@pytest.fixture(scope="module", autouse=True)
def _forked_pools() -> Iterator[None]:
    """Worker pools in these tests fork the imported torch (seconds saved per pool) unless
    LESSONS_POOL_START says otherwise. Only while a test module runs: notebooks that `make check`
    and `make test` run in the same session keep what the environment says (spawned pools)."""
    from helpers.distributed.processes import POOL_START_ENV

    unset = POOL_START_ENV not in os.environ
    if unset:
        os.environ[POOL_START_ENV] = "fork"
    yield
    if unset:
        os.environ.pop(POOL_START_ENV, None)


DEADLINE_S = 240  # a test that starts worker processes must never hang CI


@pytest.fixture(autouse=True)
def _deadline(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("distributed") is None:
        yield
        return

    def expired(*_: object) -> None:
        raise TimeoutError(f"test ran past its {DEADLINE_S} s deadline")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(DEADLINE_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture
def cuda_block_bytes() -> int:
    """What the CUDA caching allocator really gives a 4-byte tensor: one whole block, measured."""
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    one = torch.ones(1, device="cuda")
    block = torch.cuda.memory_allocated() - start
    del one
    assert block >= 512  # the allocator rounds a 4-byte tensor up to a whole block
    return block


@pytest.fixture
def optimizer_state_bytes() -> Callable[[torch.nn.Module, str], int]:
    """Bytes of the state torch's optimizer keeps after one real step (exp_avg, step, momentum...)."""
    from helpers.core.training import make_optimizer

    def count(model: torch.nn.Module, optimizer: str) -> int:
        opt = make_optimizer(optimizer, model)
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        opt.step()
        total = sum(t.nbytes for state in opt.state.values() for t in state.values() if torch.is_tensor(t))
        opt.zero_grad(set_to_none=True)
        return total

    return count


class FakePool:
    """Stands in for `helpers.distributed.launcher.WorkerPool`: records the call, returns canned results."""

    def __init__(self, world_size: int, results: list) -> None:
        self.world_size, self.results, self.calls = world_size, results, []

    def run(self, fn: object, *args: object, timeout_s: float) -> list:
        self.calls.append((fn, args, timeout_s))
        return self.results


@pytest.fixture
def fake_pool() -> type[FakePool]:
    """The `FakePool` class: `fake_pool(world_size, results)` makes one."""
    return FakePool


@pytest.fixture(scope="module")
def pool() -> Iterator[object]:
    """Two real worker processes (gloo on CPU), shared by a test module's distributed tests."""
    from helpers.distributed.launcher import WorkerPool

    with WorkerPool(2, timeout_s=180) as p:
        yield p


@pytest.fixture(scope="module")
def pool4() -> Iterator[object]:
    """Four real worker processes, for the FSDP tests that shard over W = 4."""
    from helpers.distributed.launcher import WorkerPool

    with WorkerPool(4, timeout_s=180) as p:
        yield p


# The Makefile's tiers: unit (none of these markers), `distributed` (worker processes: `make test`
# runs it, `make check` leaves it out), `browser` and `slow` (`make test` only; `make browser` and
# `make colab` run parts alone). A distributed test may also be browser or slow; a browser test may
# not be slow (each tier is one test's home, so that `-m browser` and `-m slow` never overlap).
TIERS = ("browser", "slow")


def _run_order(item: pytest.Item) -> tuple[int, int]:
    """Where an item goes: the browser test, notebooks (lesson 10 first), slow or distributed, the rest."""
    if "browser" in item.keywords:
        return (0, 0)
    name = item.path.name
    if item.path.suffix == ".ipynb":
        return (1, -int(name[:2]) if name[:2].isdigit() else 0)
    return (2, 0) if "slow" in item.keywords or "distributed" in item.keywords else (3, 0)


def pytest_configure(config: pytest.Config) -> None:
    """Every file a test, a kernel or a worker writes lands in this process's private temp folder."""
    private_tmpdir()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The browser test runs its lessons one after another on one worker: start it first, so that the
    # other worker shares out everything else around it (`make test` keeps this order, with
    # --no-loadscope-reorder). The longest units next, so that the session does not end on one of
    # them with the other worker idle: the notebooks, later lessons (the longer ones) first, then
    # the files with slow or distributed tests.
    items.sort(key=_run_order)
    both = [item.nodeid for item in items if all(tier in item.keywords for tier in TIERS)]
    if both:  # a test has one tier: `-m browser` and `-m slow` must not both select it
        raise pytest.UsageError(f"a test is either browser or slow, not both: {both[:3]}")
    unmarked = [item.nodeid for item in items if "distributed" not in item.keywords
                and {"pool", "pool4"} & set(getattr(item, "fixturenames", ()))]
    if unmarked:  # `make check` selects on the marker: a real pool there would break its no-workers rule
        raise pytest.UsageError(f"a test that uses a real worker pool is marked distributed: {unmarked[:3]}")
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
