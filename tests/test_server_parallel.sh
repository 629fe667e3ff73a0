#!/usr/bin/env bash
# floe serve --parallel: continuous batching on the real default model (models/default.gguf),
# driven with curl against servers on 127.0.0.1.
#   - a seeded sampled request and a greedy one give bit-identical text alone and while 3 other
#     requests decode; those 3 (of different lengths: they finish at different steps) give the
#     text they give alone although a request joined them mid-decode;
#   - a streamed chat request under load gives the text of the same request alone;
#   - a request cancelled mid-decode (client gone) leaves the others' text unchanged;
#   - the worker really batches: /metrics shows forward passes holding several requests, with
#     more than one row per batched pass on average;
#   - the same with --mem-budget (experts streamed from disk, every slot in the budget), whose
#     text also equals the resident server's;
#   - --mtp 2: greedy text identical to --mtp 0, and the MTP acceptance counters in /metrics.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
bin="${FLOE_BIN:-$here/../build/bin/floe}"
model="$here/../models/default.gguf"
tmp="${FLOE_TMP:-/tmp}/server_parallel.$$"
pass=0 failn=0
ok() { echo "ok: $*"; pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; failn=$((failn + 1)); }
check() { if eval "$1"; then ok "$2"; else bad "$2"; fi; }
[ -x "$bin" ] || { echo "FAIL: $bin not built"; echo "0 passed, 1 failed"; exit 1; }
[ -f "$model" ] || { echo "FAIL: no $model"; echo "0 passed, 1 failed"; exit 1; }
command -v curl >/dev/null && command -v jq >/dev/null || { echo "FAIL: needs curl and jq"; echo "0 passed, 1 failed"; exit 1; }
mkdir -p "$tmp"
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

# start NAME ARGS...: a server on a free port; sets $port and $pid
start() {
  local name=$1; shift
  "$bin" serve -m "$model" --port 0 -t 2 -c 1024 "$@" >"$tmp/$name.log" 2>&1 &
  pid=$!
  port=""
  for _ in $(seq 1 100); do
    port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$tmp/$name.log")
    [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "server $name did not start:"; cat "$tmp/$name.log"; return 1
}
stop() { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=""; }

# comp PROMPT MAX TEMP SEED: the text of a /v1/completions request
comp() {
  jq -nc --arg p "$1" --argjson m "$2" --argjson t "$3" --argjson s "$4" \
    '{prompt:$p,max_tokens:$m,temperature:$t,seed:$s}' |
    curl -s "http://127.0.0.1:$port/v1/completions" -H 'content-type: application/json' -d @- |
    jq -r '.choices[0].text // ("ERROR " + (.error.message // "?"))'
}
# chat_stream PROMPT MAX SEED: the concatenated deltas of a streamed chat completion
chat_stream() {
  jq -nc --arg p "$1" --argjson m "$2" --argjson s "$3" \
    '{messages:[{role:"user",content:$p}],max_tokens:$m,temperature:0.9,seed:$s,stream:true}' |
    curl -sN "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' -d @- |
    sed -n 's/^data: //p' | grep -v '^\[DONE\]' | jq -rj '.choices[0].delta.content // empty'
}
metric() { curl -s "http://127.0.0.1:$port/metrics" | awk -v k="$1" '$1 == k { print $2 }'; }
# wait until N requests are being generated (at most ~10 s)
wait_processing() {
  for _ in $(seq 1 200); do
    [ "$(metric floe_requests_processing)" = "$1" ] && return 0
    sleep 0.05
  done
  return 1
}

P1='import os
import sys

def main(argv):'
P2='class Stack:
    def __init__(self):'
P3='def fibonacci(n):
    """Return the n-th Fibonacci number."""'
Q='def add(a, b):'
M1=120 M2=90 M3=150

# run_suite NAME: the alone / under-load comparisons on the running server; texts in $tmp/NAME.*
run_suite() {
  local n=$1
  comp "$P1" $M1 0.7 11 >"$tmp/$n.p1.alone"
  comp "$P2" $M2 0.7 12 >"$tmp/$n.p2.alone"
  comp "$P3" $M3 0 0 >"$tmp/$n.p3.alone"
  comp "$Q" 48 0.8 7 >"$tmp/$n.q.alone"
  comp "$Q" 48 0 0 >"$tmp/$n.g.alone"
  chat_stream "Write a function that reverses a list." 40 5 >"$tmp/$n.c.alone"
  check "[ -s $tmp/$n.p1.alone ] && ! grep -q '^ERROR' $tmp/$n.p1.alone" "$n: request alone answers"
  # three requests decode; a sampled one joins mid-decode
  comp "$P1" $M1 0.7 11 >"$tmp/$n.p1.load" &
  local b1=$!
  comp "$P2" $M2 0.7 12 >"$tmp/$n.p2.load" &
  local b2=$!
  comp "$P3" $M3 0 0 >"$tmp/$n.p3.load" &
  local b3=$!
  wait_processing 3 || bad "$n: 3 requests never decoded together"
  comp "$Q" 48 0.8 7 >"$tmp/$n.q.load"
  wait $b1 $b2 $b3
  check "cmp -s $tmp/$n.q.alone $tmp/$n.q.load" "$n: seeded sampled request alone == while 3 others decode"
  check "cmp -s $tmp/$n.p1.alone $tmp/$n.p1.load" "$n: request 1 unchanged by a request joining mid-decode"
  check "cmp -s $tmp/$n.p2.alone $tmp/$n.p2.load" "$n: request 2 unchanged by a request joining mid-decode"
  check "cmp -s $tmp/$n.p3.alone $tmp/$n.p3.load" "$n: greedy request 3 unchanged by a request joining mid-decode"
  # greedy and streamed chat under load
  comp "$P1" $M1 0.7 11 >"$tmp/$n.p1.load2" &
  b1=$!
  comp "$P3" $M3 0 0 >"$tmp/$n.p3.load2" &
  b3=$!
  comp "$P2" $M2 0.7 12 >/dev/null &
  b2=$!
  wait_processing 3 || bad "$n: 3 requests never decoded together (2)"
  comp "$Q" 48 0 0 >"$tmp/$n.g.load" &
  local b4=$!
  chat_stream "Write a function that reverses a list." 40 5 >"$tmp/$n.c.load"
  wait $b1 $b2 $b3 $b4
  check "cmp -s $tmp/$n.g.alone $tmp/$n.g.load" "$n: greedy request alone == under load"
  check "cmp -s $tmp/$n.c.alone $tmp/$n.c.load" "$n: streamed chat request alone == under load"
  check "cmp -s $tmp/$n.p1.alone $tmp/$n.p1.load2 && cmp -s $tmp/$n.p3.alone $tmp/$n.p3.load2" \
    "$n: two requests unchanged while others join and leave"
  # one request leaves mid-decode (the client goes away)
  comp "$P1" $M1 0.7 11 >"$tmp/$n.p1.load3" &
  b1=$!
  comp "$P3" $M3 0 0 >"$tmp/$n.p3.load3" &
  b3=$!
  jq -nc --arg p "$P2" '{prompt:$p,max_tokens:400,temperature:0.7,seed:3,stream:true}' |
    curl -sN --max-time 0.4 "http://127.0.0.1:$port/v1/completions" -H 'content-type: application/json' -d @- \
      >/dev/null 2>&1
  wait $b1 $b3
  check "cmp -s $tmp/$n.p1.alone $tmp/$n.p1.load3 && cmp -s $tmp/$n.p3.alone $tmp/$n.p3.load3" \
    "$n: two requests unchanged by a cancelled one beside them"
  local bs sm br
  bs=$(metric floe_batched_steps_total)
  br=$(metric floe_batched_rows_total)
  sm=$(metric floe_batch_sessions_max)
  echo "   $n metrics: batched steps $bs, rows in them $br, most requests in one pass $sm"
  check "[ ${bs:-0} -gt 20 ] && [ ${sm:-0} -ge 3 ]" "$n: forward passes held several requests (/metrics)"
  check "awk -v r=${br:-0} -v s=${bs:-0} 'BEGIN { exit !(s > 0 && r / s > 1.5) }'" "$n: rows per batched pass > 1.5"
  check "[ \"\$(metric floe_requests_cancelled_total)\" -ge 1 ]" "$n: the cancelled request is counted"
}

start resident --parallel 4 --mtp 0 || { echo "0 passed, 1 failed"; exit 1; }
run_suite resident
stop

# streamed experts: every slot inside the budget
start budget --parallel 4 --mtp 0 --mem-budget 158M || { echo "0 passed, 1 failed"; exit 1; }
check "grep -q 'slots' $tmp/budget.log" "mem-budget: server loaded with 4 slots"
run_suite budget
check "[ \"\$(metric floe_expert_bytes_read_total)\" -gt 0 ]" "mem-budget: experts were read from disk"
stop
check "cmp -s $tmp/resident.q.alone $tmp/budget.q.alone && cmp -s $tmp/resident.p3.alone $tmp/budget.p3.alone" \
  "mem-budget: text identical to the resident server"

# MTP speculative decoding: greedy identical, acceptance in /metrics
start mtp --parallel 4 --mtp 2 || { echo "0 passed, 1 failed"; exit 1; }
comp "$P3" $M3 0 0 >"$tmp/mtp.p3"
comp "$Q" 48 0 0 >"$tmp/mtp.g"
check "cmp -s $tmp/resident.p3.alone $tmp/mtp.p3 && cmp -s $tmp/resident.g.alone $tmp/mtp.g" \
  "mtp 2: greedy text identical to --mtp 0"
dr=$(metric floe_mtp_drafted_tokens_total)
ac=$(metric floe_mtp_accepted_tokens_total)
d1=$(curl -s "http://127.0.0.1:$port/metrics" | awk '$1 == "floe_mtp_position_drafted_total{position=\"1\"}" { print $2 }')
echo "   mtp metrics: drafted $dr accepted $ac, position 1 drafted $d1, ratio $(metric floe_mtp_acceptance_ratio)"
check "[ ${dr:-0} -gt 0 ] && [ ${ac:-0} -gt 0 ] && [ ${d1:-0} -gt 0 ]" "mtp 2: acceptance counters in /metrics"
# under load the MTP request decodes batched, without drafts: still the same greedy text
comp "$P1" $M1 0.7 11 >/dev/null &
b1=$!
comp "$P2" $M2 0.7 12 >/dev/null &
b2=$!
wait_processing 2 || bad "mtp: 2 requests never decoded together"
comp "$P3" $M3 0 0 >"$tmp/mtp.p3.load"
wait $b1 $b2
check "cmp -s $tmp/resident.p3.alone $tmp/mtp.p3.load" "mtp 2: greedy text under load identical"
stop

echo "$pass passed, $failn failed"
[ "$failn" -eq 0 ]
