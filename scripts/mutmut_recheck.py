"""Re-test the survivors of the last `make mutate` run, one module at a time, in a few seconds.

`python scripts/mutmut_recheck.py [--from FILE] helpers/techniques/tokens.py [LINE ...]` reads
.mutate/survivors.txt (written by scripts/mutate.sh; or FILE, in the same format), applies each
survivor of that module (optionally only those on the given lines) to a throw-away copy of the
repository, and runs the module's whole test files
(TESTS in scripts/mutmut_config.py, so a test written since the run counts) through the fork
server. It prints KILLED or SURVIVED per mutant: a quick check that a new test kills what it was
written for, without a whole run.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENTRY = re.compile(r"^(helpers/[\w/]+\.py):(\d+)\n    - (.*)\n    \+ (.*)$", re.M)


def survivors(path: str, filename: str, lines: set[int]) -> list[tuple[int, str, str]]:
    """(line, original, mutant) of each survivor of `filename` in `path` (before the judged ones)."""
    with open(path) as f:
        text = f.read().split("# judged in")[0]
    return [(int(n), old, new) for name, n, old, new in ENTRY.findall(text)
            if name == filename and (not lines or int(n) in lines)]


def main(filename: str, lines: set[int], source: str) -> int:
    """Re-test each survivor of `filename` listed in `source`; return how many still survive."""
    todo = survivors(source, filename, lines)
    if not todo:
        print(f"no survivors of {filename} in {source}")
        return 0
    work = tempfile.mkdtemp(prefix="recheck.")
    sock = os.path.join(work, ".server.sock")
    py = os.environ.get("PY", sys.executable)
    # what make mutate copies (scripts/mutate.sh): tests read the notebooks and docs/calibration too
    for name in ("helpers", "tests", "scripts", "notebooks", os.path.join("docs", "calibration")):
        shutil.copytree(os.path.join(ROOT, name), os.path.join(work, name),
                        ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("conftest.py", "pyproject.toml"):
        shutil.copy(os.path.join(ROOT, name), work)
    shutil.copy(os.path.join(ROOT, "scripts", "mutmut_config.py"), work)
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1",
               LESSONS_POOL_START="fork")
    server = subprocess.Popen([py, "scripts/mutmut_server.py", "serve", sock], cwd=work, env=env)
    alive = 0
    try:
        while not os.path.exists(sock):
            time.sleep(0.1)
        sys.path.insert(0, work)
        import mutmut_config as config

        target = os.path.join(work, filename)
        with open(target) as f:
            original = f.read().split("\n")
        for number, old, new in todo:
            source = list(original)
            line = source[number - 1]
            if line.strip() != old:
                print(f"{filename}:{number}: the line changed since the run; skipped")
                continue
            source[number - 1] = line[: len(line) - len(line.lstrip())] + new
            with open(target, "w") as f:
                f.write("\n".join(source))
            tests = shlex.split(config.TESTS[filename])  # whole files: new tests are not in the map
            rc = subprocess.run([py, "scripts/mutmut_server.py", "run", sock, "--",
                                 *shlex.split(config.PYTEST), *tests], cwd=work, env=env).returncode
            verdict = "KILLED" if rc == 1 else "SURVIVED"
            alive += rc != 1
            print(f"{verdict:8} {filename}:{number}: {new}")
        with open(target, "w") as f:
            f.write("\n".join(original))
    finally:
        subprocess.run([py, "scripts/mutmut_server.py", "stop", sock], cwd=work, env=env)
        server.wait()
        shutil.rmtree(work)
    print(f"{alive} of {len(todo)} still survive")
    return alive


if __name__ == "__main__":
    args = sys.argv[1:]
    source = os.path.join(ROOT, ".mutate", "survivors.txt")
    if args[:1] == ["--from"]:
        source, args = os.path.abspath(args[1]), args[2:]
    if not args:
        sys.exit("usage: mutmut_recheck.py [--from FILE] helpers/FILE.py [LINE ...]")
    sys.exit(1 if main(args[0], {int(n) for n in args[1:]}, source) else 0)
