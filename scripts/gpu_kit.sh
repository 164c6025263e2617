#!/usr/bin/env bash
# make gpu-kit [KIT_PY=3.12]: download the wheels listed in scripts/gpu_kit.txt, for CPython
# $1 (default 3.12) on manylinux x86-64, into .whl/ (KIT_DIR=... elsewhere), and check the size.
# `make gpu` (scripts/gpu_check.sh) installs them on a GPU machine without network.
set -euo pipefail
cd "$(dirname "$0")/.."
PYV=${1:-3.12}
KIT=${KIT_DIR:-.whl}
LIMIT_MIB=${KIT_LIMIT_MIB:-48}
PY=${PYTHON:-python3}
[[ $PYV =~ ^3\.[0-9]+$ ]] || { echo "gpu-kit: Python version '$PYV' is not like 3.12" >&2; exit 2; }
mapfile -t REQS < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' scripts/gpu_kit.txt | grep -v '^$')
PLATFORMS=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_24 manylinux_2_17 manylinux2014 \
           manylinux2010 manylinux1; do
  PLATFORMS+=(--platform "${tag}_x86_64")
done
rm -rf "$KIT"
mkdir -p "$KIT"
echo "gpu-kit: ${#REQS[@]} wheels for CPython $PYV manylinux x86-64 into $KIT/"
$PY -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
  "${PLATFORMS[@]}" -d "$KIT" "${REQS[@]}"
count=$(find "$KIT" -maxdepth 1 -type f -name '*.whl' | wc -l)
bytes=$(find "$KIT" -maxdepth 1 -type f -name '*.whl' -printf '%s\n' | awk '{s += $1} END {print s + 0}')
mib=$(awk -v b="$bytes" 'BEGIN {printf "%.1f", b / 1048576}')
echo "gpu-kit: $count wheels, $mib MiB (limit $LIMIT_MIB MiB)"
if [ "$count" -ne "${#REQS[@]}" ]; then
  echo "gpu-kit: expected ${#REQS[@]} wheels, got $count" >&2; exit 1
fi
if [ "$bytes" -gt $((LIMIT_MIB * 1048576)) ]; then
  echo "gpu-kit: $mib MiB is over the $LIMIT_MIB MiB limit" >&2; exit 1
fi
