#!/usr/bin/env bash
# On a machine with a CUDA GPU: run the cuda-marked tests, then execute every notebook at
# full scale, save its figures, and print one summary. Usage (from the repo root):
#   bash scripts/gpu_check.sh            # uses python3 on PATH (torch with CUDA, jupyter stack)
#   OUT=/some/dir bash scripts/gpu_check.sh   # where logs, bench JSON and figures go
# Machines without network can carry the Jupyter stack as wheels in .whl/ (see README).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-gpu-run}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" MPLBACKEND=Agg LESSONS_DEVICE=cuda
export LESSONS_SCALE=${LESSONS_SCALE:-full} LESSONS_STRICT=1 PYTHONUNBUFFERED=1
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU visible'; print('torch', torch.__version__, torch.cuda.get_device_name())" || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null

echo "== cuda tests"
$PY -m pytest -q -p no:cacheprovider -m cuda tests/ 2>&1 | tee "$OUT/cuda_tests.log"
tests_rc=${PIPESTATUS[0]}

echo "== notebooks at scale $LESSONS_SCALE"
$PY scripts/bench.py --cells --images "$OUT/images" --out "$OUT/gpu_bench.json" 2>&1 | tee "$OUT/notebooks.log"
nb_rc=${PIPESTATUS[0]}

echo "== summary"
echo "cuda tests: $([ "$tests_rc" = 0 ] && echo passed || echo "FAILED (rc $tests_rc)")"
echo "notebooks:  $([ "$nb_rc" = 0 ] && echo all executed || echo "FAILED (rc $nb_rc)")"
echo "results in $OUT/ (gpu_bench.json, logs, images/)"
[ "$tests_rc" = 0 ] && [ "$nb_rc" = 0 ]
