"""Install the package into a virtual environment, quickly: `make setup` runs this.

Usage: python scripts/install.py VENV_PYTHON SPEC [-c CONSTRAINTS ...]

It installs SPEC (for example `-e .[test,lab,frameworks]`) into the environment of VENV_PYTHON
with uv (https://docs.astral.sh/uv/) when uv can be installed there: uv resolves and unpacks in
parallel, about ten times faster than pip on this project (9 s against 93 s on a 2-core machine).
uv does not read pip's configuration, so the indexes, find-links folders and constraint files that
`pip config list` reports (pip.conf files and PIP_* variables) are handed to uv on its command line,
and uv picks the best version across every index as pip does. If uv cannot be installed or fails,
pip does the install instead. Either way the result is the same set of packages; set INSTALLER=pip
to force pip, or UV=/path/to/uv to use a uv you have.

Both byte-compile what they install (`--compile-bytecode`; pip does by default, uv does not). It
costs about 13 s once, and saves seconds in every process after it: where PYTHONDONTWRITEBYTECODE is
set (as on the CI machine) Python never writes the .pyc it compiles on import, so every kernel, test
worker and torchrun worker compiled torch, sympy and matplotlib from source again (importing
torch._dynamo took 4.7 CPU-s instead of 2.4; `make check` used 209 CPU-s instead of 173).
INSTALL_BYTECODE=0 skips it: `make setup` does, because make does not pass PYTHONDONTWRITEBYTECODE
on, so the first process to import a module caches its bytecode (only what runs is compiled), and
so does the Colab simulation's stand-in for Colab's own packages.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

# pip's option name -> uv's, for the options that say where packages come from.
SOURCES = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
           "find-links": "--find-links", "constraint": "--constraint"}


def pip_sources(python: str) -> list[str]:
    """The uv arguments for the package sources and constraints in pip's configuration.

    Args:
        python: the interpreter whose pip configuration is read (`python -m pip config list`).

    Returns:
        A flat argument list such as `["--find-links", "/opt/wheels", "--extra-index-url", "file:///x"]`.
        Local folders and file:// indexes that do not exist are left out, as pip ignores them.
    """
    out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False)
    args: list[str] = []
    for line in out.stdout.splitlines():
        key, _, value = line.partition("=")
        option = SOURCES.get(key.rsplit(".", 1)[-1])
        if option is None:
            continue
        for item in shlex.split(value.strip().strip("'\"")):
            local = item.removeprefix("file://")
            if ("://" not in item or item.startswith("file://")) and not Path(local).exists():
                continue
            if [option, item] not in [args[i:i + 2] for i in range(0, len(args), 2)]:
                args += [option, item]
    return args


def _uv(python: str) -> str | None:
    """A uv executable: $UV if set, else uv installed with pip next to `python` (None if that fails)."""
    if os.environ.get("UV"):
        return os.environ["UV"]
    got = subprocess.run([python, "-m", "pip", "install", "-q", "uv"], check=False).returncode == 0
    uv = Path(python).parent / "uv"
    return str(uv) if got and uv.exists() else None


def main(argv: list[str]) -> int:
    """Install the spec with uv, else with pip; return the exit status."""
    if len(argv) < 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    python, spec = argv[0], argv[1:]
    bytecode = os.environ.get("INSTALL_BYTECODE", "1") != "0"
    if os.environ.get("INSTALLER", "uv") == "uv":
        uv = _uv(python)
        if uv is not None:
            compile_ = ["--compile-bytecode"] if bytecode else []
            cmd = [uv, "pip", "install", "-q", *compile_, "--python", python,
                   "--index-strategy", "unsafe-best-match", *pip_sources(python), *spec]
            if subprocess.run(cmd, check=False).returncode == 0:
                return 0
            print("install: uv failed; installing with pip instead", file=sys.stderr)
    pip = [python, "-m", "pip", "install", "-q", *([] if bytecode else ["--no-compile"]), *spec]
    return subprocess.run(pip, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
