#!/usr/bin/env bash
# Disk roofline for expert streaming (issue 4): random aligned O_DIRECT reads of expert size at queue
# depths 1..64 over a large model file, page cache dropped first (needs root).
#   bench/stream_disk.sh FILE [SIZE_BYTES] [NREADS]
# SIZE default 1769472 (one Qwen3-Next-80B Q4_K expert: gate+up+down, 3 x 589824 bytes).
set -euo pipefail
FILE=${1:?model file}; SIZE=${2:-1769472}; N=${3:-400}
OUT=${TMPDIR:-/tmp}/stream_disk.$$
cc -O2 -o "$OUT" "$(dirname "$0")/stream_disk.c" -luring
sync; echo 3 > /proc/sys/vm/drop_caches || echo "warning: cannot drop caches (not root?)" >&2
echo "# $(date -u +%FT%TZ) $(uptime | sed 's/.*load/load/')" >&2
"$OUT" "$FILE" "$SIZE" "$N" --seed "$(date +%s%N)" 1 2 4 8 16 32 64
rm -f "$OUT"
