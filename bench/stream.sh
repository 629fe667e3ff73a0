#!/usr/bin/env bash
# Expert streaming benchmarks (issue 4): floe bench --json decode under --mem-budget, page cache
# dropped before each run (cold) unless WARM=1; DEPTH (default 4) untimed tokens first (non-expert
# weights paged in). Right before each run the disk is measured (bench/stream_disk: random aligned
# O_DIRECT reads of XSIZE bytes, default one 80B Q4_K expert, at queue depths 1-64, cold: page
# cache dropped and fresh random offsets (the host of this VM caches recently read blocks); DISK_N
# reads per depth, default 150; DISK=0 skips it) and the best depth's GB/s is passed to floe bench
# as --disk-bw, which then reports the I/O roofline terms and io_roofline_frac.
# REPS (default 1) repeats the whole list of configurations, interleaved (A B C A B C ...), so
# drift of the shared machine spreads over all of them. One JSON line per run, prefixed by the
# configuration, the repetition, the load average and the disk measurement. WINDOW=W adds
# floe bench --window W (per-window lines are kept in the run's "windows" array).
#   bench/stream.sh MODEL BUDGET [N_GEN] -- "CONFIG ARGS" ["CONFIG ARGS" ...]
# e.g. REPS=3 bench/stream.sh q3n80.gguf 4G 24 -- "--direct" "" "--prefetch none --direct"
set -uo pipefail
MODEL=${1:?model}; BUDGET=${2:?budget}; N=${3:-24}; shift 3; [ "${1:-}" = "--" ] && shift
FLOE=${FLOE:-$(dirname "$0")/../build/bin/floe}
SD=${STREAM_DISK:-$(dirname "$FLOE")/stream_disk}
DATA=$MODEL; [ -d "$MODEL" ] && DATA=$MODEL/experts.floepack
for rep in $(seq 1 "${REPS:-1}"); do
  for cfg in "$@"; do
    disk=null; bwarg=""
    if [ "${DISK:-1}" = 1 ] && [ -x "$SD" ]; then
      sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
      d=$("$SD" "$DATA" "${XSIZE:-1769472}" "${DISK_N:-150}" --seed "$(date +%s%N)" 1 4 16 64 2>/dev/null)
      best=$(echo "$d" | sed -n 's/.*"gb_s":\([0-9.]*\).*/\1/p' | sort -g | tail -1)
      if [ -n "$best" ]; then
        disk="{\"best_gb_s\":$best,\"depths\":[$(echo "$d" | paste -sd, -)]}"
        bwarg="--disk-bw $best"
      fi
    fi
    [ "${WARM:-0}" = 1 ] || { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "warning: page cache not dropped" >&2; }
    load=$(cut -d' ' -f1 /proc/loadavg)
    win=""; [ -n "${WINDOW:-}" ] && win="--window $WINDOW"
    # shellcheck disable=SC2086
    all=$("$FLOE" bench -m "$MODEL" -t 2 -p 0 -d "${DEPTH:-4}" -n "$N" -r 1 --json --mem-budget "$BUDGET" $bwarg $win $cfg 2>&1)
    out=$(echo "$all" | tail -1)
    wins=$(echo "$all" | grep '"bench":"window"' | paste -sd, -)
    echo "{\"config\":\"$cfg\",\"rep\":$rep,\"budget\":\"$BUDGET\",\"load\":$load,\"disk\":$disk,\"windows\":[${wins}],\"result\":$out}"
  done
done
