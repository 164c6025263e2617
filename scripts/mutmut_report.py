"""Score and survivors of a `make mutate` run (scripts/mutate.sh), read from each job's mutmut cache.

`python scripts/mutmut_report.py OUT.txt JOBDIR...` prints, per module, killed / survived /
skipped and the score (killed / (killed + survived)), then every surviving mutant as
`file:line`, the original line and the mutated one. The survivors also go to OUT.txt.

A survivor listed in docs/mutants.md (a bullet ``- helpers/x.py: `original` → `mutant` ``, where
a mutant of `*` stands for any mutant of that line) is "judged": the file says why it is
equivalent or harmless. Every other survivor is "new" and needs a killing test or a bullet.
The exit status is 1 when there is a new survivor.
"""

from __future__ import annotations

import collections
import os
import re
import sqlite3
import sys

JUDGED = re.compile(r"^- (helpers/[\w/]+\.py): `(.+?)` → `(.+?)`(?::\s|$)")

KILLED = ("ok_killed", "ok_suspicious", "bad_timeout")


def _mutated_line(filename: str, line: str, line_number: int, index: int) -> str:
    from mutmut import Context, RelativeMutationID, mutate
    from mutmut_config import types_config

    mid = RelativeMutationID(line=line, index=index, line_number=line_number, filename=filename)
    mutated, _ = mutate(Context(filename=filename, mutation_id=mid, config=types_config()))
    return mutated.split("\n")[line_number].strip()


def judged(path: str) -> set[tuple[str, str, str]]:
    """(file, original line, mutated line or "*") of each survivor docs/mutants.md explains."""
    found = set()
    with open(path) as f:
        for line in f:
            m = JUDGED.match(line.strip())
            if m:
                found.add((m[1], m[2].strip(), m[3].strip()))
    return found


def report(out_path: str, job_dirs: list[str], judged_path: str = "docs/mutants.md") -> int:
    """Print the score per module and overall, and list the survivors (also into out_path).

    Returns the number of new survivors: those docs/mutants.md does not explain.
    """
    explained = judged(judged_path) if os.path.exists(judged_path) else set()
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    survivors: list[str] = []
    old: list[str] = []
    for job in job_dirs:
        db = sqlite3.connect(os.path.join(job, ".mutmut-cache"))
        rows = db.execute(
            "select f.filename, l.line, l.line_number, m.`index`, m.status from Mutant m "
            "join Line l on m.line = l.id join SourceFile f on l.sourcefile = f.id "
            "order by f.filename, l.line_number, m.`index`").fetchall()
        cwd = os.getcwd()
        os.chdir(job)
        try:
            for filename, line, number, index, status in rows:
                counts[filename][status] += 1
                if status == "bad_survived":
                    mutant = _mutated_line(filename, line, number, index)
                    text = f"{filename}:{number + 1}\n    - {line.strip()}\n    + {mutant}"
                    keys = {(filename, line.strip(), mutant), (filename, line.strip(), "*")}
                    (old if keys & explained else survivors).append(text)
        finally:
            os.chdir(cwd)
    total: collections.Counter = collections.Counter()
    print(f"{'module':28} {'killed':>7} {'survived':>9} {'skipped':>8} {'score':>7}")
    for filename in sorted(counts):
        c = counts[filename]
        total.update(c)
        _line(filename, c)
    _line("all", total)
    print(f"\n== {len(old)} survivors judged equivalent or harmless in {judged_path}:")
    print("\n".join(t.split("\n")[0] for t in old))
    print(f"\n== {len(survivors)} new survivors (each needs a killing test or a bullet in {judged_path})")
    print("\n".join(survivors))
    with open(out_path, "w") as f:
        f.write("\n".join(survivors + ["# judged in " + judged_path] + old) + "\n")
    return len(survivors)


def _line(name: str, c: collections.Counter) -> None:
    killed = sum(c[s] for s in KILLED)
    survived = c["bad_survived"]
    score = 100.0 * killed / max(1, killed + survived)
    extra = f"  ({c['untested']} untested)" if c["untested"] else ""
    print(f"{name:28} {killed:7d} {survived:9d} {c['skipped']:8d} {score:6.1f}%{extra}")


if __name__ == "__main__":
    sys.exit(1 if report(sys.argv[1], sys.argv[2:]) else 0)
