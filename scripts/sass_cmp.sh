#!/usr/bin/env bash
# Checks that a change leaves every CUDA kernel's machine code as it was: compiles each
# src/kernels/cuda/*.cu of revision BASE and of the working tree to a cubin (the build's nvcc flags,
# one architecture) and compares every kernel's code (scripts/sass_cmp.py: keyed by name, the
# anonymous namespace's per-file tag aside, so kernels may move between files).
#   scripts/sass_cmp.sh BASE            e.g. scripts/sass_cmp.sh HEAD~1
#   env: ARCH (90), JOBS (2), NVCC (nvcc on PATH, else /usr/local/cuda/bin/nvcc)
# Prints the compile time of each file and the comparison; exit 0 when no kernel changed.
set -euo pipefail
BASE=${1:?usage: scripts/sass_cmp.sh BASE_REVISION}
ARCH=${ARCH:-90}
JOBS=${JOBS:-2}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/base" "$W/out/base" "$W/out/tree"
git -C "$ROOT" archive "$BASE" src include | tar -x -C "$W/base"
# the flags of CMakeLists.txt's CUDA build (Release), for one architecture, to a cubin
compile() { # SRC_ROOT FILE OUT
  local s=$(date +%s.%N)
  "$NVCC" -DFLOE_HAVE_CUDA=1 -I"$1/src" -I"$1/include" -O3 -DNDEBUG --fmad=false -lineinfo -std=c++17 \
    --generate-code=arch=compute_$ARCH,code=sm_$ARCH -cubin -x cu "$2" -o "$3" || { echo "FAIL $2"; return 1; }
  printf '%-28s %6.1f s\n' "${3#$W/out/}" "$(echo "$(date +%s.%N) - $s" | bc)"
}
export -f compile
export NVCC ARCH W
jobs=()
for f in "$W"/base/src/kernels/cuda/*.cu; do jobs+=("$W/base $f $W/out/base/$(basename "$f" .cu).cubin"); done
for f in "$ROOT"/src/kernels/cuda/*.cu; do jobs+=("$ROOT $f $W/out/tree/$(basename "$f" .cu).cubin"); done
printf '%s\n' "${jobs[@]}" | xargs -P "$JOBS" -L 1 bash -c 'compile "$@"' _
join() { local IFS=,; echo "$*"; }
python3 "$ROOT/scripts/sass_cmp.py" "$(join "$W"/out/base/*.cubin)" "$(join "$W"/out/tree/*.cubin)"
