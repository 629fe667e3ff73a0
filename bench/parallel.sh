#!/bin/sh
# floe serve --parallel: aggregate decode tok/s with 1, 2, 4 and 8 concurrent streams, and the
# TTFT of a new request while 3 others decode (bench/parallel_client.py measures).
#
#   sh bench/parallel.sh [BUILD_DIR]
#   env: MODEL (default /work/synth/q35b-8l.gguf: the 35B-A3B shape cut to 8 layers, Q4_K; made
#        with floe synth when missing, ~4.9 GB), THREADS (2), ROUNDS (2: the stream counts run
#        1 2 4 8, then 8 4 2 1, ..., so a shared machine's slow phases spread over all of them),
#        TOKENS (max_tokens per stream, 48), PARALLEL (8). Greedy requests (see parallel_client.py).
# One JSON line per measurement on stdout.
set -eu
B=${1:-build}
R=${ROUNDS:-2}
N=${TOKENS:-48}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/serve_start.sh"
r=0
while [ $r -lt "$R" ]; do
  order="1 2 4 8"
  [ $((r % 2)) -eq 1 ] && order="8 4 2 1"
  for s in $order; do python3 "$here/parallel_client.py" "$port" throughput $s "$N"; done
  python3 "$here/parallel_client.py" "$port" ttft 3 "$N" 60
  r=$((r + 1))
done
curl -s "http://127.0.0.1:$port/metrics" | grep -E '^floe_batch' >&2
