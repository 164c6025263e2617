"""helpers.core.scratch: a lesson's runs leave nothing in the system temp folder, killed or interrupted.

Each case runs a fresh Python whose system temp folder is the test's own, so the count sees only
what that run made: a lesson 07 worker pool (rank logs, rendezvous, multiprocessing's `pymp-*`),
a torchrun launch (`lesson07-torchrun-*`, the agent's `torchelastic_*`) and a lesson 10-style
output folder (`lesson10-*`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.core.scratch import PREFIX, private_tmpdir, remove_orphans

ROOT = Path(__file__).resolve().parents[2]

_RUN = """
import os, signal, sys, tempfile, time
from pathlib import Path
from helpers.core.scratch import private_tmpdir
from helpers.distributed.launcher import WorkerPool
from helpers.distributed.torchrun import run_torchrun

mine = private_tmpdir()
work = Path(tempfile.mkdtemp(prefix="lesson10-"))   # as lesson 10's Trainer output folder
(work / "trainer_state.json").write_text("{}")
script = Path(tempfile.mkdtemp(prefix="lesson07-")) / "w.py"
script.write_text("import torch.distributed as dist\\n"
                  "from helpers.distributed.torchrun import run_main, save_result\\n"
                  "def main():\\n    dist.init_process_group('gloo'); save_result(dist.get_rank())\\n"
                  "    dist.destroy_process_group()\\n"
                  "if __name__ == '__main__':\\n    run_main(main)\\n")
assert run_torchrun(script, 2, timeout_s=120) == [0, 1]
with WorkerPool(2, timeout_s=120) as pool:
    assert pool.run(abs, -3) == [3, 3]
    made = sorted(p.name for p in mine.iterdir())
    print("MADE", *made, flush=True)
    if sys.argv[1] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if sys.argv[1] == "interrupt":
        raise KeyboardInterrupt
"""


def _run(tmp: Path, how: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "LESSONS_POOL_START": "spawn"}
    env.pop("CKPT_VS_ACCUM_SYSTEM_TMP", None)
    return subprocess.run([sys.executable, "-c", _RUN, how], env=env, capture_output=True, text=True,
                          timeout=240, cwd=ROOT)


def _left(tmp: Path, deadline_s: float = 10.0) -> list[str]:
    """What is left in `tmp` once the run's daemon workers are gone (they exit with their parent)."""
    end = time.monotonic() + deadline_s
    while (left := sorted(p.name for p in tmp.iterdir())) and time.monotonic() < end:
        time.sleep(0.2)
    return left


@pytest.mark.distributed
@pytest.mark.parametrize("how", ["finish", "interrupt", "kill"])
def test_a_run_leaves_nothing_behind(tmp_path: Path, how: str) -> None:
    done = _run(tmp_path, how)
    made = next(line.split()[1:] for line in done.stdout.splitlines() if line.startswith("MADE"))
    prefixes = ("lesson10-", "lesson07-", "lesson07-pool-", "lesson07-torchrun-", "pymp-")
    assert all(name.startswith(prefixes) or name.startswith("torchelastic_") for name in made), made
    assert any(n.startswith("lesson07-pool-") for n in made) and any(n.startswith("lesson10-") for n in made)
    if how == "kill":
        assert done.returncode == -signal.SIGKILL
        left = sorted(p.name for p in tmp_path.iterdir())
        assert len(left) == 1 and left[0].startswith(PREFIX), f"a killed run keeps its one folder: {left}"
        _run(tmp_path, "finish")  # the next run removes the killed run's folder, then its own
    else:
        assert done.returncode == (0 if how == "finish" else -signal.SIGINT), done.stderr[-2000:]
    assert _left(tmp_path) == [], f"{how}: left in the temp folder: {_left(tmp_path, 0)}"


def test_private_tmpdir_is_one_folder_per_run_and_removes_only_the_dead(tmp_path: Path) -> None:
    mine = private_tmpdir()
    assert private_tmpdir() == mine and mine.name.startswith(PREFIX)
    code = "from helpers.core.scratch import private_tmpdir as p; print(p())"
    child = subprocess.run([sys.executable, "-c", code],
                           capture_output=True, text=True, check=True, cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.strip()
    assert child == str(mine), "a child process writes into its parent's folder, which the parent removes"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    (tmp_path / f"{PREFIX}{dead}").mkdir()
    (tmp_path / f"{PREFIX}{os.getpid()}").mkdir()  # alive: kept
    (tmp_path / f"{PREFIX}notapid").mkdir()  # not ours: kept
    assert remove_orphans(tmp_path) == [tmp_path / f"{PREFIX}{dead}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{PREFIX}{os.getpid()}", f"{PREFIX}notapid"]
    with pytest.raises(ValueError, match="is not a folder"):
        remove_orphans(tmp_path / "missing")
