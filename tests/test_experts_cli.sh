#!/usr/bin/env bash
# CLI for expert streaming: floe pack, run --mem-budget (same ids in every mode, --stats counters),
# bench --json streaming fields, refusal of a budget that is too small, a bad option value.
set -u
F=${FLOE_BIN:?}; T=${FLOE_TMP:-/tmp}/xs_cli.$$
mkdir -p "$T"; trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: $2"; fi; }

"$F" synth --preset tiny-qwen3next --type q4_K --set n_expert=16 -o "$T/m.gguf" -t 1 >/dev/null 2>&1; ok $? "synth"
"$F" pack "$T/m.gguf" -o "$T/m.pack" 2>/dev/null; ok $? "pack"
[ -s "$T/m.pack/experts.floepack" ]; ok $? "pack file written"
ref=$("$F" run -m "$T/m.gguf" -p "the quick brown fox" -n 12 --ids -t 2 2>/dev/null)
[ -n "$ref" ]; ok $? "resident run"
for m in "$T/m.gguf" "$T/m.pack"; do
  for o in "" "--direct" "--io pread" "--prefetch none" "--prefetch next,prev --cache lfu" "--verify" \
           "--prefetch next-resid --direct" "--no-prefault"; do
    # shellcheck disable=SC2086
    got=$("$F" run -m "$m" -p "the quick brown fox" -n 12 --ids -t 2 --mem-budget 40M $o 2>/dev/null)
    [ "$got" = "$ref" ]; ok $? "same ids: $m $o"
  done
done
st=$("$F" run -m "$T/m.pack" -p "the quick brown fox" -n 4 --ids -t 2 --mem-budget 40M --stats 2>&1 >/dev/null)
echo "$st" | grep -q "MB read/token" && echo "$st" | grep -q "hit rate per layer"; ok $? "run --stats counters: $st"
js=$("$F" bench -m "$T/m.gguf" -t 2 -p 0 -n 4 -r 1 --json --mem-budget 40M 2>/dev/null)
for k in bytes_read_per_token read_gb_s expert_hit_rate prefetch_precision prefetch_recall io_wait_ms_per_token peak_rss_bytes; do
  echo "$js" | grep -q "\"$k\":" ; ok $? "bench --json has $k"
done
js=$("$F" bench -m "$T/m.gguf" -t 2 -p 0 -n 4 -r 1 --json --mem-budget 40M --disk-bw 1.5 2>/dev/null)
for k in disk_busy_ms_per_token serial_ms_per_token io_ms_per_token io_roofline_frac compute_ms_per_token bound_frac; do
  echo "$js" | grep -q "\"$k\":[0-9]" ; ok $? "bench --json --disk-bw has $k"
done
# peak RSS within budget + the documented 64 MiB slack, on a model whose experts (214 MB) are
# four times the budget: the streamed run must not keep them (resident, the same run peaks >200 MB)
"$F" synth --preset tiny-qwen3moe --type q8_0 --set n_expert=128 --set n_ff_exp=512 -o "$T/big.gguf" -t 1 >/dev/null 2>&1
ok $? "synth 214 MB model"
js=$("$F" bench -m "$T/big.gguf" -t 2 -p 0 -n 16 -r 1 --json --mem-budget 48M --direct 2>/dev/null)
rss=$(echo "$js" | sed -n 's/.*"peak_rss_bytes":\([0-9]*\).*/\1/p')
[ -n "$rss" ] && [ "$rss" -le $(( (48 + 64) << 20 )) ]; ok $? "peak RSS $rss <= 48M budget + 64M slack"
js=$("$F" bench -m "$T/big.gguf" -t 2 -p 0 -n 16 -r 1 --json 2>/dev/null)
rss=$(echo "$js" | sed -n 's/.*"peak_rss_bytes":\([0-9]*\).*/\1/p')
[ -n "$rss" ] && [ "$rss" -gt $(( 112 << 20 )) ]; ok $? "resident run of the same model peaks above it: $rss"
msg=$("$F" run -m "$T/m.gguf" -p "x" -n 1 --mem-budget 1M 2>&1); rc=$?
[ $rc -ne 0 ] && echo "$msg" | grep -q "too small: needs at least"; ok $? "1M refused with the minimum: $msg"
"$F" run -m "$T/m.gguf" -p "x" -n 1 --mem-budget lots >/dev/null 2>&1; [ $? -eq 2 ]; ok $? "bad size is a usage error"
"$F" run -m "$T/m.gguf" -p "x" -n 1 --io floppy >/dev/null 2>&1; [ $? -eq 2 ]; ok $? "bad --io is a usage error"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
