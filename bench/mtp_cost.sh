#!/bin/bash
# Speculative decoding with the MTP head: what it costs and what it gains (results in bench/results.tsv).
#  1. the default model, 2 threads: floe bench --mtp K for K = 1..4 and -1 (auto); each run
#     alternates mtp 0 and mtp K per repetition (same machine state for both), so decode_tok_s vs
#     decode_tok_s_mtp0 is an A/B in one run; also the per-position acceptance (--mtp 4);
#  2. bench_verify on the default model (1 and 2 threads): a verify step of 1+k rows vs a decode
#     step, and the speedup that predicts at the acceptance measured in 1;
#  3. bench_verify on a 35B-A3B-shape synth cut to 8 layers (SYNTH, made if missing, kept outside
#     git), resident and with the experts streamed through a cache of CACHE_MB (--mem-budget's
#     question: a verify step reads the union of its rows' experts), scaled to 40 layers.
# Every timed run waits for a mostly idle machine (bench/ab_rounds.sh's idle_wait, AB_WAIT seconds
# at most, default 60) and holds /tmp/floe-bench.lock (shared with other benchmarking sessions).
# Usage: bench/mtp_cost.sh BUILD_DIR [OUT.jsonl (default mtp_cost.jsonl)]   (env: REPS, ROUNDS, SYNTH, CACHE_MB, N_GEN)
set -euo pipefail
B=${1:?usage: bench/mtp_cost.sh BUILD_DIR [OUT.jsonl]}
OUT=${2:-mtp_cost.jsonl}
REPS=${REPS:-7}
ROUNDS=${ROUNDS:-30}
N_GEN=${N_GEN:-256}
SYNTH=${SYNTH:-/work/synth/q35b-8l.gguf}
CACHE_MB=${CACHE_MB:-1024}
DM=models/default.gguf
AB_WAIT=${AB_WAIT:-60}
. "$(dirname "${BASH_SOURCE[0]}")/ab_rounds.sh" # idle_wait
run() { idle_wait; echo "# load $(cut -d' ' -f1 /proc/loadavg): $*" >&2; flock /tmp/floe-bench.lock "$@"; }
TMP=$(mktemp)
trap 'rm -f "$TMP"' EXIT
{
  for K in 4 1 2 3 -1; do
    run "$B/bin/floe" bench -m $DM -p 0 -n "$N_GEN" -r "$REPS" -t 2 --mtp $K --json | grep '"bench":"mtp"'
  done
} | tee -a "$OUT" >"$TMP"
ALPHA=$(grep '"mtp":4,' "$TMP" | sed 's/.*"mtp_accept_rate_pos":\[\([^]]*\)\].*/\1/')
echo "# default model per-position acceptance (k = 4): $ALPHA" >&2
for T in 1 2; do
  run "$B/bin/bench_verify" -m $DM -t $T -r "$ROUNDS" --alpha "$ALPHA" | tee -a "$OUT"
done
if [ ! -f "$SYNTH" ]; then
  mkdir -p "$(dirname "$SYNTH")"
  "$B/bin/floe" synth --preset qwen35moe-35b-a3b --type q4_K --layers 8 -t 1 -o "$SYNTH" >&2
fi
R35=$((ROUNDS / 3 > 5 ? ROUNDS / 3 : 5))
run "$B/bin/bench_verify" -m "$SYNTH" -t 2 -r $R35 --layers-total 40 --alpha "$ALPHA" | tee -a "$OUT"
run "$B/bin/bench_verify" -m "$SYNTH" -t 2 -r $R35 --layers-total 40 --cache-mb "$CACHE_MB" --alpha "$ALPHA" | tee -a "$OUT"
