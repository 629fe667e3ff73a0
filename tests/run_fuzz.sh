#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/fuzz_*.c) in a separate tree and runs each one for
# FUZZ_SECONDS (default 30) with -max_len=65536, seeded from tests/fixtures, with the dictionary
# tests/fuzz/NAME.dict where there is one. The library itself is
# built with ASan/UBSan and fuzzer coverage instrumentation too, so overreads in the readers are
# caught, not only in the harness. Crash inputs land in $BUILD/crashes/.
#   tests/run_fuzz.sh                 all targets
#   tests/run_fuzz.sh fuzz_gguf       only the named ones
#   FUZZ_SECONDS=60 FUZZ_BUILD=dir tests/run_fuzz.sh
# Prints "N passed, N failed" (one check per target: it ran and nothing crashed); exit 1 on any crash.
set -u

# Seeds per target: find -name patterns under tests/fixtures (space-separated). A target not
# listed here starts from an empty corpus.
declare -A SEEDS=(
  [fuzz_gguf]="*.gguf"
  [fuzz_safetensors]="*.safetensors"
  [fuzz_hf_config]="*.json"
  [fuzz_tokenizer_json]="tok_seed_*.json"
  [fuzz_pack]="*.floepack"
  [fuzz_logits]="*.lgp"
  [fuzz_server_request]="req_*.json"
  [fuzz_output_parse]="outp_*.txt"
  [fuzz_sampler]="sampler_*.bin"
  [fuzz_tokenize]="tok_text_*.txt"
)

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${FUZZ_BUILD:-$ROOT/build-fuzz}
SECS=${FUZZ_SECONDS:-30}
JOBS=${FUZZ_JOBS:-2}
SAN="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"

if ! command -v clang >/dev/null; then echo "clang not found"; echo "0 passed, 1 failed"; exit 1; fi
CC=clang cmake -S "$ROOT" -B "$BUILD" -DFLOE_FUZZ=ON -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_FLAGS="$SAN" >"$BUILD.cmake.log" 2>&1 || { cat "$BUILD.cmake.log"; echo "0 passed, 1 failed"; exit 1; }

targets=()
for src in "$ROOT"/tests/fuzz/fuzz_*.c; do
  [ -e "$src" ] || continue
  t=$(basename "$src" .c)
  if [ $# -gt 0 ]; then
    want=0; for a in "$@"; do [ "$a" = "$t" ] && want=1; done
    [ $want = 1 ] || continue
  fi
  targets+=("$t")
done
[ ${#targets[@]} -gt 0 ] || { echo "no fuzz targets"; echo "0 passed, 1 failed"; exit 1; }

pass=0; fail=0
for t in "${targets[@]}"; do
  if ! cmake --build "$BUILD" -j"$JOBS" --target "$t" >"$BUILD/$t.build.log" 2>&1; then
    tail -20 "$BUILD/$t.build.log"; echo "FAIL $t: build"; fail=$((fail + 1)); continue
  fi
  corpus="$BUILD/corpus/$t"; mkdir -p "$corpus" "$BUILD/crashes"
  for pat in ${SEEDS[$t]:-}; do
    find "$ROOT/tests/fixtures" -type f -name "$pat" -size -65k -print0 |
      while IFS= read -r -d '' f; do cp -f "$f" "$corpus/seed-$(echo "$f" | md5sum | cut -c1-12)"; done
  done
  n_seed=$(ls "$corpus" | wc -l)
  dict=() # tests/fuzz/NAME.dict: libFuzzer's dictionary of tokens for the target (JSON keys, tags)
  [ -f "$ROOT/tests/fuzz/$t.dict" ] && dict=(-dict="$ROOT/tests/fuzz/$t.dict")
  echo "== $t: ${SECS}s, corpus $n_seed files"
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 \
    "$BUILD/bin/$t" "$corpus" -max_len=65536 -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 \
    ${dict[@]+"${dict[@]}"} -print_final_stats=1 -artifact_prefix="$BUILD/crashes/$t-" >"$BUILD/$t.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    echo "ok   $t: $(grep -E 'stat::number_of_executed_units' "$BUILD/$t.log" | awk '{print $2}') runs, no crash"
    pass=$((pass + 1))
  else
    grep -E "ERROR|runtime error|SUMMARY|Test unit written|^#" "$BUILD/$t.log" | tail -15
    echo "FAIL $t (exit $rc), log: $BUILD/$t.log"
    fail=$((fail + 1))
  fi
done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
