#!/bin/bash
# Issue 2's kernel goal, measured against the bandwidth of the same moment: for each type, expert
# shape and thread count, membw (1 GiB, best of 3) right before and right after one bench_matvec
# case; the case's fraction is its GB/s over the mean of the two (this VM's bandwidth moves
# 28-33 GB/s within a minute, so one membw per round mis-scales cases run far from it).
#   [SHAPES="8192x2048 2048x4096"] bench/kern_goal.sh [BUILD_DIR] [ROUNDS] [TYPES]
#   (default: the expert shapes 512x2048 2048x512, build, 3 rounds, q4_K,q8_0,iq4_xs,mlx4_g64_bf16)
# Prints one line per case: round type shape threads gbps bw_before bw_after pct; then per case
# the mean and the minimum over rounds. Holds /tmp/floe-bench.lock while timing.
set -euo pipefail
B=${1:-build}
R=${2:-3}
TYPES=${3:-q4_K,q8_0,iq4_xs,mlx4_g64_bf16}
bw() { "$B/bin/membw" 1G 3 | sed -n "s/.*\"threads\":$1,.*\"gbps\":\([0-9.]*\).*/\1/p"; }
out=$(mktemp)
for r in $(seq "$R"); do
  for t in ${TYPES//,/ }; do
    for s in ${SHAPES:-512x2048 2048x512}; do
      for th in 1 2; do
        line=$(flock /tmp/floe-bench.lock bash -c "
          b0=\$('$B/bin/membw' 1G 3 | sed -n 's/.*\"threads\":$th,.*\"gbps\":\([0-9.]*\).*/\1/p')
          g=\$('$B/bin/bench_matvec' --types $t --shapes $s --nb 1 --threads $th | sed -n 's/.*\"gbps\":\([0-9.]*\).*/\1/p')
          b1=\$('$B/bin/membw' 1G 3 | sed -n 's/.*\"threads\":$th,.*\"gbps\":\([0-9.]*\).*/\1/p')
          echo \$g \$b0 \$b1")
        set -- $line
        pct=$(awk -v g="$1" -v a="$2" -v b="$3" 'BEGIN{printf "%.1f", 200 * g / (a + b)}')
        echo "$r $t $s ${th}T $1 $2 $3 $pct" | tee -a "$out"
      done
    done
  done
done
echo "# per case: mean and minimum % over $R rounds"
awk '{k=$2" "$3" "$4; n[k]++; s[k]+=$8; if(!(k in m) || $8<m[k]) m[k]=$8} END{for(k in n) printf "%s mean %.1f min %.1f\n", k, s[k]/n[k], m[k]}' "$out" | sort
rm -f "$out"
