# Sourced (". bench/serve_start.sh") by bench/parallel.sh and bench/serve_vs_bench.sh after they
# set B (the build directory) and here (bench/): floe serve on MODEL (default
# /work/synth/q35b-8l.gguf, the 35B-A3B shape cut to 8 layers, Q4_K, made with floe synth when
# missing, ~4.9 GB) with THREADS (2) threads and PARALLEL (8) slots, started, waited for and warmed
# by one short request; sets FLOE, M, T, port and pid, and kills the server when the script exits.
FLOE=$B/bin/floe
M=${MODEL:-/work/synth/q35b-8l.gguf}
T=${THREADS:-2}
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
