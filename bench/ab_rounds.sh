#!/bin/bash
# Alternated A/B(/C..) rounds for kernel bandwidth experiments: per round, membw once, then each
# configuration's bench_matvec with the same args, the order rotated every round. Prints one line
# per case: round, label, type, shape, threads, gbps, pct (of this round's membw), us per call.
# Usage: bench/ab_rounds.sh ROUNDS "LABEL:BUILD_DIR[:ENV=V,ENV=V]" ... -- [bench_matvec args...]
# e.g.   bench/ab_rounds.sh 6 A:build-base B:build-new C:build-new:FLOE_KPF_PRO=0 -- --types q8_0 --nb 1
# Every timing run holds /tmp/floe-bench.lock (shared with other benchmarking sessions).
# Sourced (`. bench/ab_rounds.sh`, as bench/mtp_cost.sh does), it only defines idle_wait.

# wait (up to AB_WAIT seconds, default 120) until the machine was >= 90 % idle over half a second:
# a 2-thread timing next to another process measures the other process
idle_wait() {
  for _ in $(seq $((${AB_WAIT:-120} * 2))); do
    read -r _ u n s i w _ < /proc/stat
    sleep 0.5
    read -r _ u2 n2 s2 i2 w2 _ < /proc/stat
    busy=$(((u2 + n2 + s2) - (u + n + s)))
    idle=$(((i2 + w2) - (i + w)))
    [ $((busy * 10)) -le $((busy + idle)) ] && return 0
  done
  echo "# not idle (load $(cut -d' ' -f1 /proc/loadavg))" >&2
}
[ "${BASH_SOURCE[0]}" != "$0" ] && return 0

set -euo pipefail
N=$1
shift
cfg=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do cfg+=("$1"); shift; done
[ $# -gt 0 ] && shift
nc=${#cfg[@]}
# CPU centiseconds of this shell's waited-for children (the bench runs), from `times`
# (times runs in this shell, not in a command substitution's subshell)
TF=$(mktemp)
own_cs() { times > "$TF"; OWN=$(tail -1 "$TF" | awk '{split($1,a,"m"); split($2,b,"m"); printf "%d", (a[1]*60+a[2]+b[1]*60+b[2])*100}'); }
for r in $(seq "$N"); do
  first=${cfg[0]#*:}
  first=${first%%:*}
  idle_wait
  bwout=$(flock /tmp/floe-bench.lock "$first/bin/membw")
  bw1=$(echo "$bwout" | sed -n 's/.*"threads":1.*"gbps":\([0-9.]*\).*/\1/p')
  bw2=$(echo "$bwout" | sed -n 's/.*"threads":2.*"gbps":\([0-9.]*\).*/\1/p')
  echo "# round $r load $(cut -d' ' -f1 /proc/loadavg) membw $bw1 $bw2"
  for i in $(seq 0 $((nc - 1))); do
    c=${cfg[$(((i + r) % nc))]}
    label=${c%%:*}
    rest=${c#*:}
    dir=${rest%%:*}
    envs=""
    [ "$rest" != "$dir" ] && envs=${rest#*:}
    # retry (up to 5 times) a run during which other processes used more than 3 % of a core
    for try in 1 2 3 4 5; do
      idle_wait
      own_cs
      own0=$OWN
      read -r _ u n s _ < /proc/stat
      t0=$(date +%s%N)
      out=$(flock /tmp/floe-bench.lock env ${envs//,/ } "$dir/bin/bench_matvec" --bw1 "$bw1" --bw2 "$bw2" "$@" 2>/dev/null)
      t1=$(date +%s%N)
      read -r _ u2 n2 s2 _ < /proc/stat
      busy=$(((u2 + n2 + s2) - (u + n + s)))
      own_cs
      other=$((busy - (OWN - own0)))
      wall=$(((t1 - t0) / 10000000))
      if [ $((other * 100)) -le $((wall * 3)) ]; then break; fi
      echo "# round $r $label: other processes used $other of $wall centiseconds, again" >&2
    done
    echo "$out" | sed -n 's/.*"type":"\([^"]*\)","rows":\([0-9]*\),"cols":\([0-9]*\),"threads":\([0-9]\).*"gbps":\([0-9.]*\),"pct_bw":\([0-9.]*\),"us_per_call":\([0-9.]*\).*/\1 \2x\3 \4T \5 \6 \7/p' |
      while read -r l; do echo "$r $label $l"; done
  done
done
