#!/usr/bin/env bash
# make mutate (issue 16): mutation testing of the measuring helpers with mutmut 2, in a throw-away
# copy of the repository (mutmut edits files in place; the working tree is never touched).
# Prints the score and every surviving mutant. Not part of `make test`.
#   MUTATE_MODULES="memory tokens"  limit the run to some modules (default: all below)
#   PY=path/to/python               the interpreter with torch, pytest and mutmut (default .venv)
# Judged-equivalent survivors and their reasons: docs/mutants.md.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
MODULES=${MUTATE_MODULES:-memory tracker accumulation tokens checkpointing planner distributed}
"$PY" -c "import mutmut" 2>/dev/null || { echo "mutmut is missing: run 'make mutate' (installs it)"; exit 2; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/mutate.XXXXXX")
export MUTATE_PY=$PY MUTATE_SOCK=$WORK/.server.sock OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export MPLBACKEND=Agg PYTHONDONTWRITEBYTECODE=1
cleanup() {
    [ -S "$MUTATE_SOCK" ] && "$PY" "$WORK/scripts/mutmut_server.py" stop "$MUTATE_SOCK" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

cd "$ROOT"
tar cf - --exclude=__pycache__ helpers tests scripts conftest.py pyproject.toml | tar xf - -C "$WORK"
cp scripts/mutmut_config.py "$WORK/mutmut_config.py"
cd "$WORK"

paths=""; tests=""
for m in $MODULES; do
    [ -f "helpers/$m.py" ] || { echo "no helpers/$m.py"; exit 2; }
    paths="$paths${paths:+,}helpers/$m.py"
    tests="$tests $("$PY" -c "import mutmut_config as c; print(c.TESTS['helpers/$m.py'])")"
done
tests=$(echo "$tests" | tr ' ' '\n' | sort -u | tr '\n' ' ')

"$PY" scripts/mutmut_server.py serve "$MUTATE_SOCK" &
for _ in $(seq 600); do [ -S "$MUTATE_SOCK" ] && break; sleep 0.1; done
start=$(date +%s)
echo "== mutmut over $paths (tests:$tests)"
"$PY" -m mutmut run --paths-to-mutate "$paths" --tests-dir tests --disable-mutation-types fstring,decorator \
    --runner "$PY scripts/mutmut_server.py run $MUTATE_SOCK -- -x -q -p no:cacheprovider $tests" \
    --simple-output --no-progress --CI || true
echo "== surviving mutants (each needs a killing test or a line in docs/mutants.md)"
"$PY" -m mutmut show all || true
"$PY" - "$start" <<'PY'
import sqlite3
import sys
import time

rows = sqlite3.connect(".mutmut-cache").execute(
    "select status, count(*) from Mutant group by status").fetchall()
n = dict(rows)
killed = n.get("ok_killed", 0) + n.get("ok_suspicious", 0) + n.get("bad_timeout", 0)
survived = n.get("bad_survived", 0)
score = 100.0 * killed / max(1, killed + survived)
print(f"== mutation score {score:.1f}%: {killed} killed, {survived} survived, "
      f"{n.get('skipped', 0)} skipped (messages, drawing), {n.get('untested', 0)} untested; "
      f"{time.time() - float(sys.argv[1]):.0f} s")
PY
