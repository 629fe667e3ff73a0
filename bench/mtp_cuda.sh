#!/usr/bin/env bash
# Run THERE (the GPU machine), after `scripts/gpu-test.sh build`: speculative decoding with the MTP
# head on the GPU. floe bench of $MODEL (default: the default model) with --device cuda -p 0 -n 256
# -r 3 --mtp K for K in $KS (mtp 0 and mtp K alternate per repetition, bench_mtp), each K twice in
# a row: the one-pass greedy step (default) and the composed step (FLOE_CUDA_MTP_FUSED=0: every
# draft and the verify their own recorded step and host round trip); then FLOE_CUDA_SPEC_GRAPH=0
# (nothing recorded) for K in $KS_NOREC. Then bench_verify --device cuda on $MODEL: the cost of a
# plain step, a verify of 1+k rows, a draft and a one-pass step of k drafts (VERIFY=0: skipped);
# with SYNTH=FILE (e.g. the 35B-A3B shape, scripts/gpu-test.sh synth35) the same on that file.
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
run() { # label, K, then env settings...
  local label=$1 k=$2
  shift 2
  echo "== $label --mtp $k" >>"$f"
  env "$@" timeout 40 "$BUILD/bin/floe" bench -m "$MODEL" --device cuda -p 0 -n 256 -r 3 --mtp "$k" --json >>"$f" 2>&1 ||
    echo "FAILED rc $?" >>"$f"
}
for k in ${KS:-0 1 2 3 -1}; do
  run one-pass "$k" FLOE_CUDA_MTP_FUSED=1
  run composed "$k" FLOE_CUDA_MTP_FUSED=0
done
for k in ${KS_NOREC:-3}; do run not-recorded "$k" FLOE_CUDA_SPEC_GRAPH=0; done
if [ "${VERIFY:-1}" != 0 ]; then
  echo "== bench_verify --device cuda $MODEL" >>"$f"
  timeout 60 "$BUILD/bin/bench_verify" -m "$MODEL" --device cuda -r 41 >>"$f" 2>&1 || echo "FAILED rc $?" >>"$f"
  if [ -n "${SYNTH:-}" ] && [ -f "$SYNTH" ]; then
    echo "== bench_verify --device cuda $SYNTH" >>"$f"
    timeout 120 "$BUILD/bin/bench_verify" -m "$SYNTH" --device cuda -r 15 >>"$f" 2>&1 || echo "FAILED rc $?" >>"$f"
  fi
fi
grep -E '^==|"bench":"(mtp|verify_cost)"|FAILED' "$f"
