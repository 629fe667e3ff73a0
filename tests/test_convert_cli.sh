#!/usr/bin/env bash
# floe convert through the CLI: converts each HF and MLX fixture, checks `floe info` reads the
# output, and that errors (usage, bad type, not a model dir, unsupported model_type, missing
# tensor, output in a missing directory) give one line on stderr, a non-zero exit and no file.
BIN=${FLOE_BIN:-build/bin/floe}
FIX=${FLOE_FIXTURES:-tests/fixtures}
TMP=${FLOE_TMP:-/tmp}/convert_sh.$$
mkdir -p "$TMP"
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $2"; fi; }

for m in models/qwen3moe models/qwen3next models/qwen35moe mlx/qwen3next mlx/qwen35moe; do
  out="$TMP/$(echo "$m" | tr / _).gguf"
  "$BIN" convert "$FIX/$m" -o "$out" --type q8_0 -t 2 >"$TMP/out" 2>"$TMP/err"
  ok $? "convert $m: $(cat "$TMP/err")"
  grep -q "^wrote $out" "$TMP/out"; ok $? "convert $m prints a summary"
  "$BIN" info -m "$out" >"$TMP/info" 2>&1
  ok $? "floe info on converted $m: $(head -3 "$TMP/info")"
  case $m in *qwen3moe) a=qwen3moe ;; *qwen3next) a=qwen3next ;; *) a=qwen35moe ;; esac
  grep -q "$a" "$TMP/info"; ok $? "floe info names the architecture $a"
  "$BIN" info -m "$out" --tensor blk.0.ffn_gate_inp.weight >"$TMP/vals" 2>&1
  n=$(wc -l <"$TMP/vals"); [ "$n" -ge 512 ]; ok $? "floe info --tensor dumps the router ($n lines)"
  rm -f "$out"
done

# errors: exit code, exactly one line on stderr, nothing left in the output directory
expect_err() { # code, description, args...
  local code=$1 what=$2; shift 2
  rm -rf "$TMP/o"; mkdir -p "$TMP/o"
  "$BIN" convert "$@" >/dev/null 2>"$TMP/err"
  local rc=$?
  [ $rc = "$code" ]; ok $? "$what: exit $rc, expected $code"
  [ "$code" = 2 ] || { [ "$(wc -l <"$TMP/err")" = 1 ]; ok $? "$what: one line on stderr: $(cat "$TMP/err")"; }
  [ -z "$(ls -A "$TMP/o")" ]; ok $? "$what: no file left ($(ls "$TMP/o"))"
}
mkdir -p "$TMP/llama" "$TMP/empty"
echo '{"model_type":"llama","hidden_size":64,"num_hidden_layers":1}' >"$TMP/llama/config.json"
mkdir -p "$TMP/miss"
cp "$FIX/models/qwen3moe/config.json" "$TMP/miss/"
# a directory whose safetensors lacks everything: the model's tensors are missing
python3 - "$TMP/miss/model.safetensors" <<'PY' 2>/dev/null || printf '\x10\x00\x00\x00\x00\x00\x00\x00{"__metadata__":{}}' >"$TMP/miss/model.safetensors"
import struct, sys
h = b'{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
h += b' ' * (-len(h) % 8)
open(sys.argv[1], 'wb').write(struct.pack('<Q', len(h)) + h + b'\0\0\0\0')
PY
expect_err 1 "not a model dir" "$TMP/empty" -o "$TMP/o/x.gguf"
expect_err 1 "missing dir" "$TMP/nonexistent" -o "$TMP/o/x.gguf"
expect_err 1 "unsupported model_type" "$TMP/llama" -o "$TMP/o/x.gguf"
expect_err 1 "missing tensor" "$TMP/miss" -o "$TMP/o/x.gguf"
expect_err 1 "output in a missing directory" "$FIX/models/qwen3moe" -o "$TMP/o/no/such/x.gguf"
expect_err 2 "bad --type" "$FIX/models/qwen3moe" -o "$TMP/o/x.gguf" --type q9_9
expect_err 2 "type without a quantizer" "$FIX/models/qwen3moe" -o "$TMP/o/x.gguf" --expert-type iq2_xxs
expect_err 2 "no -o" "$FIX/models/qwen3moe"
expect_err 2 "no IN_DIR" -o "$TMP/o/x.gguf"
"$BIN" convert --help >/dev/null; ok $? "--help exits 0"
"$BIN" --help | grep -q "convert IN_DIR"; ok $? "floe --help lists convert"

rm -rf "$TMP"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
