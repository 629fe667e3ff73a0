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
FLOE=$B/bin/floe
M=${MODEL:-/work/synth/q35b-8l.gguf}
T=${THREADS:-2}
R=${ROUNDS:-2}
N=${TOKENS:-48}
here=$(cd "$(dirname "$0")" && pwd)
[ -x "$FLOE" ] || { echo "no $FLOE (build it first)" >&2; exit 1; }
if [ ! -f "$M" ]; then
  echo "synthesizing $M" >&2
  mkdir -p "$(dirname "$M")"
  "$FLOE" synth --preset qwen35moe-35b-a3b --layers 8 --type q4_K -o "$M" >&2
fi
log=$(mktemp)
# --no-mmap: the weights in huge-page memory (AUTO maps the file when the shared machine's free
# memory looks short, and 4 KiB pages make decode ~3x slower)
"$FLOE" serve -m "$M" --port 0 -t "$T" -c 2048 --parallel "${PARALLEL:-8}" --mtp 0 --no-mmap 2>"$log" &
pid=$!
trap 'kill $pid 2>/dev/null; rm -f "$log"' EXIT
port=""
i=0
while [ $i -lt 600 ]; do # loading a 4.9 GB file can take a while on a busy disk
  port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$log")
  [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  i=$((i + 1))
  sleep 0.5
done
curl -sf "http://127.0.0.1:$port/health" >/dev/null || { cat "$log" >&2; exit 1; }
python3 "$here/parallel_client.py" "$port" throughput 1 8 >/dev/null # warm the pages and the caches
r=0
while [ $r -lt "$R" ]; do
  order="1 2 4 8"
  [ $((r % 2)) -eq 1 ] && order="8 4 2 1"
  for s in $order; do python3 "$here/parallel_client.py" "$port" throughput $s "$N"; done
  python3 "$here/parallel_client.py" "$port" ttft 3 "$N" 60
  r=$((r + 1))
done
curl -s "http://127.0.0.1:$port/metrics" | grep -E '^floe_batch' >&2
