#!/usr/bin/env bash
# Run THERE (the GPU machine), after `scripts/gpu-test.sh build`: speculative decoding with the MTP
# head on the GPU. floe bench of $MODEL (default: the default model) with --device cuda -p 0 -n 256
# -r 3 --mtp K for K in $KS (mtp 0 and mtp K alternate per repetition, bench_mtp), then the same
# with FLOE_CUDA_SPEC_GRAPH=0 (verify chunks and MTP evaluations not recorded) for K in $KS_NOREC.
# Everything goes to $OUT/mtp_bench.log (or build-gpu/logs); the mtp lines are printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-$PWD/build-gpu}
LOG=${OUT:-$BUILD/logs}
MODEL=${MODEL:-models/default.gguf}
DEPS=${DEPS:-/tmp/deps}
export LD_LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$LOG"
f=$LOG/mtp_bench.log
: >"$f"
run() { # label, env settings..., then K
  local label=$1 k=$2
  shift 2
  echo "== $label --mtp $k" >>"$f"
  env "$@" timeout 40 "$BUILD/bin/floe" bench -m "$MODEL" --device cuda -p 0 -n 256 -r 3 --mtp "$k" --json >>"$f" 2>&1 ||
    echo "FAILED rc $?" >>"$f"
}
for k in ${KS:-0 1 2 3 -1}; do run recorded "$k" FLOE_CUDA_SPEC_GRAPH=1; done
for k in ${KS_NOREC:-3}; do run not-recorded "$k" FLOE_CUDA_SPEC_GRAPH=0; done
grep -E '^==|"bench":"mtp"|FAILED' "$f"
