#!/bin/sh
# Standard model speed run (issue 3 "Speed"): a 35B-A3B-shaped Q4_K model cut to 8 layers, 2 threads.
#   bench/model.sh [BUILD_DIR] [MODEL]
# Synthesizes the model if missing (floe synth, ~4.9 GB), measures the memory bandwidth (membw),
# then runs floe bench at depth 0 (with a 512-token prefill) and at depth 2048, and prints the
# decode roofline fraction = weight bytes read per token x tok/s / measured 2-thread bandwidth.
# Other processes on the machine skew everything: the load average is printed with each run.
set -e
B=${1:-build}
M=${2:-/tmp/q35-8l-q4k.gguf}
T=${THREADS:-2}
FLOE=$B/bin/floe
[ -x "$FLOE" ] || { echo "no $FLOE: build first (cmake --build $B)"; exit 1; }
if [ ! -f "$M" ]; then
  echo "synthesizing $M"
  "$FLOE" synth --preset qwen35moe-35b-a3b --layers 8 --type q4_K -o "$M"
fi
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
BW=$("$B/bin/membw" 2G 3 | sed -n 's/.*"threads":2,.*"gbps":\([0-9.]*\).*/\1/p')
echo "membw (2 threads): $BW GB/s"
"$FLOE" bench -m "$M" -t "$T" -p 512 -n 32 -d 0 -r 3 --bw "$BW" --json
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
"$FLOE" bench -m "$M" -t "$T" -p 0 -n 32 -d 2048 -r 3 --bw "$BW" --json
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
