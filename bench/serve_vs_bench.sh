#!/bin/sh
# One stream's decode through floe serve against floe bench's on the same file, alternated
# (the server's per-token overhead; a shared machine's drift spreads over both).
#
#   sh bench/serve_vs_bench.sh [BUILD_DIR]
#   env: MODEL (default /work/synth/q35b-8l.gguf, see bench/parallel.sh), THREADS (2), ROUNDS (3),
#        TOKENS (128)
# Prints per round the server's aggregate_tok_s (bench/parallel_client.py, one greedy request) and
# floe bench's decode_tok_s (-p 60, the client's prompt length in words).
set -eu
B=${1:-build}
FLOE=$B/bin/floe
M=${MODEL:-/work/synth/q35b-8l.gguf}
T=${THREADS:-2}
N=${TOKENS:-128}
here=$(cd "$(dirname "$0")" && pwd)
[ -x "$FLOE" ] || { echo "no $FLOE (build it first)" >&2; exit 1; }
[ -f "$M" ] || { echo "no $M (bench/parallel.sh makes it)" >&2; exit 1; }
log=$(mktemp)
"$FLOE" serve -m "$M" --port 0 -t "$T" -c 2048 --parallel 8 --mtp 0 --no-mmap 2>"$log" &
pid=$!
trap 'kill $pid 2>/dev/null; rm -f "$log"' EXIT
port=""
i=0
while [ $i -lt 600 ]; do
  port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$log")
  [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  i=$((i + 1))
  sleep 0.5
done
curl -sf "http://127.0.0.1:$port/health" >/dev/null || { cat "$log" >&2; exit 1; }
python3 "$here/parallel_client.py" "$port" throughput 1 8 >/dev/null # warm the pages
r=0
while [ $r -lt "${ROUNDS:-3}" ]; do
  printf 'round %s serve ' $((r + 1))
  python3 "$here/parallel_client.py" "$port" throughput 1 "$N" | grep -o '"aggregate_tok_s": [0-9.]*'
  printf 'round %s bench ' $((r + 1))
  "$FLOE" bench -m "$M" -t "$T" -p 60 -n "$N" -r 1 --no-mmap --json 2>/dev/null | grep -o '"decode_tok_s":[0-9.]*'
  r=$((r + 1))
done
