#!/bin/sh
# One stream's decode through floe serve against floe bench's on the same file, alternated
# (the server's per-token overhead; a shared machine's drift spreads over both).
#
#   sh bench/serve_vs_bench.sh [BUILD_DIR]
#   env: MODEL, THREADS, PARALLEL (bench/serve_start.sh), ROUNDS (3), TOKENS (128)
# Prints per round the server's aggregate_tok_s (bench/parallel_client.py, one greedy request) and
# floe bench's decode_tok_s (-p 60, the client's prompt length in words).
set -eu
B=${1:-build}
N=${TOKENS:-128}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/serve_start.sh"
r=0
while [ $r -lt "${ROUNDS:-3}" ]; do
  printf 'round %s serve ' $((r + 1))
  python3 "$here/parallel_client.py" "$port" throughput 1 "$N" | grep -o '"aggregate_tok_s": [0-9.]*'
  printf 'round %s bench ' $((r + 1))
  "$FLOE" bench -m "$M" -t "$T" -p 60 -n "$N" -r 1 --no-mmap --json 2>/dev/null | grep -o '"decode_tok_s":[0-9.]*'
  r=$((r + 1))
done
