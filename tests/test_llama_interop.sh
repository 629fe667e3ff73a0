#!/usr/bin/env bash
# GGUF interchange with a real llama.cpp: every kind of GGUF floe writes loads in llama.cpp
# (node-llama-cpp's prebuilt linux-x64 CPU binaries, pinned in tests/js/llama/package.json), both
# tokenize the prompt alike, and llama.cpp gives floe's greedy tokens (see below for quantized
# random models):
#   - floe convert of the HF fixtures (tests/fixtures/models; they carry no tokenizer, so a small
#     byte-level BPE tokenizer.json is generated beside them), f32 and q8_0;
#   - floe synth of the three tiny presets, f32 / q8_0 / q4_K;
#   - floe quantize outputs (mixed: experts q4_K, output q6_K, the rest q8_0; and all q4_K);
#   - models/default.gguf.
# The qwen35moe and qwen3next HF fixtures use a GatedDeltaNet value head dim (24) different from
# the key head dim (16); llama.cpp assumes them equal (its attn_qkv shape check), so those two are
# checked for floe's side only and reported. `npm ci` runs when node_modules is missing; if it
# fails (offline) the test FAILS.
# Env: FLOE_BIN, FLOE_FIXTURES, FLOE_TMP.
set -u
BIN=${FLOE_BIN:?FLOE_BIN not set}
FIX=${FLOE_FIXTURES:?FLOE_FIXTURES not set}
HERE=$(cd "$(dirname "$0")" && pwd)
JS=$HERE/js/llama
TMP=${FLOE_TMP:-/tmp}/llama_interop.$$
mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
die() { bad "$*"; echo "$pass passed, $fail failed"; exit 1; }

command -v node >/dev/null || die "node not found"
if [ ! -f "$JS/node_modules/node-llama-cpp/package.json" ]; then
  ( flock 9; cd "$JS" && { [ -f node_modules/node-llama-cpp/package.json ] ||
      npm ci --omit=optional --ignore-scripts --no-audit --no-fund --loglevel=error; } ) 9>"${FLOE_TMP:-/tmp}/floe-npm-ci-llama.lock" \
    || die "npm ci in tests/js/llama failed"
fi

models=()   # "path|what"
add() { models+=("$1|$2"); }

echo "== floe convert (HF fixtures)"
for a in qwen3moe qwen35moe qwen3next; do
  d="$TMP/hf_$a"
  mkdir -p "$d"
  for f in config.json generation_config.json model.safetensors; do ln -s "$FIX/models/$a/$f" "$d/$f"; done
  node "$JS/make_tokenizer.mjs" "$(node -e "console.log(require('$FIX/models/$a/config.json').vocab_size)")" "$d/tokenizer.json" ||
    bad "$a: tokenizer.json"
  for t in f32 q8_0; do
    if "$BIN" convert "$d" -o "$TMP/conv_${a}_$t.gguf" --type "$t" >"$TMP/log" 2>&1; then
      if [ "$a" = qwen3moe ]; then add "$TMP/conv_${a}_$t.gguf" "convert $a $t"
      else echo "note: convert $a $t: value head dim != key head dim, which llama.cpp cannot load; floe side only"
        "$BIN" run -m "$TMP/conv_${a}_$t.gguf" -p "hello world" -n 4 --ids >/dev/null 2>&1 && ok "convert $a $t: floe runs it" ||
          bad "convert $a $t: floe run"
      fi
    else bad "convert $a $t: $(tail -1 "$TMP/log")"; fi
  done
done

echo "== floe synth (tiny presets)"
for p in tiny-qwen35moe tiny-qwen3next tiny-qwen3moe; do
  for t in f32 q8_0 q4_K; do
    "$BIN" synth --preset "$p" --type "$t" --seed 11 -o "$TMP/synth_${p}_$t.gguf" >"$TMP/log" 2>&1 &&
      add "$TMP/synth_${p}_$t.gguf" "synth $p $t" || bad "synth $p $t: $(tail -1 "$TMP/log")"
  done
done

echo "== floe quantize"
for p in tiny-qwen35moe tiny-qwen3next tiny-qwen3moe; do
  src="$TMP/synth_${p}_f32.gguf"
  "$BIN" quantize "$src" -o "$TMP/quant_${p}_mixed.gguf" --type q8_0 --expert-type q4_K --output-type q6_K >"$TMP/log" 2>&1 &&
    add "$TMP/quant_${p}_mixed.gguf" "quantize $p q8_0/q4_K/q6_K" || bad "quantize $p mixed: $(tail -1 "$TMP/log")"
  "$BIN" quantize "$src" -o "$TMP/quant_${p}_q4k.gguf" --type q4_K >"$TMP/log" 2>&1 &&
    add "$TMP/quant_${p}_q4k.gguf" "quantize $p q4_K" || bad "quantize $p q4_K: $(tail -1 "$TMP/log")"
done
add "$HERE/../models/default.gguf" "models/default.gguf"

prompts=("hello world and the" "def f(x): return x")
# Files with float weights, and the trained default model, must give floe's greedy tokens exactly.
# Quantized files of the random synth models are checked teacher-forced instead: both engines
# quantize activations for integer dot products, slightly differently (llama.cpp q8_K blocks of
# 256 for K-quants), and random weights leave near-ties that flip a greedy pick now and then. So
# llama.cpp scores floe's continuation: at every step floe's token must be within 0.5 nats of
# llama.cpp's top token and within 0.05 on average (a random continuation scores 2-6 nats a step).
# floe runs with --kv-f32: its default BF16 KV cache rounds more than llama.cpp's F16 one, enough
# to move a near-tie by ~1 nat on these random models.
exact() { case "$1" in *f32*|*default*) return 0;; *) return 1;; esac; }
req="$TMP/req.jsonl"
: >"$req"
for m in "${models[@]}"; do
  path=${m%%|*}
  for pr in "${prompts[@]}"; do
    fg=$("$BIN" run -m "$path" -p "$pr" -n 16 -t 2 --kv-f32 --ids 2>/dev/null)
    node -e 'const [m, p, g, ex] = process.argv.slice(1); const r = {model: m, prompt: p, n: 16};
             if (ex !== "1") r.force = g.trim().split(/ +/).map(Number); console.log(JSON.stringify(r))' \
      "$path" "$pr" "$fg" "$(exact "${m#*|}" && echo 1)" >>"$req"
    echo "$fg" >>"$TMP/floe_gen.txt"
  done
done
echo "== llama.cpp: ${#models[@]} files x ${#prompts[@]} prompts"
timeout 900 node "$JS/greedy.mjs" <"$req" >"$TMP/llama.jsonl" 2>"$TMP/llama.err" || bad "greedy.mjs exited non-zero: $(tail -3 "$TMP/llama.err")"

i=0
for m in "${models[@]}"; do
  path=${m%%|*}
  what=${m#*|}
  for pr in "${prompts[@]}"; do
    i=$((i + 1))
    line=$(sed -n "${i}p" "$TMP/llama.jsonl")
    fg=$(sed -n "${i}p" "$TMP/floe_gen.txt")
    lerr=$(node -e 'const r=JSON.parse(process.argv[1]||"{}"); console.log(r.error||"")' "$line")
    if [ -n "$lerr" ] || [ -z "$line" ]; then bad "$what: llama.cpp failed to load or run: ${lerr:-no answer}"; continue; fi
    lp=$(node -e 'console.log(JSON.parse(process.argv[1]).prompt_ids.join(" "))' "$line")
    fp=$(printf '%s' "$pr" | "$BIN" tokenize -m "$path" --ids 2>/dev/null)
    [ "$fp" = "$lp" ] && ok "$what: prompt '$pr' tokenized alike" || bad "$what: prompt ids floe [$fp] llama.cpp [$lp]"
    if exact "$what"; then
      lg=$(node -e 'console.log(JSON.parse(process.argv[1]).ids.join(" "))' "$line")
      [ "$fg" = "$lg" ] && ok "$what: 16 greedy tokens equal" || bad "$what: greedy floe [$fg] llama.cpp [$lg]"
    else
      v=$(node -e 'const g = JSON.parse(process.argv[1]).gaps; const mx = Math.max(...g), mean = g.reduce((a, b) => a + b, 0) / g.length;
                   console.log((mx <= 0.5 && mean <= 0.05 && g.length === 16 ? "ok" : "bad") + " max " + mx.toFixed(3) + " mean " + mean.toFixed(4) +
                               ", llama.cpp top = floe on " + g.filter((x) => x === 0).length + "/" + g.length)' "$line")
      [ "${v%% *}" = ok ] && ok "$what: floe's greedy continuation scored by llama.cpp: ${v#* }" ||
        bad "$what: floe's greedy continuation scored by llama.cpp: ${v#* }"
    fi
  done
done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
