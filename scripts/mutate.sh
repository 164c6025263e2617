#!/usr/bin/env bash
# make mutate (issue 16): mutation testing of the measuring helpers with mutmut 2, in throw-away
# copies of the repository (mutmut edits files in place; the working tree is never touched).
# Prints the score per module and every surviving mutant (also written to .mutate/survivors.txt).
# Not part of `make test`.
#   MUTATE_MODULES="memory tokens"  limit the run to some modules: a module's name, or package/name
#                                   (default: every file in scripts/mutmut_config.py TESTS)
#   MUTATE_JOBS=N                   modules tested at once, each in its own copy (default: nproc)
#   PY=path/to/python               the interpreter with torch, pytest, coverage, mutmut (.venv)
#   MUTATE_OUT=path                 where the survivors go (default .mutate/survivors.txt), so that
#                                   runs side by side do not overwrite each other's list
# How it stays fast: one coverage run records which test executes which line
# (scripts/mutmut_cov.py); each mutant then runs only those tests, in a child forked from a
# server that has imported torch once (scripts/mutmut_server.py).
# Judged-equivalent survivors and their reasons: docs/mutants.md.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
case $PY in /*) ;; */*) PY=$ROOT/$PY ;; *) PY=$(command -v "$PY") ;; esac  # absolute: the run cds away
MODULES=${MUTATE_MODULES:-$(cd "$ROOT/scripts" && "$PY" -c 'import mutmut_config as c; print(" ".join(p[len("helpers/"):-3] for p in c.TESTS))')}
JOBS=${MUTATE_JOBS:-$(nproc)}
OUT=${MUTATE_OUT:-.mutate/survivors.txt}
case $OUT in /*) ;; *) OUT=$ROOT/$OUT ;; esac
"$PY" -c "import mutmut, coverage" 2>/dev/null || { echo "mutmut or coverage is missing: run 'make mutate'"; exit 2; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/mutate.XXXXXX")
export MUTATE_PY=$PY OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MPLBACKEND=Agg PYTHONDONTWRITEBYTECODE=1
export LESSONS_POOL_START=fork  # lesson 07's worker pools and torchrun workers: fork the imported torch
cleanup() {
    for sock in "$WORK"/job-*/.server.sock; do
        [ -S "$sock" ] && "$PY" "$WORK/src/scripts/mutmut_server.py" stop "$sock" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT
start=$(date +%s)

cd "$ROOT"
rm -f .mutate/problems.log "$OUT"
mkdir "$WORK/src"
tar cf - --exclude=__pycache__ helpers tests scripts notebooks docs/calibration conftest.py pyproject.toml | tar xf - -C "$WORK/src"
cp scripts/mutmut_config.py "$WORK/src/mutmut_config.py"
cd "$WORK/src"

paths=""; tests=""
for m in $MODULES; do
    # "memory" or "measure/memory": the one helpers/<package>/<module>.py that TESTS names
    path=$("$PY" -c "import sys, mutmut_config as c; m = sys.argv[1]
found = [p for p in c.TESTS if p == f'helpers/{m}.py' or p.endswith(f'/{m}.py')]
print(found[0] if len(found) == 1 else '')" "$m")
    [ -n "$path" ] || { echo "$m: not one module of scripts/mutmut_config.py TESTS (a name, or package/name)"; exit 2; }
    paths="$paths $path"
    tests="$tests $("$PY" -c "import mutmut_config as c; print(c.TESTS['$path'])")"
done
tests=$(echo "$tests" | tr ' ' '\n' | sort -u | tr '\n' ' ')

echo "== coverage: which test runs which line ($tests)"
PYTHONPATH=scripts "$PY" -m coverage run --data-file=.coverage-ctx --include='helpers/*' \
    -m pytest -q -rf -p no:cacheprovider -p mutmut_cov $tests | grep -E "^FAILED|passed|failed"
"$PY" scripts/mutmut_cov.py map .coverage-ctx mutmut_map.json

# One mutmut run per module, each in its own copy with its own fork server; MUTATE_JOBS of them
# at a time, the costliest (scripts/mutmut_config.py `cost`) first, so the cores stay busy.
order=$("$PY" -c 'import sys, mutmut_config as c; print(" ".join(p for _, p in sorted(((c.cost(p), p) for p in sys.argv[1:]), reverse=True)))' $paths)
run_module() {
    local path=$1 dir=$WORK/job-$(basename "$1" .py)
    cp -r "$WORK/src" "$dir"
    cd "$dir"
    export MUTATE_SOCK=$dir/.server.sock
    "$PY" scripts/mutmut_server.py serve "$MUTATE_SOCK" &
    for _ in $(seq 600); do [ -S "$MUTATE_SOCK" ] && break; sleep 0.1; done
    "$PY" -m mutmut run --paths-to-mutate "$path" --tests-dir tests \
        --disable-mutation-types "$("$PY" -c "import mutmut_config as c; print(','.join(c.DISABLED_TYPES))")" \
        --runner "$PY scripts/mutmut_server.py run $MUTATE_SOCK -- $("$PY" -c "import mutmut_config as c; print(c.PYTEST, c.TESTS['$path'])")" \
        --simple-output --no-progress --CI > run.log 2>&1 || true
    "$PY" scripts/mutmut_server.py stop "$MUTATE_SOCK" 2>/dev/null || true
    echo "== $path done after $(( $(date +%s) - start )) s"
}
export -f run_module
export PY WORK start
echo "== $JOBS at a time: $order"
printf '%s\n' $order | xargs -P "$JOBS" -I{} bash -c 'run_module {}'

mkdir -p "$ROOT/.mutate" "$(dirname "$OUT")"
cd "$ROOT"
status=0
"$PY" scripts/mutmut_report.py "$OUT" "$WORK"/job-* || status=$?
problems=$(cat "$WORK"/job-*/mutmut_problems.log 2>/dev/null | grep -c '^== pytest exit' || true)
if [ "$problems" != 0 ]; then
    cat "$WORK"/job-*/mutmut_problems.log > "$ROOT/.mutate/problems.log"
    echo "== $problems mutants stopped pytest with a usage error or no test: .mutate/problems.log"
fi
echo "== $(( $(date +%s) - start )) s, $JOBS jobs; survivors also in $OUT"
exit $status
