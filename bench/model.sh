#!/bin/sh
# Standard model speed run (issue 3 "Speed"): a 35B-A3B-shaped Q4_K model cut to 8 layers, 2 threads.
#   bench/model.sh [BUILD_DIR] [MODEL]
# Synthesizes the model if missing (floe synth, ~4.9 GB), measures the memory bandwidth (membw),
# then runs floe bench at depth 0 (with a 512-token prefill) and at depth 2048, and prints the
# decode roofline fraction = weight bytes read per token x tok/s / measured 2-thread bandwidth
# (membw right before and after each bench: see run() below).
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
# This VM's memory bandwidth moves 28-33 GB/s from one minute to the next (other guests): membw
# runs right before and right after each bench, and the summary gives the decode fraction
# against both and their mean (the JSON's roofline_frac uses the "before" figure).
bw2() { "$B/bin/membw" 2G 3 > /tmp/floe-membw.$$; sed -n 's/.*"threads":2,.*"gbps":\([0-9.]*\).*/\1/p' /tmp/floe-membw.$$; }
lat() { sed -n 's/.*"memlat".*"ns":\([0-9.]*\).*/\1/p' /tmp/floe-membw.$$; }
run() { # depth, then floe bench args
  d=$1; shift
  echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
  b0=$(bw2); l0=$(lat)
  js=$("$FLOE" bench -m "$M" -t "$T" -d "$d" --bw "$b0" --json "$@")
  b1=$(bw2); l1=$(lat)
  echo "$js"
  echo "memory latency before ${l0} ns, after ${l1} ns (decode follows it: the streams are latency-bound per core)"
  echo "$js" | awk -v b0="$b0" -v b1="$b1" -v d="$d" '{
    match($0, /"decode_tok_s":[0-9.]+/); tps = substr($0, RSTART + 15, RLENGTH - 15) + 0
    match($0, /"weight_bytes_per_token":[0-9]+/); wb = substr($0, RSTART + 25, RLENGTH - 25) + 0
    g = tps * wb / 1e9
    printf "depth %s: decode %.2f tok/s = %.2f GB/s of weights; membw before %.2f after %.2f: roofline %.3f / %.3f, mean %.3f\n",
           d, tps, g, b0, b1, g / b0, g / b1, 2 * g / (b0 + b1) }'
}
run 0 -p 512 -n 64 -r 3
run 2048 -p 0 -n 64 -r 3
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
rm -f /tmp/floe-membw.$$
