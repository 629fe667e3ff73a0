#!/usr/bin/env bash
# Expert streaming benchmarks (issue 4): floe bench --json decode under --mem-budget, page cache
# dropped before each run (cold) unless WARM=1; DEPTH (default 4) untimed tokens first (non-expert weights paged in); prints one JSON line per configuration, prefixed by
# the configuration and the load average.
#   bench/stream.sh MODEL BUDGET [N_GEN] -- "CONFIG ARGS" ["CONFIG ARGS" ...]
# e.g. bench/stream.sh q3n80.gguf 4G 24 -- "--direct" "" "--prefetch none --direct"
set -uo pipefail
MODEL=${1:?model}; BUDGET=${2:?budget}; N=${3:-24}; shift 3; [ "${1:-}" = "--" ] && shift
FLOE=${FLOE:-$(dirname "$0")/../build/bin/floe}
for cfg in "$@"; do
  [ "${WARM:-0}" = 1 ] || { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "warning: page cache not dropped" >&2; }
  load=$(cut -d' ' -f1 /proc/loadavg)
  # shellcheck disable=SC2086
  out=$("$FLOE" bench -m "$MODEL" -t 2 -p 0 -d "${DEPTH:-4}" -n "$N" -r 1 --json --mem-budget "$BUDGET" $cfg 2>&1 | tail -1)
  echo "{\"config\":\"$cfg\",\"budget\":\"$BUDGET\",\"load\":$load,\"result\":$out}"
done
