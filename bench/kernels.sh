#!/bin/bash
# Kernel benchmarks: memory read bandwidth (bench/membw.c), then matvec / small-batch throughput
# for every type out of cache (bench/bench_matvec.c), as JSON lines on stdout.
# Run on a quiet machine: it waits (up to 10 min) for the 1-minute load average to drop below 1.
# Usage: bench/kernels.sh [build-dir] [extra bench_matvec args, e.g. --types q4_K,q8_0]
# Env: FLOE_ISA=scalar|avx2|avx512 forces the kernel ISA; KERNELS_NOWAIT=1 skips the load wait.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
shift || true
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$B" -j2 --target membw bench_matvec >/dev/null
if [ -z "${KERNELS_NOWAIT:-}" ]; then
  for i in $(seq 60); do
    l=$(cut -d' ' -f1 /proc/loadavg)
    awk -v l="$l" 'BEGIN{exit !(l < 1.0)}' && break
    echo "# load $l, waiting" >&2
    sleep 10
  done
fi
echo "# $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
bwout=$("$B/bin/membw")
echo "$bwout"
bw1=$(echo "$bwout" | sed -n 's/.*"threads":1.*"gbps":\([0-9.]*\).*/\1/p')
bw2=$(echo "$bwout" | sed -n 's/.*"threads":2.*"gbps":\([0-9.]*\).*/\1/p')
"$B/bin/bench_matvec" --bw1 "$bw1" --bw2 "$bw2" "$@"
