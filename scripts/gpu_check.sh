#!/usr/bin/env bash
# make gpu: on a machine with a CUDA GPU, in at most about 8 minutes on one large GPU:
#   (a) the cuda-marked tests, (b) every notebook at the scale the GPU's memory picks (`full` on
#   40 GB and more), (c) lessons 01 and 03 again with LESSONS_GPU_MEMORY_GB=24 and =16 (a 24 GB
#   card and a T4), (d) the claim ledger (python -m helpers.review) when it exists, (e) the meta plan
#   beside torch.cuda.max_memory_allocated (scripts/plan_vs_cuda.py); then a summary.
# The phases run side by side, in four lanes, each phase under its own timeout: (b) with NB_JOBS
# notebooks at a time (default 3); (c) at 24 then 16 GB (CAPPED_NOTEBOOKS: default 01 and 03); (a)
# then (e); (d). Memory figures are per process (the caching allocator's own counters), so they do not
# see one another; the seconds do (the timings the notebooks show are not asserted). NB_JOBS=1 and
# LANES=1 run it all one at a time.
# Usage, from the repository root:
#   bash scripts/gpu_check.sh                   # python3 on PATH must have torch with CUDA
#   OUT=/some/dir bash scripts/gpu_check.sh     # where the results go (default gpu-run/)
#   LESSONS_DEVICE=cpu LESSONS_SCALE=tiny bash scripts/gpu_check.sh   # dry run on a CPU machine
# A machine without network carries the Jupyter kernel stack as wheels in .whl/ (make gpu-kit);
# they are installed with pip --no-index --no-deps --target into a temporary folder.
# PHASES="a b c d e" (the default) picks phases; NOTEBOOKS="notebooks/01_....ipynb ..." limits (b) (default:
# every lesson), e.g. to rerun only what failed. LESSONS_SCALE, when set, applies to every phase. At most 8 files land in $OUT: summary.txt,
# run.log, bench_full.json, bench_24gb.json, bench_16gb.json, notebooks_<device>.tar.gz (executed
# notebooks, a failed one up to its error, and figures, named with the device), ledger_<device>.md,
# calibration-<card>-torch<version>-<date>.json (commit it to docs/calibration/).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-gpu-run}
KIT=${KIT_DIR:-.whl}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lessons-gpu.XXXXXX")
# Seconds per phase; the lanes run side by side, so the longest lane plus the setup stays under 8 minutes.
T_TESTS=${T_TESTS:-120} T_NOTEBOOKS=${T_NOTEBOOKS:-400} T_CAPPED=${T_CAPPED:-170} T_LEDGER=${T_LEDGER:-360}
T_PLAN=${T_PLAN:-200} NB_JOBS=${NB_JOBS:-3} LANES=${LANES:-4} PHASES=${PHASES:-a b c d e}
read -r -a SELECTED <<< "${NOTEBOOKS:-}"
read -r -a CAPPED <<< "${CAPPED_NOTEBOOKS:-notebooks/01_where_memory_goes.ipynb notebooks/03_gradient_accumulation.ipynb}"
mkdir -p "$OUT"
rm -f "$OUT"/{summary.txt,run.log,bench_full.json,bench_24gb.json,bench_16gb.json} "$OUT"/calibration-*.json \
  "$OUT"/notebooks_*.tar.gz "$OUT"/ledger_*.md

verdict() {  # verdict RC [TIMEOUT_S]: one word for a phase's exit status
  case "$1" in
    0) echo "passed" ;;
    124) echo "TIMED OUT after ${2:-?} s" ;;
    skip) echo "skipped" ;;
    *) echo "FAILED (rc $1)" ;;
  esac
}

main() {
  local start=$SECONDS
  echo "== setup"
  if compgen -G "$KIT/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" \
      "$KIT"/*.whl || { echo "installing the wheel kit from $KIT/ failed"; return 1; }
    export PYTHONPATH="$WORK/site"
    echo "installed $(ls "$KIT"/*.whl | wc -l) wheels from $KIT/ into $WORK/site"
  fi
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" MPLBACKEND=Agg LESSONS_STRICT=1 PYTHONUNBUFFERED=1
  export LESSONS_DEVICE=${LESSONS_DEVICE:-cuda} JUPYTER_PLATFORM_DIRS=1
  unset LESSONS_GPU_MEMORY_GB
  if [ "$LESSONS_DEVICE" = cuda ]; then
    $PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU visible'" || return 1
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
  else
    echo "DRY RUN on $LESSONS_DEVICE (LESSONS_DEVICE=$LESSONS_DEVICE): no GPU assertion"
  fi
  local dev
  dev=$($PY -c "import torch, re; n = torch.cuda.get_device_name() if '$LESSONS_DEVICE' == 'cuda' else 'cpu'; \
print(re.sub(r'[^a-z0-9]+', '-', n.lower().replace('nvidia', '')).strip('-'))")
  $PY -m helpers.env_check; local env_rc=$?

  # The lanes below are subshells: they see these variables without exporting them.
  # Each phase: its log in $WORK/<name>.log, its exit status in $WORK/<name>.rc.
  phase() {  # phase NAME TIMEOUT COMMAND...
    local name=$1 limit=$2; shift 2
    [[ " $PHASES " == *" ${name:0:1} "* ]] || return 0  # not asked for: no log, no status (skipped)
    echo "== $name started at $((SECONDS - start)) s"
    timeout "$limit" "$@" >"$WORK/$name.log" 2>&1
    echo $? >"$WORK/$name.rc"
    echo "== $name ended at $((SECONDS - start)) s (rc $(cat "$WORK/$name.rc"))"
  }
  lane_notebooks() {
    phase b_notebooks "$T_NOTEBOOKS" $PY scripts/bench.py --cells --no-widgets --no-overhead --keep-going \
      --jobs "$NB_JOBS" --out "$OUT/bench_full.json" --images "$WORK/nb/full" --executed "$WORK/nb/full" "${SELECTED[@]}"
  }
  lane_capped() {
    local gb
    for gb in 24 16; do
      LESSONS_GPU_MEMORY_GB=$gb phase "c_${gb}gb" "$T_CAPPED" $PY scripts/bench.py --no-widgets --no-overhead \
        --keep-going \
        --out "$OUT/bench_${gb}gb.json" --images "$WORK/nb/${gb}gb" --executed "$WORK/nb/${gb}gb" "${CAPPED[@]}"
    done
  }
  lane_checks() {
    phase a_tests "$T_TESTS" $PY -m pytest -q -p no:cacheprovider -m cuda tests/
    if [ "$LESSONS_DEVICE" != cpu ]; then
      phase e_plan "$T_PLAN" $PY scripts/plan_vs_cuda.py "$OUT"
    fi
  }
  lane_ledger() {
    if [ -f helpers/ledger/review.py ]; then
      phase d_ledger "$T_LEDGER" $PY -m helpers.review --no-progress --markdown "$OUT/ledger_${dev}.md"
    fi
  }
  if [ "$LANES" = 1 ]; then
    lane_checks; lane_ledger; lane_notebooks; lane_capped
  else
    lane_notebooks & lane_capped & lane_checks & lane_ledger & wait
  fi
  local name
  for name in a_tests b_notebooks c_24gb c_16gb d_ledger e_plan; do
    [ -f "$WORK/$name.log" ] || continue
    echo "== ($name) output"
    cat "$WORK/$name.log"
  done
  rc_of() { if [ -f "$WORK/$1.rc" ]; then cat "$WORK/$1.rc"; else echo skip; fi; }
  local tests_rc nb_rc ledger_rc plan_rc cap_rc=()
  tests_rc=$(rc_of a_tests); nb_rc=$(rc_of b_notebooks); ledger_rc=$(rc_of d_ledger); plan_rc=$(rc_of e_plan)
  cap_rc=("$(rc_of c_24gb)" "$(rc_of c_16gb)")
  [ "$tests_rc" = 5 ] && tests_rc=skip  # no cuda-marked test collected

  if [ -d "$WORK/nb" ]; then  # one archive: executed notebooks and figures, the device in every name
    find "$WORK/nb" -type f \( -name '*.png' -o -name '*.ipynb' \) | while read -r f; do
      mv "$f" "${f%.*}_${dev}.${f##*.}"
    done
    tar -czf "$OUT/notebooks_${dev}.tar.gz" -C "$WORK/nb" .
  fi

  {
    echo "== summary ($dev, $((SECONDS - start)) s)"
    echo "env check:          $(verdict "$env_rc")"
    echo "(a) cuda tests:     $(verdict "$tests_rc" "$T_TESTS")"
    echo "(b) all notebooks:  $(verdict "$nb_rc" "$T_NOTEBOOKS")"
    echo "(c) 01+03 at 24 GB: $(verdict "${cap_rc[0]}" "$T_CAPPED")"
    echo "(c) 01+03 at 16 GB: $(verdict "${cap_rc[1]}" "$T_CAPPED")"
    echo "(d) claim ledger:   $(verdict "$ledger_rc" "$T_LEDGER")"
    echo "(e) plan vs CUDA:   $(verdict "$plan_rc" "$T_PLAN")"
    $PY - "$OUT" <<'PYEOF'
import json, sys
from pathlib import Path
for path in sorted(Path(sys.argv[1]).glob("bench_*.json")):
    data = json.loads(path.read_text())
    runs = ", ".join(f"{r['notebook'][:2]} {r['seconds']:.0f}s" for r in data.get("results", []))
    failed = f"; FAILED {', '.join(data['failed'])}" if data.get("failed") else ""
    print(f"{path.name}: {runs}{failed}")
PYEOF
    echo "results in $OUT/: $(cd "$OUT" && ls | tr '\n' ' ')"
  } | tee "$OUT/summary.txt"
  for rc in "$env_rc" "$tests_rc" "$nb_rc" "${cap_rc[@]}" "$ledger_rc" "$plan_rc"; do
    [ "$rc" = 0 ] || [ "$rc" = skip ] || return 1
  done
}

main 2>&1 | tee "$OUT/run.log"
rc=${PIPESTATUS[0]}
rm -rf "$WORK"
exit "$rc"
